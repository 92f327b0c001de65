"""`nox -s tests -- ARGS` hands pytest its own options (`-k EXPR -x`, paths) and keeps `--no-build` for
itself: the real front door, on one small test."""

from __future__ import annotations

import subprocess

import pytest

from tests.conftest import ROOT


def test_pytest_options_pass_through_nox_tests() -> None:
    nox = ROOT / ".venv" / "bin" / "nox"
    if not nox.exists():
        pytest.fail(f"{nox} is missing: the README's test command creates it (python3 -m venv .venv ...)")
    run = subprocess.run(
        [
            str(nox),
            "-s",
            "tests",
            "--",
            "--no-build",
            "tests/unit/test_readme.py",
            "-k",
            "two_commands",
            "-x",
            "-q",
            "-n",
            "0",
        ],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert "1 passed" in run.stdout + run.stderr
    assert "deselected" in run.stdout + run.stderr  # -k reached pytest (-n 0: in one process, which reports it)
    assert "kernel/tools/build_wheel.py" not in run.stdout + run.stderr  # --no-build stayed nox's
