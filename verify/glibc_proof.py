"""Proof on an older glibc than the build host's: every ELF file of the release whose wheel's tag promises that
glibc is loaded by that glibc's own dynamic loader, and each CPU variant this host can run executes a MoE there.

    python -m verify.glibc_proof [--dist dist] [--json build/glibc-proof.json]

The oldest glibc this machine can reach is Debian bullseye's (2.31; the mirror no longer serves buster's 2.28):
a minimal root made by debootstrap from the Debian mirror (verify/debian.py: the running user's folder, made
once). The release's ELF files are copied into it: every wheel whose manylinux tag is 2.31 or older (a wheel
tagged newer makes no promise there and is listed as such, upstream sglang's Rust extensions among them), and
the CUDA payload's files, read from the part carriers in dist/. In the root, `ldd -r` (bullseye's loader,
every relocation performed, no code of theirs run) must find every symbol version each file asks of the
system libraries; a library outside the release (torch, the CUDA runtime) is not there and is not this
proof's question (the link rules answer it). Then verify/probes/variant_selftest.c, built against glibc
2.28's stubs (kernel/tools/glibc_floor.py), runs each CPU variant the host's /proc/cpuinfo allows in the root:
an INT8 MoE against a double reference, as kt-doctor --run checks it through Python.
"""

from __future__ import annotations

import argparse
import io
import json
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any

from audits.platforms import wheel_glibc
from base import paths

from .debian import Unavailable, debootstrap
from .venv import VerifyError, load_by_path

SUITE, GLIBC = "bullseye", (2, 31)
HARNESS = Path(__file__).resolve().parent / "probes" / "variant_selftest.c"
# The CPU ladder's features (iced-x86 names) as /proc/cpuinfo spells them: which variants this host may run,
# decided independently of kt_kernel's own detection.
CPUINFO_FLAG = {
    "AVX2": "avx2",
    "FMA": "fma",
    "F16C": "f16c",
    "AVX512F": "avx512f",
    "AVX512BW": "avx512bw",
    "AVX512DQ": "avx512dq",
    "AVX512VL": "avx512vl",
    "AVX512_VNNI": "avx512_vnni",
    "AVX512_VBMI": "avx512vbmi",
    "AVX512_BF16": "avx512_bf16",
    "AMX_TILE": "amx_tile",
    "AMX_INT8": "amx_int8",
    "AMX_BF16": "amx_bf16",
}
MISSING_VERSION = re.compile(r"version `([^']+)' not found \(required by ([^)]+)\)")


def host_flags() -> set[str]:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def runnable(flags: set[str]) -> dict[str, list[str]]:
    """variant -> the /proc/cpuinfo flags it needs that this host lacks ([]: it runs here)."""
    ladder = json.loads((paths.KERNEL / "python" / "kt_kernel" / "cpu_variants.json").read_text())["variants"]
    return {v["name"]: [CPUINFO_FLAG[f] for f in v["features"] if CPUINFO_FLAG[f] not in flags] for v in ladder}


def _is_elf(data: bytes) -> bool:
    return data[:4] == b"\x7fELF"


def copy_release(dist: Path, into: Path, every: bool = False) -> tuple[list[str], list[str]]:
    """The ELF files of every wheel whose tag promises this glibc (`every`: of every wheel), and the payload's,
    copied under `into` (relative paths), and the wheels whose tag promises a newer glibc only."""
    import zstandard

    copied: list[str] = []
    newer: list[str] = []
    parts: list[tuple[int, Path, str]] = []
    for wheel in sorted(dist.glob("*.whl")):
        floor = wheel_glibc(wheel.name)
        with zipfile.ZipFile(wheel) as zf:
            for name in zf.namelist():
                m = re.search(r"/_kt_payload/cuda\.tar\.zst\.(\d+)-of-\d+$", name)
                if m:
                    parts.append((int(m.group(1)), wheel, name))
            if floor is None:
                continue
            if floor > GLIBC and not every:
                newer.append(f"{wheel.name} (tag glibc {floor[0]}.{floor[1]})")
                continue
            for name in zf.namelist():
                if ".so" in name.rsplit("/", 1)[-1] and _is_elf(data := zf.read(name)):
                    dest = into / wheel.name[: -len(".whl")] / name
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    dest.write_bytes(data)
                    copied.append(str(dest.relative_to(into)))
    seen: set[int] = set()
    chunks = []
    for index, wheel, name in sorted(parts):
        if index not in seen:  # a per-Python carrier holds the same part in each of its wheels
            seen.add(index)
            with zipfile.ZipFile(wheel) as zf:
                chunks.append(zf.read(name))
    if chunks:
        reader = zstandard.ZstdDecompressor(max_window_size=1 << 31).stream_reader(io.BytesIO(b"".join(chunks)))
        with tarfile.open(fileobj=reader, mode="r|") as tar:
            for member in tar:
                f = tar.extractfile(member) if member.isfile() else None
                data = f.read() if f is not None else b""
                if _is_elf(data):
                    dest = into / "payload" / member.name
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    dest.write_bytes(data)
                    copied.append(str(dest.relative_to(into)))
    return copied, newer


