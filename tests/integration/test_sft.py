"""kt_kernel.sft: LoRA fine-tuning through the CPU expert kernels.

Gradients against the torch fp32 autograd reference on the dequantized weights (INT8 and RAWINT4,
TP1 and TP2, fp32 and bf16, 3/5/7 experts) on every variant the host runs (the emulated variants:
test_emulated_variants.py), the training properties (accumulation, loss scaling, checkpointing,
frozen base, zero tokens, NaN), the lazy import, KTConfig's errors, and an end-to-end PEFT run on
tiny random Hugging Face MoE models (verify/probes/sft_e2e.py, also run by verify_install on the forks)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT
from tests.integration.conftest import SCRIPTS, Venv, make_venv, wheel_requirement
from tests.integration.test_kernel_wheel import VARIANTS, skip_unless_host_runs
from verify.probes import sft_e2e

# The forward quantizes activations (int8 per row, or bf16): ~1.2% relative error on y, ~0.6% on
# the gradients (which use the saved fp32 projections). A wrong sign, transpose or scale anywhere
# gives errors of order 1.
BOUND_Y, BOUND_GRAD = 0.03, 0.02
GRADS = ("x", "w", "gate_a", "gate_b", "up_a", "up_b", "down_a", "down_b")


def sft_problems(result: dict[str, Any], quick: bool = False) -> list[str]:
    """Everything in an sft_grads.py result that is out of bounds (empty: all good)."""
    bad = []
    cases = result["cases"]
    want = 2 * 2 * 2 * (1 if quick else 3) + 2  # + two 48-token cases (AMX tiles)
    if len(cases) != want:
        bad.append(f"{len(cases)} cases, expected {want}")
    for c in cases:
        where = f"{c['fmt']} tp{c['tp']} {c['dtype']} E={c['experts']} T={c['tokens']}"
        if c["err"]["y"] > BOUND_Y:
            bad.append(f"{where}: forward rel err {c['err']['y']:.4f} > {BOUND_Y}")
        bad += [
            f"{where}: grad {k} rel err {c['err'][k]:.4f} > {BOUND_GRAD}" for k in GRADS if c["err"][k] > BOUND_GRAD
        ]
    if result["tp_agree"]["y"] > BOUND_Y or any(result["tp_agree"][k] > 1e-5 for k in GRADS):
        bad.append(f"TP1 and TP2 disagree: {result['tp_agree']}")
    if result["accumulation"] > 1e-5:
        bad.append(f"two micro-batches differ from the full batch by {result['accumulation']}")
    if result["loss_scaling"] > 1e-6:
        bad.append(f"loss scaling is not linear: {result['loss_scaling']}")
    if result["checkpointing"] > 1e-7:
        bad.append(f"checkpointing changes the gradients by {result['checkpointing']}")
    if not (result["base_unchanged"] and result["lora_moved"]):
        bad.append(f"optimizer steps: base unchanged {result['base_unchanged']}, LoRA moved {result['lora_moved']}")
    if not result["buffers_reused"]:
        bad.append("the saved-activation buffers were reallocated between steps of the same size")
    if result["zero_tokens"] != {"y_shape": [0, 256], "dx_shape": [0, 256], "lora_grads_zero": True}:
        bad.append(f"zero tokens: {result['zero_tokens']}")
    nan = result["nan"]
    if not all(nan["same_pattern"].values()) or nan["y_nan_rows"] != [2]:
        bad.append(f"NaN propagation differs from torch: {nan}")
    return bad


def report(result: dict[str, Any]) -> str:
    worst = {k: max(c["err"][k] for c in result["cases"]) for k in ("y", *GRADS)}
    return f"{result['variant']}: worst rel err " + ", ".join(f"{k} {v:.4f}" for k, v in worst.items())


@pytest.fixture(scope="session")
def sft_venv(tmp_path_factory: pytest.TempPathFactory, kt_wheel: Path) -> Venv:
    return make_venv(tmp_path_factory.mktemp("sft") / "venv", [wheel_requirement(kt_wheel)], lock="sft-test")


LAZY = """
import json, sys
import kt_kernel
before = {m: m in sys.modules for m in ("torch", "kt_kernel.sft")}
sft = kt_kernel.sft
print(json.dumps({"before": before, "after": "kt_kernel.sft" in sys.modules and "torch" in sys.modules,
                  "has_wrap_model": hasattr(sft, "wrap_model")}))
