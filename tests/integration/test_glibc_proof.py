"""The release's glibc promise, proven on an older glibc than the build host's (verify/glibc_proof.py): in a
Debian bullseye root (glibc 2.31), bullseye's own loader finds every symbol version each promised ELF file asks
for, and each CPU variant this host can run computes a MoE there. A library linked against this host's glibc
(2.36: pthread_once@GLIBC_2.34) fails it, named; the same source linked against glibc 2.28's stubs passes."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest

from base import paths
from tests.wheelkit import compile_so, pure_wheel_members, write_wheel
from verify import glibc_proof

ONCE = "#include <pthread.h>\nstatic void g(void) {}\n"
ONCE += "int f(void) { static pthread_once_t o; return pthread_once(&o, g); }\n"


def _floor() -> Path:
    spec = importlib.util.spec_from_file_location("kt_glibc_floor", paths.KERNEL / "tools" / "glibc_floor.py")
    assert spec is not None
    assert spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return Path(mod.floor())


def _dist(tmp_path: Path, so: bytes) -> Path:
    dist = tmp_path / "dist"
    dist.mkdir(parents=True)
    members = pure_wheel_members()
    members["demo_pkg/_once.so"] = so
    tag = "py3-none-manylinux_2_17_x86_64"
    members["demo_pkg-1.0.dist-info/WHEEL"] = f"Wheel-Version: 1.0\nRoot-Is-Purelib: false\nTag: {tag}\n".encode()
    write_wheel(dist / f"demo_pkg-1.0-{tag}.whl", members)
    return dist


@pytest.fixture(scope="module", autouse=True)
def _root_tools() -> None:
    if shutil.which("debootstrap") is None or shutil.which("chroot") is None:
        pytest.fail("debootstrap and chroot are needed (.ci/run installs debootstrap)")


def test_a_library_linked_against_this_hosts_glibc_breaks_the_promise_and_the_floor_keeps_it(tmp_path: Path) -> None:
    host = compile_so(tmp_path, "host.so", ONCE, "-pthread")
    got = glibc_proof.prove(_dist(tmp_path / "host", host))
    assert [f for f in got["failures"] if "demo_pkg/_once.so" in f] == [
        "demo_pkg-1.0-py3-none-manylinux_2_17_x86_64/demo_pkg/_once.so needs GLIBC_2.34, which Debian bullseye "
        "(glibc 2.31) lacks"
    ]
    floor = _floor()
    link = [f"-L{floor}", f"-Wl,-rpath-link,{floor}", "-pthread", "-Wl,-z,defs"]
    kept = compile_so(tmp_path, "floor.so", ONCE, *link)
    got = glibc_proof.prove(_dist(tmp_path / "floor", kept))
    assert [f for f in got["failures"] if "demo_pkg" in f] == []


def test_the_kernel_wheel_loads_and_its_variants_run_on_bullseye(kt_wheel: Path, tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    dist.mkdir()
    shutil.copy(kt_wheel, dist)
    got = glibc_proof.prove(dist)
    assert got["failures"] == []
    assert got["elfs"] >= 7  # _core and the six CPU variants
    runnable = [n for n, lacking in glibc_proof.runnable(glibc_proof.host_flags()).items() if not lacking]
    assert runnable, "this host runs no CPU variant at all"
    for name in runnable:
        assert got["variants"][name]["max_rel_error"] < 0.03, got["variants"][name]
    skipped = {n: v["skipped"] for n, v in got["variants"].items() if "skipped" in v}
    assert all("this host lacks" in why for why in skipped.values()), skipped  # said why, never silently
