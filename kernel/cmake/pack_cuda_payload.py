"""Pack the CUDA libraries into the lazy payload and describe it.

Writes a deterministic tar.xz (sorted members, fixed mtime/owner/mode) that keeps
the libraries' relative layout (lib/, sm90a/), and the `cuda` section of
kt_kernel/_build.json: payload path, compression, sha256, and per file its sha256
and the SASS/PTX architectures cuobjdump lists. Also records what zstd and zip
deflate would have made of the same files, for the size comparison.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import lzma
import os
import re
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path


def archs(cuobjdump: str, lib: Path, kind: str) -> list[str]:
    proc = subprocess.run([cuobjdump, f"--list-{kind}", str(lib)], capture_output=True, text=True, check=False)
    if proc.returncode != 0 and "does not contain" not in proc.stderr:
        sys.exit(f"cuobjdump --list-{kind} {lib} failed: {proc.stderr.strip()}")
    found = re.findall(r"\.(sm_\d+[a-z]?)\.(?:cubin|ptx)", proc.stdout)
    if kind == "ptx":
        found = [a.replace("sm_", "compute_") for a in found]
    return sorted(set(found))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="pack_cuda_payload")
    p.add_argument("--cuobjdump", required=True)
    p.add_argument("--payload", type=Path, required=True)
    p.add_argument("--payload-member", required=True)
    p.add_argument("--json", type=Path, required=True)
    p.add_argument("--libs", required=True)
    p.add_argument("--members", required=True)
    args = p.parse_args(argv)
    libs = [Path(x) for x in args.libs.split(";") if x]
    members = [m for m in args.members.split(";") if m]
    if len(libs) != len(members):
        sys.exit("pack_cuda_payload: --libs and --members differ in length")
    mtime = int(os.environ.get("SOURCE_DATE_EPOCH", "0"))
    files = {}
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for member, lib in sorted(zip(members, libs, strict=True)):
            data = lib.read_bytes()
            info = tarfile.TarInfo(member)
            info.size, info.mtime, info.mode = len(data), mtime, 0o755
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            tar.addfile(info, io.BytesIO(data))
            files[member] = {
                "sha256": hashlib.sha256(data).hexdigest(),
                "size": len(data),
                "sass": archs(args.cuobjdump, lib, "elf"),
                "ptx": archs(args.cuobjdump, lib, "ptx"),
            }
    payload = lzma.compress(raw.getvalue(), preset=9 | lzma.PRESET_EXTREME)
    args.payload.write_bytes(payload)
    sizes = {"tar": len(raw.getvalue()), "xz": len(payload)}
    zbuf = io.BytesIO()
    with zipfile.ZipFile(zbuf, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as zf:
        for member, lib in zip(members, libs, strict=True):
            zf.writestr(member, lib.read_bytes())
    sizes["zip_deflate"] = len(zbuf.getvalue())
    try:
        import zstandard

        sizes["zstd_19"] = len(zstandard.ZstdCompressor(level=19).compress(raw.getvalue()))
    except ImportError:
        pass
    section = {
        "payload": args.payload_member,
        "compression": "xz",
        "sha256": hashlib.sha256(payload).hexdigest(),
        "layout": 2,
        "files": files,
        "sizes": sizes,
    }
    args.json.write_text(json.dumps(section, indent=2, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
