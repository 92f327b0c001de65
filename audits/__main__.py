"""python -m audits PATH... [--policy FILE] [--json FILE] [--markdown FILE] [--baseline FILE]"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from . import core, report
from .errors import AuditError
from .policy import load_policy


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m audits", description="Audit built wheels (any wheel, not only ours).")
    p.add_argument("paths", nargs="+", type=Path, help="wheels, or directories of wheels")
    p.add_argument("--policy", type=Path, help="policy TOML (default: audits/policy/default.toml)")
    p.add_argument("--json", type=Path, help="write the JSON report here")
    p.add_argument("--markdown", type=Path, help="write a Markdown summary here")
    p.add_argument("--baseline", type=Path, help="previous report (or {name: bytes}) for size growth")
    p.add_argument("--summary", type=Path, help="append the Markdown summary here (CI: $GITHUB_STEP_SUMMARY)")
    args = p.parse_args(argv)
    try:
        result = core.run(args.paths, load_policy(args.policy), args.baseline)
    except AuditError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    if args.json:
        args.json.write_text(report.to_json(result))
    if args.markdown:
        args.markdown.write_text(report.to_markdown(result))
    if args.summary:
        with args.summary.open("a") as fh:
            fh.write(report.to_markdown(result))
    sys.stdout.write(report.to_terminal(result))
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
