"""Against real third-party wheels from PyPI: our platform-tag verdict agrees with
`auditwheel show`, and our cubin listing with `cuobjdump --list-elf`."""

from __future__ import annotations

import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from audits import load_policy
from audits.analyzers.wheel_rules import honest_platform
from audits.readers import read_elf, read_wheel
from audits.readers._cuda import find_cuobjdump, read_cuda

pytestmark = pytest.mark.network
# Small native wheels with different glibc floors (name==version, wheel tag).
WHEELS = [("pyyaml==6.0.3", "manylinux_2_17_x86_64"), ("markupsafe==3.0.3", "manylinux_2_17_x86_64"),
          ("zstandard==0.25.0", "manylinux_2_17_x86_64")]  # fmt: skip


def _download(spec: str, dest: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--isolated", "--no-deps", "--only-binary", ":all:",
           "--index-url", "https://pypi.org/simple", "--python-version", "3.11", "--implementation", "cp",
           "--abi", "cp311", "--platform", "manylinux_2_17_x86_64", "--platform", "manylinux2014_x86_64",
           "--platform", "manylinux_2_28_x86_64", "-d", str(dest), spec]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        pytest.fail(f"pip download {spec} failed: {proc.stderr[-1500:]}")
    (wheel,) = dest.glob("*.whl")
    return wheel


@pytest.mark.parametrize(("spec", "_tag"), WHEELS)
def test_platform_verdict_agrees_with_auditwheel_show(spec: str, _tag: str, tmp_path: Path) -> None:
    wheel = _download(spec, tmp_path)
    w = read_wheel(wheel)
    elfs = [e for m in w.members if (e := read_elf(m.name, m.data)) is not None]
    ours = honest_platform(elfs)
    show = subprocess.run([sys.executable, "-m", "auditwheel", "show", str(wheel)], capture_output=True, text=True,
                          check=False).stdout  # fmt: skip
    theirs = re.search(r'consistent with the following platform tag:\s+"([^"]+)"', " ".join(show.split()))
    assert theirs is not None, show
    assert ours == theirs.group(1)
    assert load_policy()


def test_cubin_listing_agrees_with_cuobjdump(tmp_path: Path, kt_wheel: Path) -> None:
    """The audit's reader against the cuobjdump CLI, on every CUDA library we can reach:
    the CUDA runtime wheel's own libraries and kt-kernel's payload."""
    tool = find_cuobjdump()
    if tool is None:
        pytest.fail("cuobjdump missing: lockfiles/test.txt installs nvidia-cuda-cuobjdump")
    libs = sorted(Path(tool).parent.parent.glob("lib/*.so*"))
    import io
    import tarfile

    with (
        zipfile.ZipFile(kt_wheel) as zf,
        tarfile.open(fileobj=io.BytesIO(zf.read("kt_kernel/cuda_archive/kt_cuda.tar.xz")), mode="r:xz") as tar,
    ):
        for info in tar:
            if info.isfile():
                out = tmp_path / info.name.replace("/", "_")
                out.write_bytes(tar.extractfile(info).read())  # type: ignore[union-attr]
                libs.append(out)
    checked = 0
    for lib in libs:
        cli = subprocess.run([tool, "--list-elf", str(lib)], capture_output=True, text=True, check=False).stdout
        expected = set(re.findall(r"\.(sm_\w+)\.cubin", cli))
        assert read_cuda(tool, lib.read_bytes()).sass == expected, lib.name
        checked += bool(expected)
    assert checked >= 2
