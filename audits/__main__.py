"""python -m audits PATH... [--policy FILE] [--json FILE|-] [--markdown FILE] [--baseline FILE]
                           [--link DIR]... [--link-scopes FILE] [--debug]

Exit status: 0 no error finding, 1 error findings, 2 unusable input or policy (the message says
which file and why), 3 an internal error (a bug: one line, or the traceback with --debug).
"""

from __future__ import annotations

import argparse
import json
import sys
import traceback
from pathlib import Path
from typing import Any

from . import core, report
from .errors import AuditError
from .model import RULES
from .policy import DEFAULT_POLICY, load_policy

EXIT_INTERNAL = 3


def _rules_epilog() -> str:
    lines = ["rules (id: what it finds):"] + [f"  {r.id}: {r.summary}" for r in RULES.values()]
    lines += [
        "",
        f"default policy: {DEFAULT_POLICY}",
        "exit: 0 pass, 1 error findings, 2 unusable input or policy, 3 internal error",
    ]
    return "\n".join(lines)


def _write(path: Path, text: str, what: str) -> None:
    if str(path) == "-":
        sys.stdout.write(text)
        return
    try:
        path.write_text(text)
    except OSError as exc:
        raise AuditError(f"{path}: cannot write the {what} ({exc.strerror}); choose a writable path") from None


def _scopes(path: Path | None) -> tuple[tuple[Any, ...], dict[str, str]]:
    """The link scopes a --link-scopes file names, and those it says could not be had ({"name", "not_checked":
    why}); AuditError naming the file and what is wrong in it."""
    if path is None:
        return (), {}
    try:
        raw = json.loads(path.read_text())
        unchecked = {str(s["name"]): str(s["not_checked"]) for s in raw if "not_checked" in s}
        scopes = tuple(
            core.link_scope(str(s["name"]), [Path(f) for f in s["folders"]], frozenset(map(str, s["wheels"])))
            for s in raw
            if "not_checked" not in s
        )
        return scopes, unchecked
    except OSError as exc:
        raise AuditError(f"{path}: cannot read the link scopes ({exc.strerror})") from None
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise AuditError(
            f'{path}: not a list of {{"name", "folders", "wheels"}} link scopes ({type(exc).__name__}: {exc})'
        ) from None


def main(argv: list[str] | None = None) -> int:
    """The audit CLI; returns the exit status (0 pass, 1 errors, 2 bad input, 3 internal error)."""
    p = argparse.ArgumentParser(
        prog=Path(sys.argv[0]).name if Path(sys.argv[0]).name == "kt-audit" else "python -m audits",
        description="Audit built wheels (any wheel, not only ours).",
        epilog=_rules_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("paths", nargs="+", type=Path, help="wheels, or directories of wheels")
    p.add_argument("--policy", type=Path, help=f"policy TOML (default: {DEFAULT_POLICY})")
    p.add_argument(
        "--json", type=Path, help="write the JSON report here (- for stdout; the summary then goes to stderr)"
    )
    p.add_argument("--markdown", type=Path, help="write a Markdown summary here")
    p.add_argument("--baseline", type=Path, help="previous report (or {name: bytes}) for size growth")
    p.add_argument("--summary", type=Path, help="append the Markdown summary here (CI: $GITHUB_STEP_SUMMARY)")
    p.add_argument(
        "--link",
        action="append",
        type=Path,
        default=[],
        metavar="DIR",
        help="resolve every undefined symbol against the libraries under DIR too (an installed environment's "
        "site-packages: torch/lib, nvidia/*/lib); repeatable",
    )
    p.add_argument(
        "--link-scopes",
        type=Path,
        metavar="FILE",
        help='JSON: [{"name": "serve-cp311", "folders": [DIR, ...], "wheels": [FILENAME, ...]}, ...]: each set of '
        "wheels resolved against its own folders (an install profile's closure; nox -s audit writes it)",
    )
    p.add_argument("--debug", action="store_true", help="print the traceback of an internal error")
    args = p.parse_args(argv)
    terminal = sys.stderr if args.json is not None and str(args.json) == "-" else sys.stdout
    try:
        scopes, unchecked = _scopes(args.link_scopes)
        result = core.run(args.paths, load_policy(args.policy), args.baseline, args.link, scopes, unchecked)
        if args.json:
            _write(args.json, report.to_json(result), "JSON report")
        if args.markdown:
            _write(args.markdown, report.to_markdown(result), "Markdown report")
        if args.summary:
            try:
                with args.summary.open("a") as fh:
                    fh.write(report.to_markdown(result))
            except OSError as exc:
                raise AuditError(f"{args.summary}: cannot append the summary ({exc.strerror})") from None
    except AuditError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except Exception as exc:  # a bug, not the user's input: one line, the traceback on request
        if args.debug:
            traceback.print_exc()
        print(
            f"internal error: {type(exc).__name__}: {exc} (rerun with --debug for the traceback, and report it)",
            file=sys.stderr,
        )
        return EXIT_INTERNAL
    terminal.write(report.to_terminal(result))
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
