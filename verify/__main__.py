"""The venv profiles of `nox -s verify_install`: python -m verify --dist dist [--profile NAME] [--json F].

sft-cpu (the CPU torch lock), sft and serve (the published install files; verify/sft.py, verify/serve.py),
lf-standard, lf-kt and lf-upgrade (verify/lf.py; lf-kt and lf-upgrade install the published lf-kt file).
Normal resolution and the other interpreters have their own entry points (verify.resolution,
verify.interpreters)."""

from __future__ import annotations

import argparse
import functools
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from base.cli import dist_option, fresh_option
from base.errors import StageError, report
from base.paths import VERIFY_WORK

from . import cached, lf
from .serve import verify_serve
from .sft import verify_sft, verify_sft_cpu

RUN: dict[str, Callable[[Path, Path], dict[str, Any]]] = {
    "sft-cpu": verify_sft_cpu,
    "sft": verify_sft,  # the published sft install file (CUDA torch, run on the CPU)
    "serve": verify_serve,
    **lf.VERIFY,
}


DIST_FREE = frozenset({"lf-standard"})  # upstream only: no wheel of dist/ is installed, a new build keeps its result


def main(argv: list[str] | None = None) -> int:
    """The verify_install CLI: 0 every profile proven, 1 one failed (the message says what), 2 unusable input."""
    p = argparse.ArgumentParser(prog="nox -s verify_install --")
    dist_option(p)
    p.add_argument("--work", type=Path, default=VERIFY_WORK)
    p.add_argument("--profile", action="append", choices=list(RUN), help="default: all")
    p.add_argument("--json", type=Path, help="write the results here (merged with the other profiles' there)")
    fresh_option(p, "run every profile")
    args = p.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = _previous(args.json)
    try:
        key = cached.dist_key(args.dist)  # dist/ opened and re-hashed once: an incomplete build fails here
        for prof in args.profile or list(RUN):
            results.pop(prof, None)  # a failure below leaves no earlier success of it behind
            work = functools.partial(_timed, prof, args)
            free = prof in DIST_FREE
            result, stamp = cached.run(prof, args.dist, key, work, fresh=args.fresh, dist_free=free)
            results[prof] = {**result, **stamp}
            print(f"{prof}: ok ({stamp['outcome']}, {result['elapsed_s']}s when produced) {json.dumps(result)}")
    except StageError as exc:  # VerifyError, and the carriers', locks' and base's roots below it
        _write(args.json, results)
        return report(exc)
    _write(args.json, results)
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