def prove(dist: Path, where: Path | None = None, every: bool = False) -> dict[str, Any]:
    """The proof's result: {"suite", "glibc", "elfs", "failures", "not_promised", "variants", "seconds"}."""
    t0 = time.perf_counter()
    root = (where or paths.DEBIAN_ROOTS) / f"{SUITE}-minbase"
    if not (root / "usr" / "bin" / "ldd").is_file():  # made once, then reused
        debootstrap(SUITE, root, ["libstdc++6"], "glibc 2.31")
    # this run's own folder in the root (a proof running beside it has its own), removed when it ends
    tree = Path(tempfile.mkdtemp(dir=root, prefix="kt-proof-"))
    try:
        return _prove_in(root, tree, dist, every, t0)
    finally:
        shutil.rmtree(tree, ignore_errors=True)


def _prove_in(root: Path, tree: Path, dist: Path, every: bool, t0: float) -> dict[str, Any]:
    inside = f"/{tree.name}"  # the tree as the root sees it
    copied, newer = copy_release(dist, tree, every)
    dirs = sorted({str(Path(inside) / Path(c).parent) for c in copied})
    chroot = shutil.which("chroot") or "/usr/sbin/chroot"
    env = {"PATH": "/usr/bin:/bin", "LD_LIBRARY_PATH": ":".join(dirs)}
    failures = []
    for rel in copied:
        got = subprocess.run(
            [chroot, str(root), "/usr/bin/ldd", "-r", f"{inside}/{rel}"],
            capture_output=True,
            text=True,
            env=env,
            check=False,
        )
        for version, by in sorted(set(MISSING_VERSION.findall(got.stdout + got.stderr))):
            failures.append(f"{by.removeprefix(inside + '/')} needs {version}, which Debian {SUITE} (glibc 2.31) lacks")
    harness = tree / "variant_selftest"
    gl = load_by_path("kt_glibc_floor", paths.KERNEL / "tools" / "glibc_floor.py").floor()  # the build's own
    cc = shutil.which("gcc") or "gcc"
    argv = [cc, "-O2", "-o", str(harness), str(HARNESS), f"-I{paths.KERNEL / 'src' / 'common'}"]
    argv += [f"-L{gl}", f"-Wl,-rpath-link,{gl}", "-ldl", "-lm"]
    built = subprocess.run(argv, capture_output=True, text=True, check=False)
    if built.returncode != 0:
        raise VerifyError(f"building the variant self-test failed (`{' '.join(argv)}`):\n{built.stderr[-1500:]}")
    variants: dict[str, Any] = {}
    for name, lacking in runnable(host_flags()).items():
        lib = next((c for c in copied if c.endswith(f"/cpu/libkt_cpu_{name}.so")), None)
        if lacking or lib is None:
            why = f"this host lacks {', '.join(lacking)}" if lacking else "not in the release"
            variants[name] = {"skipped": why}
            continue
        got = subprocess.run(
            [chroot, str(root), f"{inside}/variant_selftest", f"{inside}/{lib}"],
            capture_output=True,
            text=True,
            env=env,
            check=False,
        )
        result: dict[str, Any] = {"exit": got.returncode}
        try:
            result.update(json.loads(got.stdout.strip().splitlines()[-1]))
        except (ValueError, IndexError):
            result["output"] = (got.stdout + got.stderr)[-500:]
        variants[name] = result
        if got.returncode != 0:
            failures.append(f"{lib}: the self-test failed in {SUITE}: {result}")
    return {
        "suite": SUITE,
        "glibc": "2.31",
        "elfs": len(copied),
        "failures": failures,
        "not_promised": newer,
        "variants": variants,
        "seconds": round(time.perf_counter() - t0, 1),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m verify.glibc_proof", description=__doc__.split("\n\n")[0])
    p.add_argument("--dist", type=Path, default=paths.DIST)
    p.add_argument("--json", type=Path, default=paths.BUILD / "glibc-proof.json")
    p.add_argument("--every-wheel", action="store_true", help="also the wheels whose tag promises a newer glibc")
    args = p.parse_args(argv)
    try:
        got = prove(args.dist, every=args.every_wheel)
    except Unavailable as exc:
        print(f"glibc proof: NOT VERIFIED: {exc}")
        return 2
    except VerifyError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(got, indent=2) + "\n")
    ran = [f"{n} {v['max_rel_error']:.3g}" for n, v in got["variants"].items() if "max_rel_error" in v]
    print(
        f"glibc proof in Debian {got['suite']} (glibc {got['glibc']}): {got['elfs']} ELF files loaded, "
        f"{len(got['failures'])} failures; variants run: {', '.join(ran) or 'none'} ({got['seconds']} s)"
    )
    for line in got["failures"]:
        print(f"  FAILED: {line}")
    for line in got["not_promised"]:
        print(f"  not promised for glibc {got['glibc']}: {line}")
    return 1 if got["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