"""


def test_import_kt_kernel_loads_neither_torch_nor_sft(fresh_venv: Venv) -> None:
    result = fresh_venv.json("-c", LAZY)
    assert result == {"before": {"torch": False, "kt_kernel.sft": False}, "after": True, "has_wrap_model": True}


CONFIG = """
import json, warnings
from kt_kernel.sft import KTConfig, KTConfigError, LEGACY_NAMES, arch_for
out = {}
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    cfg = KTConfig.from_dict({"kt_weight_type": "rawint4", "lora_r": 16, "kt_tp_size": 2, "lora_alpha": 32})
out["legacy"] = [cfg.weight_format, cfg.lora_rank, cfg.tp, cfg.lora_scale]
out["warnings"] = sorted(str(w.message) for w in caught if w.category is DeprecationWarning)
def error(fn):
    try:
        fn()
    except KTConfigError as exc:
        return str(exc)
    return None
out["unknown"] = error(lambda: KTConfig.from_dict({"lora_rnak": 8}))
out["twice"] = error(lambda: KTConfig.from_dict({"lora_r": 8, "lora_rank": 4}))
out["format"] = error(lambda: KTConfig(weight_format="fp8"))
out["targets"] = error(lambda: KTConfig(lora_targets=("gate", "q_proj")))
out["group"] = error(lambda: KTConfig(weight_format="rawint4", group_size=48))
out["arches"] = {t: arch_for(t).family for t in ("qwen3_moe", "deepseek_v3", "kimi_k2", "mixtral")}
try:
    arch_for("llama")
except Exception as exc:
    out["unknown_arch"] = str(exc)
out["round_trip"] = KTConfig.from_dict(cfg.to_dict()) == cfg
print(json.dumps(out))
"""


def test_ktconfig_maps_old_names_and_refuses_unknown_ones(fresh_venv: Venv) -> None:
    # fresh_venv has torch (runtime-cpu), which kt_kernel.sft needs
    r = fresh_venv.json("-c", CONFIG)
    assert r["legacy"] == ["rawint4", 16, 2, 2.0]
    assert r["warnings"] == [
        "KTConfig field 'kt_tp_size' is deprecated; use 'tp'",
        "KTConfig field 'kt_weight_type' is deprecated; use 'weight_format'",
        "KTConfig field 'lora_r' is deprecated; use 'lora_rank'",
    ]
    assert r["unknown"] == "unknown KTConfig field 'lora_rnak'; did you mean 'lora_rank'?"
    assert r["twice"] == "KTConfig field 'lora_rank' is given twice (once as 'lora_rank')"
    assert r["format"] == "KTConfig.weight_format='fp8': use one of ('int8', 'rawint4')"
    assert "['q_proj'] are not expert projections" in r["targets"]
    assert "RAWINT4 groups are one of (32, 64, 128)" in r["group"]
    assert r["arches"] == {
        "qwen3_moe": "qwen3-moe",
        "deepseek_v3": "deepseek-v3",
        "kimi_k2": "deepseek-v3",
        "mixtral": "mixtral",
    }
    assert "model_type 'llama' has no MoE description" in r["unknown_arch"]
    assert r["round_trip"]


@pytest.mark.parametrize("variant", VARIANTS)
def test_sft_gradients_match_torch_autograd(variant: str, fresh_venv: Venv) -> None:
    skip_unless_host_runs(variant, "its emulated build runs in test_emulated_variants.py")
    result = fresh_venv.json(str(SCRIPTS / "sft_grads.py"), env={"KT_KERNEL_CPU_VARIANT": variant})
    assert result["variant"] == variant
    print(report(result), f"saved activations {result['saved_bytes_per_token']} B/token")
    bad = sft_problems(result)
    assert not bad, "\n".join(bad)


def test_sft_end_to_end_with_peft(sft_venv: Venv) -> None:
    """Tiny random Qwen3-MoE / DeepSeek-V3 / Mixtral: wrapped, trained with PEFT + expert LoRA,
    saved, reloaded; the loss follows the same model with torch experts."""
    r = sft_venv.json(str(ROOT / "verify" / "probes" / "sft_e2e.py"))
    print({k: v for k, v in r.items() if k != "families"})
    bad = sft_e2e.problems(r)
    assert not bad, "\n".join(bad)
