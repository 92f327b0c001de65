"""Same inputs, same bytes: kt-kernel (CPU variants and CUDA archive) built again
from a copy of the sources at another path gives the identical wheel."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from tests.conftest import ROOT


def test_kernel_wheel_rebuilds_bit_for_bit(tmp_path: Path, kt_wheel: Path) -> None:
    sys.path.insert(0, str(ROOT / "kernel" / "tools"))
    try:
        import build_wheel
    finally:
        sys.path.pop(0)
    epoch = build_wheel.source_date_epoch()  # what the tests session's build used
    src = tmp_path / "elsewhere" / "kernel"
    shutil.copytree(ROOT / "kernel", src, ignore=shutil.ignore_patterns("build", "__pycache__"))
    env = dict(os.environ, SOURCE_DATE_EPOCH=epoch, CCACHE_DISABLE="1")
    with zipfile.ZipFile(kt_wheel) as zf:
        cuda = ["--cuda"] if any(n.startswith("kt_kernel/cuda_archive/") for n in zf.namelist()) else []
    subprocess.run([sys.executable, str(src / "tools" / "build_wheel.py"), "--dist", str(tmp_path / "out"),
                    "--work", str(tmp_path / "work"), *cuda], env=env, check=True, capture_output=True)  # fmt: skip
    (again,) = (tmp_path / "out").glob("kt_kernel-*.whl")
    assert again.name == kt_wheel.name
    assert hashlib.sha256(again.read_bytes()).hexdigest() == hashlib.sha256(kt_wheel.read_bytes()).hexdigest()
