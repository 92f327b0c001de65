"""Loader decisions for synthetic CPUs: every variant boundary, OS-disabled
AVX-512, AMX without permission, and override errors."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.conftest import KT_SRC, load_source_module

cpu = load_source_module("kt_cpu_under_test", KT_SRC / "_cpu.py")
LADDER = cpu.Ladder.load(KT_SRC / "cpu_variants.json")
NAMES = LADDER.names


def state(
    features: set[str],
    *,
    os_avx: bool = True,
    os_avx512: bool = True,
    os_amx: bool = True,
    amx_permitted: bool | None = True,
    amx_errno: int = 0,
) -> Any:
    return cpu.CpuState(
        cpuid=dict.fromkeys(features, True),
        os_avx=os_avx,
        os_avx512=os_avx512,
        os_amx=os_amx,
        amx_permitted=amx_permitted,
        amx_errno=amx_errno,
        vendor="GenuineTest",
        brand="Synthetic CPU",
    )


def test_ladder_has_the_six_variants_in_order() -> None:
    assert NAMES == ("avx2", "avx512_base", "avx512_vnni", "avx512_vbmi", "avx512_bf16", "amx")


@pytest.mark.parametrize("index", range(6))
def test_each_variant_boundary(index: int) -> None:
    """A CPU with exactly variant i's features gets variant i; minus its marker, variant i-1."""
    v = LADDER.variants[index]
    assert cpu.choose(LADDER, state(set(v.features))).chosen == v.name
    without_marker = set(v.features) - {v.marker}
    if index == 0:
        # the missing feature itself, not the message's fixed "needs ... AVX2, F16C, FMA" prefix
        with pytest.raises(cpu.CpuVariantError, match=r"missing AVX2 \(not reported by CPUID\)\.$"):
            cpu.choose(LADDER, state(without_marker))
    else:
        assert cpu.choose(LADDER, state(without_marker)).chosen == NAMES[index - 1]


def test_superset_cpu_gets_the_best_variant() -> None:
    everything = {f for v in LADDER.variants for f in v.features} | {"AMX_BF16", "AVX512_FP16"}
    assert cpu.choose(LADDER, state(everything)).chosen == "amx"


def test_os_disabled_avx512_falls_back_to_avx2_and_says_why() -> None:
    everything = {f for v in LADDER.variants for f in v.features}
    d = cpu.choose(LADDER, state(everything, os_avx512=False, os_amx=False))
    assert d.chosen == "avx2"
    base = next(s for s in d.statuses if s.name == "avx512_base")
    assert not base.usable
    assert any("OS has not enabled AVX-512 state" in m for m in base.missing)


def test_os_disabled_avx_means_no_variant() -> None:
    with pytest.raises(cpu.CpuVariantError, match="OS has not enabled AVX state"):
        cpu.choose(LADDER, state({"AVX2", "FMA", "F16C"}, os_avx=False))


def test_amx_without_permission_uses_avx512_bf16() -> None:
    everything = {f for v in LADDER.variants for f in v.features}
    d = cpu.choose(LADDER, state(everything, amx_permitted=False, amx_errno=1))
    assert d.chosen == "avx512_bf16"
    amx = next(s for s in d.statuses if s.name == "amx")
    assert any("refused AMX permission" in m and "errno 1" in m for m in amx.missing)


def test_amx_without_os_tile_state() -> None:
    everything = {f for v in LADDER.variants for f in v.features}
    d = cpu.choose(LADDER, state(everything, os_amx=False, amx_permitted=None))
    assert d.chosen == "avx512_bf16"


def test_no_avx2_is_an_import_error_naming_the_missing_features() -> None:
    with pytest.raises(ImportError) as exc:
        cpu.choose(LADDER, state({"SSE4_2", "AVX"}))
    msg = str(exc.value)
    assert "AVX2 (not reported by CPUID)" in msg
    assert "FMA (not reported by CPUID)" in msg
    assert "Synthetic CPU" in msg


def test_override_selects_a_lower_runnable_variant() -> None:
    everything = {f for v in LADDER.variants for f in v.features}
    d = cpu.choose(LADDER, state(everything), override="avx2")
    assert (d.chosen, d.overridden) == ("avx2", True)


def test_override_unknown_name_lists_valid_names() -> None:
    with pytest.raises(cpu.CpuVariantError) as exc:
        cpu.choose(LADDER, state({"AVX2", "FMA", "F16C"}), override="avx512vnni")
    msg = str(exc.value)
    assert "did you mean 'avx512_vnni'" in msg
    for name in NAMES:
        assert name in msg


def test_override_refuses_a_variant_the_cpu_cannot_run() -> None:
    with pytest.raises(cpu.CpuVariantError) as exc:
        cpu.choose(LADDER, state({"AVX2", "FMA", "F16C"}), override="avx512_vnni")
    msg = str(exc.value)
    assert "AVX512_VNNI (not reported by CPUID)" in msg
    assert "best usable variant (avx2)" in msg


def test_variant_not_built_into_the_wheel_is_skipped() -> None:
    everything = {f for v in LADDER.variants for f in v.features}
    d = cpu.choose(LADDER, state(everything), built=["avx2", "avx512_vnni"])
    assert d.chosen == "avx512_vnni"
    assert next(s for s in d.statuses if s.name == "amx").describe() == "not built into this wheel"


def test_report_marks_the_choice() -> None:
    st = state({"AVX2", "FMA", "F16C"})
    text = cpu.render_report(st, cpu.choose(LADDER, st), LADDER)
    assert "* avx2" in text
    assert "selected: avx2 (best usable)" in text


def _ladder_dict() -> dict[str, Any]:
    data: dict[str, Any] = json.loads((KT_SRC / "cpu_variants.json").read_text())
    return data


def test_ladder_rejects_a_variant_that_drops_a_lower_feature() -> None:
    data = _ladder_dict()
    data["variants"][2]["features"].remove("AVX512BW")
    data["variants"][2]["features"].remove("AVX512_VNNI")  # keep the marker check out of the way
    data["variants"][2]["features"].append("AVX512_VNNI")
    data["variants"][2]["features"].remove("FMA")
    with pytest.raises(cpu.LadderError, match=r"avx512_vnni must strictly contain .* lacks .*AVX512BW"):
        cpu.Ladder.from_dict(data)


def test_ladder_unknown_key_suggests_the_right_one() -> None:
    data = _ladder_dict()
    data["variants"][0]["featurs"] = data["variants"][0].pop("features")
    with pytest.raises(cpu.LadderError, match="did you mean 'features'"):
        cpu.Ladder.from_dict(data)


def test_ladder_marker_must_be_a_feature() -> None:
    data = _ladder_dict()
    data["variants"][1]["marker"] = "AVX512_FP16"
    with pytest.raises(cpu.LadderError, match="marker AVX512_FP16 is not one of its features"):
        cpu.Ladder.from_dict(data)
