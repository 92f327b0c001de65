"""Older CPUs, emulated by qemu-user: the loader picks avx2 on Haswell and
refuses Nehalem with an ImportError (an exit status, never a signal)."""

from __future__ import annotations

import json
import shutil

import pytest

from tests.integration.conftest import SCRIPTS, Venv

QEMU = shutil.which("qemu-x86_64")
pytestmark = pytest.mark.skipif(QEMU is None, reason="qemu-x86_64 not installed (Debian package qemu-user)")


def test_haswell_imports_picks_avx2_and_computes(fresh_venv: Venv) -> None:
    assert QEMU is not None
    proc = fresh_venv.run(str(SCRIPTS / "emulated.py"), prefix=(QEMU, "-cpu", "Haswell"), check=False)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["variant"] == "avx2"
    assert result["rel_err"] < 3e-2


def test_nehalem_gets_a_clear_import_error(fresh_venv: Venv) -> None:
    assert QEMU is not None
    proc = fresh_venv.run("-c", "import kt_kernel", prefix=(QEMU, "-cpu", "Nehalem"), check=False)
    assert proc.returncode == 1, f"expected exit 1 (ImportError), got {proc.returncode}: {proc.stderr[-2000:]}"
    assert "CpuVariantError" in proc.stderr
    assert "AVX2 (not reported by CPUID)" in proc.stderr
    assert "FMA (not reported by CPUID)" in proc.stderr
