"""The audit policy is data, checked when loaded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from audits import RULES, PolicyError, load_policy
from audits.policy import DEFAULT_POLICY

ROOT_LADDER = DEFAULT_POLICY.parent.parent.parent / "kernel/python/kt_kernel/cpu_variants.json"


def _write(tmp_path: Path, text: str, ladder: Path = ROOT_LADDER) -> Path:
    p = tmp_path / "policy.toml"
    p.write_text(text.replace('ladder = "cpu_variants.json"', f'ladder = "{ladder}"'))
    return p


def test_default_policy_loads_the_six_variants() -> None:
    pol = load_policy()
    assert [v.name for v in pol.variants] == ["avx2", "avx512_base", "avx512_vnni", "avx512_vbmi", "avx512_bf16", "amx"]
    avx2 = pol.variants[0]
    assert {"AVX", "SSE4_2", "X64"} <= avx2.allowed
    assert "AVX512F" not in avx2.allowed
    assert pol.wheel_budget_bytes == 100 << 20


def test_unknown_key_suggests_the_known_one(tmp_path: Path) -> None:
    text = DEFAULT_POLICY.read_text().replace("wheel_budget_mib", "wheel_budjet_mib")
    with pytest.raises(PolicyError, match="did you mean 'wheel_budget_mib'"):
        load_policy(_write(tmp_path, text))


def test_ladder_that_is_not_a_superset_is_refused(tmp_path: Path) -> None:
    data = json.loads(ROOT_LADDER.read_text())
    data["variants"][3]["features"].remove("AVX512_VNNI")
    ladder = tmp_path / "ladder.json"
    ladder.write_text(json.dumps(data))
    with pytest.raises(PolicyError, match="avx512_vbmi must strictly contain"):
        load_policy(_write(tmp_path, DEFAULT_POLICY.read_text(), ladder))


def test_rule_ids_are_stable_and_sectioned() -> None:
    assert all(r.count(".") == 1 for r in RULES)
    assert {r.section for r in RULES.values()} == {"wheel", "cpu", "cuda"}


def test_waiver_for_an_unknown_rule_is_refused(tmp_path: Path) -> None:
    text = DEFAULT_POLICY.read_text().replace('rule = "wheel.requires-python"', 'rule = "wheel.requires-pyhton"')
    with pytest.raises(PolicyError, match=r"did you mean 'wheel\.requires-python'"):
        load_policy(_write(tmp_path, text))


def test_the_isa_names_are_the_disassemblers() -> None:
    """Every feature the policy names is one iced-x86 reports: a misspelt one ("RDTSC" for TSC) would
    silently allow nothing."""
    import iced_x86

    from audits import load_policy

    known = {k for k, v in vars(iced_x86.CpuidFeature).items() if not k.startswith("_") and isinstance(v, int)}
    for name in ("default", "third-party"):
        policy = load_policy(name)
        assert set(policy.baseline) <= known, sorted(set(policy.baseline) - known)
        assert set(policy.loader_guarded) <= known, sorted(set(policy.loader_guarded) - known)
        for v in policy.variants:
            assert set(v.features) <= known, (v.name, sorted(set(v.features) - known))
