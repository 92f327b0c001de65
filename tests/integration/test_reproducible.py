"""Same inputs, same bytes: kt-kernel (CPU variants and CUDA archive) built again from a copy of
the sources at another path, without .git (what a source archive gives) and without
SOURCE_DATE_EPOCH, gives the identical wheel: the timestamp comes from the source itself."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.conftest import ROOT


def test_kernel_wheel_rebuilds_bit_for_bit(tmp_path: Path, kt_wheel: Path) -> None:
    if os.environ.get("SOURCE_DATE_EPOCH"):
        pytest.fail("SOURCE_DATE_EPOCH is set: this test proves the build needs neither it nor .git")
    # What a source archive (git archive, "download ZIP") holds: every tracked file, no .git.
    tracked = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z"], capture_output=True, check=True).stdout
    for rel in filter(None, tracked.decode().split("\0")):
        target = tmp_path / "elsewhere" / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if (ROOT / rel).is_symlink():
            target.symlink_to((ROOT / rel).readlink())
        elif (ROOT / rel).is_file():
            shutil.copy2(ROOT / rel, target)
    src = tmp_path / "elsewhere" / "kernel"
    assert not (src.parent / ".git").exists()
    env = {k: v for k, v in os.environ.items() if k != "SOURCE_DATE_EPOCH"}
    env["CCACHE_DISABLE"] = "1"
    with zipfile.ZipFile(kt_wheel) as zf:
        cuda = ["--cuda"] if any(n.startswith("kt_kernel/cuda_archive/") for n in zf.namelist()) else []
    subprocess.run(
        [
            sys.executable,
            str(src / "tools" / "build_wheel.py"),
            "--dist",
            str(tmp_path / "out"),
            "--work",
            str(tmp_path / "work"),
            *cuda,
        ],
        env=env,
        check=True,
        capture_output=True,
    )
    (again,) = (tmp_path / "out").glob("kt_kernel-*.whl")
    assert again.name == kt_wheel.name
    assert hashlib.sha256(again.read_bytes()).hexdigest() == hashlib.sha256(kt_wheel.read_bytes()).hexdigest()
    # the date is the release's, from _version.py
    with zipfile.ZipFile(again) as zf:
        dated = {i.date_time[:3] for i in zf.infolist()}
    assert dated == {tuple(int(x) for x in build_wheel_release_date().split("-"))}


def build_wheel_release_date() -> str:
    import re

    text = (ROOT / "kernel" / "python" / "kt_kernel" / "_version.py").read_text()
    m = re.search(r'^__release_date__ = "([\d-]+)"', text, re.MULTILINE)
    assert m is not None
    return m.group(1)
