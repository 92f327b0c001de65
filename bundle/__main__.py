"""python -m bundle --dist dist --profile sft --python 3.11 --out DIR"""

from __future__ import annotations

import argparse
from pathlib import Path

from base.cli import dist_option
from base.errors import StageError, report

from .build import build


def main(argv: list[str] | None = None) -> int:
    """The bundle CLI; exit 0 written, 1 a bundle could not be made (the message says why), 2 usage."""
    p = argparse.ArgumentParser(prog="nox -s bundle --", description="an offline bundle of one install profile")
    dist_option(p, "the release (its install/ files and wheels)")
    p.add_argument("--profile", required=True, help="an install profile of dist/install/ (serve, sft, lf-kt)")
    p.add_argument("--python", required=True, metavar="3.N", help="a CPython of the release's matrix")
    p.add_argument("--out", type=Path, required=True, help="the bundle directory (created; must not exist)")
    p.add_argument("--index-url", default="https://pypi.org/simple", help="where third-party wheels come from")
    args = p.parse_args(argv)
    try:
        result = build(args.dist, args.profile, args.python, args.out, index_url=args.index_url)
    except StageError as exc:  # BundleError, and the carriers' root (a download that fails its hash)
        return report(exc)
    print(f"bundle {args.out}: {result.files} files, {result.bytes / 2**20:.1f} MiB, every hash checked")
    print(f"install offline: {result.command}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
