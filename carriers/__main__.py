"""python -m carriers assemble --kernel PATH --dist dist   |   python -m carriers check"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from . import assemble, model
from .errors import CarrierError


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m carriers")
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("assemble", help="build every carrier into --dist (atomically)")
    a.add_argument("--kernel", type=Path, required=True, help="the repaired kt_kernel wheel, or its directory")
    a.add_argument("--dist", type=Path, default=Path("dist"))
    sub.add_parser("check", help="validate carriers.toml")
    args = p.parse_args(argv)
    try:
        cs = model.load()
        if args.cmd == "check":
            print(f"{len(cs.carriers)} carriers, KT version {cs.kt_version}: ok")
            return 0
        manifest = assemble.assemble(cs, assemble.kernel_from(args.kernel), args.dist)
    except CarrierError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    width = max(len(w["filename"]) for w in manifest["wheels"])
    for w in manifest["wheels"]:
        print(f"{w['filename']:<{width}}  {w['size'] / 2**20:8.2f} MiB  {w['sha256'][:16]}  {w['kind']}")
    print(f"torch: {manifest['torch']} (e.g. {', '.join(manifest['torch_candidates'])})")
    print(f"assembled {len(manifest['wheels'])} wheels into {args.dist} in {manifest['elapsed_s']:.1f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
