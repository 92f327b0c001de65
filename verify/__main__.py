"""`nox -s verify_install`: python -m verify [--dist dist] [--profile NAME]... [--python 3.N] [--index URL].

Every profile of the registry (verify/registry.py), in its order. The venv profiles run here: sft-cpu
(the CPU torch lock), sft and serve (the published install files; verify/sft.py, verify/serve.py),
lf-standard, lf-kt and lf-upgrade (verify/lf.py). The other interpreters (cp313) run through
verify.interpreters, normal resolution (resolve) through verify.resolution; each writes its own results
file (base.paths), which the release report reads."""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from base.cli import dist_option, fresh_option
from base.errors import StageError, report
from base.paths import (
    VERIFY_INTERPRETERS_JSON,
    VERIFY_JSON,
    VERIFY_PUBLISHED_JSON,
    VERIFY_RESOLUTION_JSON,
    VERIFY_WORK,
)

from . import cached, interpreters, lf, registry, resolution
from .serve import verify_serve
from .sft import verify_sft, verify_sft_cpu

RUN: dict[str, Callable[[Path, Path], dict[str, Any]]] = {
    "sft-cpu": verify_sft_cpu,
    "sft": verify_sft,  # the published sft install file (CUDA torch, run on the CPU)
    "serve": verify_serve,
    **lf.VERIFY,
}


def main(argv: list[str] | None = None) -> int:
    """The verify_install CLI: every profile asked for (default: all), each part run even when one before
    failed; 0 all proven, 1 one failed (the message says what), 2 one could not be checked here."""
    p = argparse.ArgumentParser(
        prog="nox -s verify_install --",
        epilog="profiles: " + "; ".join(f"{x.name}: {x.what}" for x in registry.PROFILES),
    )
    dist_option(p)
    p.add_argument("--work", type=Path, default=VERIFY_WORK)
    p.add_argument("--profile", action="append", default=[], choices=list(registry.BY_NAME), help="default: all")
    p.add_argument("--python", action="append", default=[], metavar="3.N", help="resolve: only these Pythons")
    p.add_argument(
        "--index",
        metavar="URL",
        help="resolve from the index the release was published to (and install its sft profile from there)",
    )
    p.add_argument("--json", type=Path, default=VERIFY_JSON, help="the venv profiles' results (merged there)")
    fresh_option(p, "run every profile")
    args = p.parse_args(argv)
    chosen = args.profile or (["resolve"] if args.index else [x.name for x in registry.PROFILES])
    runs = {registry.BY_NAME[x].runs for x in chosen}
    if args.index and runs != {"resolution"}:
        p.error("--index verifies the published release: it goes with --profile resolve only")
    if args.python and "resolution" not in runs:
        p.error("--python chooses the Pythons of normal resolution: it goes with --profile resolve")
    fresh = ["--fresh"] if args.fresh else []
    codes = []
    venv = [x for x in chosen if x in registry.VENV]
    if venv:
        codes.append(run_venv(args, venv))
    pythons = [registry.BY_NAME[x].python for x in chosen if registry.BY_NAME[x].runs == "interpreters"]
    if pythons:  # first: normal resolution for those Pythons then runs in their roots, with their own markers
        argv_i = ["--dist", str(args.dist), "--json", str(VERIFY_INTERPRETERS_JSON), *fresh]
        codes.append(interpreters.main(argv_i + [f"--python={v}" for v in pythons]))
    if "resolution" in runs:  # from where it was published: its own report, never the evidence the verdict reads
        out = VERIFY_PUBLISHED_JSON if args.index else VERIFY_RESOLUTION_JSON
        argv_r = ["--dist", str(args.dist), "--json", str(out), *fresh, *(f"--python={v}" for v in args.python)]
        codes.append(resolution.main(argv_r + (["--index", args.index] if args.index else [])))
    return 1 if 1 in codes else max(codes, default=0)


def run_venv(args: argparse.Namespace, chosen: list[str]) -> int:
    """The venv profiles, each reused when proven on exactly these inputs, each run even when one before
    it failed; results merged into --json after each. The exit status: 0, or the first failure's."""
    args.work.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = _previous(args.json)
    try:
        key = cached.dist_key(args.dist)  # dist/ opened and re-hashed once: an incomplete build fails here
    except StageError as exc:
        return report(exc)
    failed: list[tuple[str, int]] = []
    for prof in chosen:
        results.pop(prof, None)  # a failure below leaves no earlier success of it behind
        try:
            work = functools.partial(_timed, prof, args)
            free = prof in registry.UPSTREAM_ONLY
            result, stamp = cached.run(prof, args.dist, key, work, fresh=args.fresh, dist_free=free)
        except StageError as exc:  # VerifyError, and the carriers', locks' and base's roots below it
            print(f"error: {prof}: {exc}", file=sys.stderr, flush=True)
            failed.append((prof, getattr(exc, "exit_code", 1)))
        else:
            results[prof] = {**result, **stamp}
            print(f"{prof}: ok ({stamp['outcome']}, {result['elapsed_s']}s when produced) {json.dumps(result)}")
        _write(args.json, results)
    if failed:
        names = ", ".join(p for p, _ in failed)
        print(f"error: {len(failed)} of {len(chosen)} venv profiles failed: {names}", file=sys.stderr)
        return failed[0][1]
    return 0


def _timed(prof: str, args: argparse.Namespace) -> dict[str, Any]:
    t0 = time.perf_counter()
    result = RUN[prof](args.dist, args.work)
    result["elapsed_s"] = round(time.perf_counter() - t0, 1)
    return result


def _previous(path: Path | None) -> dict[str, Any]:
    """The other profiles' results in --json (each carries the dist/ key it was obtained on)."""
    if path is None or not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def _write(path: Path | None, results: dict[str, Any]) -> None:
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")


if __name__ == "__main__":
    raise SystemExit(main())
