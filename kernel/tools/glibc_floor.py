"""The glibc floor kt-kernel links against: glibc 2.28's ABI (manylinux_2_28) from any build host.

GCC compiles every object as before (same flags, same code: ccache hits); only the link changes. The C
library the linker binds against is not the build host's (glibc 2.36 here: `pthread_once@GLIBC_2.34`,
`dlopen@GLIBC_2.34`) but stubs of glibc 2.28 that zig generates from its per-version symbol lists (the way
cargo-zigbuild and `maturin --zig` target a glibc version; zig from PyPI, hash-locked in
lockfiles/toolchain.txt): libc.so.6, libm.so.6, libpthread.so.0, libdl.so.2, librt.so.1, ... holding exactly
the symbols and versions glibc 2.28 exports, and 2.28's libc_nonshared.a. Linker scripts (libc.so, libm.so,
...) point `-lc` and friends at them; CMake puts the folder before the compiler's own library folders
(`KT_GLIBC_FLOOR`, kernel/CMakeLists.txt). A symbol the code needs that glibc 2.28 lacks has no version to bind
to: the link of a library without Python symbols fails on it (`-z defs`), and the audit names any
version newer than manylinux_2_28 allows.

    python kernel/tools/glibc_floor.py [--out build/glibc-floor]   # prints the folder

The folder is made once per zig version (floor.json records it and every file's sha256, checked on reuse).
Stdlib only: build_wheel.py runs it before anything else is installed but the toolchain lock.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

GLIBC = "2.28"
TARGET = f"x86_64-linux-gnu.{GLIBC}"
ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "build" / "glibc-floor"
# stub file -> the name a DT_NEEDED gives it (zig calls the loader's stub libld.so.2)
SONAMES = {"libld.so.2": "ld-linux-x86-64.so.2"}
# -lNAME -> the stub it links (a linker script, as glibc's own libc.so is)
SCRIPTS = {
    "libc.so": "GROUP ( {d}/libc.so.6 {d}/libc_nonshared.a AS_NEEDED ( {d}/ld-linux-x86-64.so.2 ) )",
    "libm.so": "GROUP ( {d}/libm.so.6 )",
    "libpthread.so": "GROUP ( {d}/libpthread.so.0 )",
    "libdl.so": "GROUP ( {d}/libdl.so.2 )",
    "librt.so": "GROUP ( {d}/librt.so.1 )",
    "libutil.so": "GROUP ( {d}/libutil.so.1 )",
    "libresolv.so": "GROUP ( {d}/libresolv.so.2 )",
}


class FloorError(RuntimeError):
    """The floor cannot be made; the message names the step and the fix."""


def _sha256(path: Path) -> str:
    with path.open("rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def _zig_version() -> str:
    got = subprocess.run([sys.executable, "-m", "ziglang", "version"], capture_output=True, text=True, check=False)
    if got.returncode != 0:
        raise FloorError(
            f"zig is not installed for {sys.executable} ({got.stderr.strip()[-300:]}); install the toolchain lock: "
            "pip install --require-hashes -r lockfiles/toolchain.txt (it pins ziglang)"
        )
    return got.stdout.strip()


def _fresh(dest: Path, zig: str) -> bool:
    """Whether `dest` holds the floor this zig makes, every file as recorded."""
    record = dest / "floor.json"
    try:
        data = json.loads(record.read_text())
    except (OSError, ValueError):
        return False
    if data.get("zig") != zig or data.get("glibc") != GLIBC:
        return False
    return all((dest / n).is_file() and _sha256(dest / n) == h for n, h in data.get("files", {}).items())


def _nonshared(archive: Path, dest: Path, work: Path) -> None:
    """2.28's libc_nonshared.a as the wheels may link it: its objects (atexit, the stat wrappers...) without
    their debug information, which names the folders zig ran in, and archived deterministically (sorted,
    no timestamps): the same bytes wherever and whenever the floor is made, so the wheel is too."""
    tools = {t: shutil.which(t) for t in ("ar", "objcopy")}
    if None in tools.values():
        raise FloorError("binutils' ar and objcopy are needed to make the glibc floor: apt-get install binutils")
    ar, objcopy = str(tools["ar"]), str(tools["objcopy"])
    work.mkdir()
    listed = subprocess.run([ar, "t", str(archive)], capture_output=True, text=True, check=True).stdout.split()
    names = []
    for i, member in enumerate(listed):  # zig names each member by its object's path in zig's cache, still there
        made = Path(member) if Path(member).is_absolute() else Path.cwd() / member
        if not made.is_file():
            raise FloorError(f"{archive}: its member {member} is not in zig's cache any more; make the floor again")
        name = f"{i:03d}-{made.name}"
        shutil.copyfile(made, work / name)
        subprocess.run([objcopy, "--strip-debug", str(work / name)], check=True)
        names.append(name)
    subprocess.run([ar, "rcsD", str(dest), *sorted(names)], cwd=work, check=True)


def floor(out: Path = OUT) -> Path:
    """The floor's folder under `out` (made, or reused when floor.json still matches)."""
    zig = _zig_version()
    dest = out / TARGET
    if _fresh(dest, zig):
        return dest
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out, prefix=".making-") as tmp_name:
        tmp = Path(tmp_name)
        (tmp / "empty.c").write_text("int kt_glibc_floor(void) { return 0; }\n")
        env = {**os.environ, "ZIG_GLOBAL_CACHE_DIR": str(tmp / "zig"), "ZIG_LOCAL_CACHE_DIR": str(tmp / "zig-local")}
        argv = [sys.executable, "-m", "ziglang", "cc", "-target", TARGET, "-shared", "-v", "-o", str(tmp / "e.so")]
        got = subprocess.run([*argv, str(tmp / "empty.c")], capture_output=True, text=True, check=False, env=env)
        ours = f"-o {tmp / 'e.so'} "  # the link of the empty library, not zig's links of the stubs themselves
        line = next((ln for ln in got.stderr.splitlines() if "ld.lld " in ln and ours in ln), "")
        stubs = [Path(t) for t in line.split() if re.search(r"/lib[a-z_]+\.so\.\d+$|/libc_nonshared\.a$", t)]
        if got.returncode != 0 or not any(s.name == "libc.so.6" for s in stubs):
            raise FloorError(
                f"`{' '.join(argv)}` made no glibc {GLIBC} stubs (exit {got.returncode}): {got.stderr.strip()[-500:]}"
            )
        made = tmp / "floor"
        made.mkdir()
        for stub in stubs:
            if stub.name == "libc_nonshared.a":
                _nonshared(stub, made / stub.name, tmp / "nonshared")
            else:
                shutil.copyfile(stub, made / SONAMES.get(stub.name, stub.name))
        for name, script in SCRIPTS.items():
            target = script.split()[2].replace("{d}/", "")
            if (made / target).is_file():
                (made / name).write_text(
                    f"/* glibc {GLIBC} stub (kernel/tools/glibc_floor.py) */\n" + script.format(d=dest) + "\n"
                )
        files = {p.name: _sha256(p) for p in sorted(made.iterdir())}
        (made / "floor.json").write_text(json.dumps({"glibc": GLIBC, "zig": zig, "files": files}, indent=2) + "\n")
        if dest.exists():
            shutil.rmtree(dest)
        made.rename(dest)
    return dest


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python kernel/tools/glibc_floor.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args(argv)
    try:
        print(floor(args.out))
    except FloorError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
