"""The LLaMA-Factory install profiles, for real: lf-standard (upstream LlamaFactory), lf-kt (serving and
fine-tuning with llamafactory-kt) and the upgrade of the first into the second, each in a fresh venv
by hash, trained in with LlamaFactory itself (verify/probes/lf_control.py). The CUDA torch build they pin
(several GB) comes through uv's cache."""

from __future__ import annotations

from pathlib import Path

import pytest

from carriers import load
from carriers.assemble import assemble
from verify import lf as verify_lf

pytestmark = pytest.mark.network


@pytest.fixture(scope="module")
def lf_dist(tmp_path_factory: pytest.TempPathFactory, kt_wheel: Path) -> Path:
    dist = tmp_path_factory.mktemp("lf") / "dist"
    assemble(load(), kt_wheel, dist)
    return dist


def test_standard_profile_is_upstream_and_refuses_use_kt(lf_dist: Path, tmp_path: Path) -> None:
    r = verify_lf.verify_standard(lf_dist, tmp_path)
    assert {k: [o["name"] for o in v] for k, v in r["owners"].items()} == {p: [p] for p in verify_lf.STANDARD_PACKAGES}
    assert r["control"]["kt_blocks"] == 0
    assert r["control"]["resume_diffs"] == []
    assert "pip install kt-kernel" in r["refused"]["use_kt"]  # upstream's message: what to install


def test_kt_profile_owns_every_package_and_dispatches_only_when_configured(lf_dist: Path, tmp_path: Path) -> None:
    r = verify_lf.verify_kt(lf_dist, tmp_path)
    assert {k: len(v) for k, v in r["owners"].items()} == dict.fromkeys(verify_lf.KT_PACKAGES, 1)
    assert r["owners"]["llamafactory"] == ["llamafactory-kt 0.9.5.post1"]
    assert r["control_kt"]["kt_blocks"] == r["control_kt"]["blocks"] > 0  # use_kt: every MoE block
    assert r["control_plain"]["kt_blocks"] == 0  # not configured: none
    assert r["control_kt"]["resume_diffs"] == []
    assert r["control_kt"]["expert_adapter_saved"]
    assert r["llamafactory"]["check_dependencies"] == "ok"
    assert r["llamafactory"]["xgrammar"] == "xgrammar"  # its library found through the renamed xgrammar-kt
    assert r["llamafactory"]["is_transformers_version_greater_than('5.0.0')"] is True
    assert "packing: false" in r["refused"]["packing_with_kt"]
    assert "on meta. Set `use_cpu: true`" in r["refused"]["model_off_cpu"]


def test_standard_environment_upgrades_to_kt_through_kt_doctor(lf_dist: Path, tmp_path: Path) -> None:
    r = verify_lf.verify_upgrade(lf_dist, tmp_path)
    assert r["conflicts_reported"] == sorted(verify_lf.STANDARD_PACKAGES)
    assert r["torch"]["before"] == r["torch"]["after"]
    assert all(len(v) == 1 and "-kt " in v[0] for k, v in r["owners"].items() if k != "sgl_kernel")
    assert r["control_kt"]["kt_blocks"] == r["control_kt"]["blocks"]
