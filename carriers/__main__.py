"""python -m carriers assemble [--kernel PATH] [--dist dist] [--partial 3.N] [--fresh]   |   python -m carriers check"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from base import distdir, stages, swap
from base.cli import dist_option, fresh_option
from base.errors import StageError, report
from base.paths import KERNEL_OUT

from . import assemble, consistency, model
from .errors import InputError


def main(argv: list[str] | None = None) -> int:
    """The carriers CLI (assemble, check); returns the exit status."""
    p = argparse.ArgumentParser(prog="python -m carriers")
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("assemble", help="build every carrier into --dist (atomically)")
    a.add_argument(
        "--kernel",
        type=Path,
        default=KERNEL_OUT,
        help=f"the repaired kt_kernel wheel, or its directory (default: {KERNEL_OUT})",
    )
    dist_option(a, "where the release is assembled")
    a.add_argument(
        "--partial",
        action="append",
        default=[],
        metavar="3.N",
        help="a partial development release for only these Pythons of the matrix (labelled so in manifest.json)",
    )
    fresh_option(a, "assemble")
    c = sub.add_parser("check", help="validate carriers.toml; with --dist, the built set's metadata too")
    c.add_argument("--dist", type=Path, help="a built release: pins, bounds, torch and the payload closure")
    args = p.parse_args(argv)
    try:
        cs = model.load()
        if args.cmd == "check":
            print(f"{len(cs.carriers)} carriers, KT version {cs.kt_version}: ok")
            return 0 if args.dist is None else _check_dist(cs, args.dist)
        pythons = _partial(cs, args.partial)
        kernels = assemble.kernel_from(args.kernel)
        swap.sweep()  # what killed runs left (a live run's names carry a live pid), a parked dist/ put back
        stage = stages.assemble(args.kernel, args.dist, pythons, fresh=args.fresh)
        reused = stage.reuse() is not None  # dist/ holds exactly what these inputs assemble into
        elapsed = 0.0
        if reused:
            manifest = distdir.read_manifest(args.dist / distdir.MANIFEST)
            assemble.check_reused(cs, manifest, pythons)  # what a run checks, on a hit too
        else:
            t0 = time.perf_counter()
            manifest = assemble.assemble(cs, kernels, args.dist, pythons=pythons, memo=not stage.fresh)
            elapsed = time.perf_counter() - t0
            stage.outputs = distdir.outputs(args.dist)
            stage.done()
    except StageError as exc:  # carriers.CarrierError, and the locks' and base's roots below it
        return report(exc)
    width = max(len(w.filename) for w in manifest.wheels)
    for w in manifest.wheels:
        print(f"{w.filename:<{width}}  {w.size / 2**20:8.2f} MiB  {w.sha256[:16]}  {w.kind}")
    print(
        f"torch: {consistency.torch_summary(manifest.torch)} (every carrier's requirement; released: "
        f"{', '.join(manifest.torch_candidates)})"
    )
    if reused:
        print(f"reused the {len(manifest.wheels)} wheels in {args.dist}: assembled before from these inputs")
    else:
        print(f"assembled {len(manifest.wheels)} wheels into {args.dist} in {elapsed:.1f}s")
    per = {v: sum(v in w.pythons for w in manifest.wheels) for v in manifest.pythons}
    print("Pythons: " + ", ".join(f"{v} ({n} wheels)" for v, n in per.items()))
    if manifest.partial:
        print(f"PARTIAL development release: no wheels for {', '.join(manifest.partial.missing)}; not a release")
    return 0


def _partial(cs: model.CarrierSet, asked: list[str]) -> tuple[str, ...] | None:
    """The Pythons of a partial development release (None: the whole matrix)."""
    if not asked:
        return None
    unknown = [v for v in asked if v not in cs.pythons]
    if unknown:
        raise InputError(
            f"--partial {' '.join(unknown)}: not in the release's Python matrix {list(cs.pythons)} "
            "(pythons in carriers/carriers.toml)"
        )
    return tuple(v for v in cs.pythons if v in asked)


def _check_dist(cs: model.CarrierSet, dist: Path) -> int:
    """The consistency check over the wheels in `dist`, from their own metadata."""
    from packaging.utils import canonicalize_name, parse_wheel_filename

    from .assemble import read_metadata

    wheels = sorted(dist.glob("*.whl"))
    if not wheels:
        raise InputError(f"{dist}: no wheels; build the release first (nox -s build_all)")
    meta: dict[str, tuple[str, list[str]]] = {
        canonicalize_name(parse_wheel_filename(w.name)[0]): read_metadata(w) for w in wheels
    }
    report = consistency.check(cs, meta)
    for problem in report.problems:
        print(f"error: {problem}", file=sys.stderr)
    print(
        f"{dist}: torch {consistency.torch_summary(report.torch)}; installs that can import the CUDA payload: "
        f"{', '.join(report.payload_roots) or 'none'}"
    )
    print("every one of them pulls all part carriers" if not report.problems else f"{len(report.problems)} problems")
    return 1 if report.problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
