"""Write kt_kernel/_build.json, the wheel's build manifest (schema: audits/schemas/build-manifest.schema.json).

Run by CMake at build time; deterministic (sorted keys, no timestamps) so that
the same sources give the same wheel bytes.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="gen_build_manifest")
    p.add_argument("--ladder", type=Path, required=True)
    p.add_argument("--version-file", type=Path, required=True)
    p.add_argument("--variants", required=True, help="';'-separated names of the variants built")
    p.add_argument("--cuda-json", type=Path, help="the 'cuda' section, written by the CUDA build")
    p.add_argument("--output", type=Path, required=True)
    args = p.parse_args(argv)

    match = re.search(r'^__version__\s*=\s*"([^"]+)"', args.version_file.read_text(), re.MULTILINE)
    if not match:
        sys.exit(f'{args.version_file}: no line __version__ = "..."; the KT version lives there')
    ladder = {v["name"]: v for v in json.loads(args.ladder.read_text())["variants"]}
    built = [n for n in args.variants.split(";") if n]
    unknown = sorted(set(built) - set(ladder))
    if unknown:
        sys.exit(f"{args.ladder}: variants {unknown} were built but are not in the ladder")
    manifest = {
        "schema_version": 1,
        "version": match.group(1),
        "variants": {
            name: {"file": f"kt_kernel/cpu/libkt_cpu_{name}.so", "features": ladder[name]["features"]}
            for name in ladder
            if name in built
        },
        "cuda": json.loads(args.cuda_json.read_text()) if args.cuda_json else None,
    }
    args.output.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
