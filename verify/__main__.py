"""The venv profiles of `nox -s verify_install`: python -m verify --dist dist [--profile NAME] [--json F].

sft-cpu and serve (verify/sft.py, verify/serve.py), lf-standard, lf-kt and lf-upgrade (verify/lf.py).
Normal resolution and the other interpreters have their own entry points (verify.resolution,
verify.interpreters)."""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from base.errors import StageError, report
from base.paths import DIST, VERIFY_WORK

from . import lf
from .serve import verify_serve
from .sft import verify_sft_cpu
from .venv import sums

RUN: dict[str, Callable[[Path, Path], dict[str, Any]]] = {
    "sft-cpu": verify_sft_cpu,
    "serve": verify_serve,
    **lf.VERIFY,
}


def main(argv: list[str] | None = None) -> int:
    """The verify_install CLI: 0 every profile proven, 1 one failed (the message says what), 2 unusable input."""
    p = argparse.ArgumentParser(prog="nox -s verify_install --")
    p.add_argument("--dist", type=Path, default=DIST)
    p.add_argument("--work", type=Path, default=VERIFY_WORK)
    p.add_argument("--profile", action="append", choices=list(RUN), help="default: all")
    p.add_argument("--json", type=Path, help="write the results here")
    args = p.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {}
    try:
        sums(args.dist)  # a dist/ that is not a complete build fails here, before any venv
        for prof in args.profile or list(RUN):
            t0 = time.perf_counter()
            results[prof] = RUN[prof](args.dist, args.work)
            results[prof]["elapsed_s"] = round(time.perf_counter() - t0, 1)
            print(f"{prof}: ok ({results[prof]['elapsed_s']}s) {json.dumps(results[prof])}")
    except StageError as exc:  # VerifyError, and the carriers', locks' and base's roots below it
        return report(exc)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
