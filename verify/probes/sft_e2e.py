"""kt_kernel.sft end to end, run inside a venv with kt-kernel, transformers and peft (the test's
sft-test venv, and verify_install's sft-cpu profile with the forks).

1. Each described family (Qwen3-MoE, DeepSeek-V3 with shared experts, Mixtral), tiny and random
   (from a config: no download): wrap_model replaces every MoE block's experts; logits stay close
   to the unwrapped model's (the weights are quantized).
2. A tiny Qwen3-MoE trains with PEFT LoRA on attention plus the KT expert LoRA: the loss falls,
   adapters are saved and reloaded into a fresh model (identical logits), the base weights are
   bit-identical, and the loss trajectory stays close to the same model with torch experts.
Prints one JSON object."""

from __future__ import annotations

import itertools
import json
import tempfile
from typing import Any

STEPS = 8
COMMON = {
    "vocab_size": 128,
    "hidden_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 64,
    "num_experts_per_tok": 2,
}
# (transformers config class, its arguments beyond COMMON), 5 experts each
FAMILIES: dict[str, tuple[str, dict[str, Any]]] = {
    "qwen3_moe": (
        "Qwen3MoeConfig",
        {"intermediate_size": 128, "moe_intermediate_size": 64, "num_experts": 5, "head_dim": 32},
    ),
    "deepseek_v3": (
        "DeepseekV3Config",
        {
            "intermediate_size": 128,
            "moe_intermediate_size": 64,
            "n_routed_experts": 5,
            "n_shared_experts": 1,
            "first_k_dense_replace": 1,
            "n_group": 1,
            "topk_group": 1,
            "q_lora_rank": None,
            "kv_lora_rank": 32,
            "qk_rope_head_dim": 16,
            "qk_nope_head_dim": 16,
            "v_head_dim": 32,
        },
    ),
    "mixtral": ("MixtralConfig", {"intermediate_size": 64, "num_local_experts": 5}),
}


def problems(r: dict[str, Any]) -> list[str]:
    """What is wrong with a result of this script (empty: all good); verify_install and the tests."""
    bad = []
    blocks = {name: len(fam["blocks"]) for name, fam in r["families"].items()}
    if blocks != {"qwen3_moe": 2, "deepseek_v3": 1, "mixtral": 2}:  # DeepSeek-V3's layer 0 is dense
        bad.append(f"wrapped MoE blocks per family: {blocks}")
    bad += [
        f"{n}: logits moved {f['logits_rel_err']:.4f} (> 0.02)"
        for n, f in r["families"].items()
        if f["logits_rel_err"] > 0.02
    ]
    if (r["trainable_expert_lora"], r["trainable_attention_lora"]) != (12, 8):
        bad.append(
            f"trainable LoRA tensors: {r['trainable_expert_lora']} expert (want 12), "
            f"{r['trainable_attention_lora']} attention (want 8)"
        )
    if not (r["base_unchanged"] and r["expert_lora_moved"]):
        bad.append(f"base unchanged {r['base_unchanged']}, expert LoRA moved {r['expert_lora_moved']}")
    losses = r["losses"]
    if not all(b < a for a, b in itertools.pairwise(losses)) or losses[-1] > 0.9 * losses[0]:
        bad.append(f"the loss does not fall: {losses}")
    if r["trajectory_rel_diff"] > 0.01:
        bad.append(
            f"loss trajectory differs from torch experts by {r['trajectory_rel_diff']:.4f}: "
            f"{losses} vs {r['torch_losses']}"
        )
    if r["converted_reload_max_abs_diff"] != 0.0:
        bad.append(f"expert LoRA converted to PEFT's layout reloads with max diff {r['converted_reload_max_abs_diff']}")
    if r["reload_max_abs_diff"] != 0.0 or r["trained_vs_untrained_max_abs_diff"] < 0.1:
        bad.append(
            f"reloaded adapters: max diff {r['reload_max_abs_diff']} (want 0), "
            f"trained vs untrained {r['trained_vs_untrained_max_abs_diff']}"
        )
    return bad


def config(family: str) -> Any:
    """The tiny random transformers config of one family."""
    import transformers

    cls, extra = FAMILIES[family]
    return getattr(transformers, cls)(**COMMON, **extra)


def tokens(seed: int, rows: int = 4, length: int = 24) -> Any:
    """Fixed random token ids (a seeded generator)."""
    import torch

    return torch.randint(0, 128, (rows, length), generator=torch.Generator().manual_seed(seed))


def families() -> dict[str, Any]:
    """Each family wrapped: its MoE blocks and how far the logits moved (quantized weights)."""
    import torch
    from kt_kernel.sft import KTConfig, wrap_model
    from transformers import AutoModelForCausalLM

    out = {}
    ids = tokens(9)
    for name in FAMILIES:
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config(name)).eval()
        with torch.no_grad():
            ref = model(input_ids=ids).logits
            wrapped = wrap_model(model, KTConfig(lora_rank=0))
            got = model(input_ids=ids).logits
        out[name] = {
            "blocks": [w.path for w in wrapped],
            "logits_rel_err": float((got - ref).norm() / ref.norm()),
        }
    return out


def build(backend: str) -> Any:
    """The tiny Qwen3-MoE with PEFT LoRA and the expert LoRA of `backend` (same seeds every time)."""
    import torch
    from kt_kernel.sft import KTConfig, wrap_model
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config("qwen3_moe"))
    torch.manual_seed(1)
    model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    torch.manual_seed(2)
    wrap_model(model, KTConfig(backend=backend, weight_format="int8", lora_rank=4, lora_alpha=8.0))
    return model


def train(backend: str) -> tuple[Any, list[float], dict[str, Any]]:
    """STEPS AdamW steps on one batch: (model, losses, trainability and frozen-base facts)."""
    import torch
    from kt_kernel.sft import kt_experts

    model = build(backend)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    ids = tokens(3)
    before = [w.experts.base_digest() for w in kt_experts(model)]
    lora_before = [p.detach().clone() for w in kt_experts(model) for p in w.experts.adapter().parameters()]
    losses = []
    model.train()
    for _ in range(STEPS):
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.detach().item())
    info = {
        "trainable_expert_lora": sum(".lora.lora_" in n for n in trainable),
        "trainable_attention_lora": sum(("q_proj" in n or "v_proj" in n) for n in trainable),
        "base_unchanged": [w.experts.base_digest() for w in kt_experts(model)] == before,
        "expert_lora_moved": all(
            not torch.equal(a, p)
            for a, p in zip(
                lora_before, (p for w in kt_experts(model) for p in w.experts.adapter().parameters()), strict=True
            )
        ),
    }
    return model, losses, info


def main() -> None:
    """Print the JSON result (see the module docstring)."""
    import torch
    from kt_kernel.sft import load_expert_lora, save_expert_lora
    from peft import load_peft_weights, set_peft_model_state_dict

    result: dict[str, Any] = {"families": families()}
    model, losses, info = train("kt")
    _, ref_losses, _ = train("torch")
    result.update(info, losses=losses, torch_losses=ref_losses)
    result["trajectory_rel_diff"] = max(abs(a - b) / abs(b) for a, b in zip(losses, ref_losses, strict=True))
    probe = tokens(5)
    model.eval()
    with torch.no_grad():
        want = model(input_ids=probe).logits
    with tempfile.TemporaryDirectory() as d:
        model.save_pretrained(d)
        save_expert_lora(model, d)
        fresh = build("kt")
        set_peft_model_state_dict(fresh, load_peft_weights(d))
        load_expert_lora(fresh, d)
        fresh.eval()
        with torch.no_grad():
            got = fresh(input_ids=probe).logits
        # the same expert LoRA through kt-lora-convert into PEFT's per-expert layout, loaded from there
        from kt_kernel import lora_convert
        from kt_kernel.sft import load_expert_lora_state_dict
        from safetensors.torch import load_file

        peft_file = f"{d}/experts_peft.safetensors"
        assert lora_convert.main(["to-peft", f"{d}/kt_expert_adapter.safetensors", peft_file]) == 0
        converted = build("kt")
        set_peft_model_state_dict(converted, load_peft_weights(d))
        load_expert_lora_state_dict(converted, load_file(peft_file))
        converted.eval()
        with torch.no_grad():
            got_converted = converted(input_ids=probe).logits
        untrained = build("kt").eval()
        with torch.no_grad():
            base = untrained(input_ids=probe).logits
    result["reload_max_abs_diff"] = float((got - want).abs().max())
    result["converted_reload_max_abs_diff"] = float((got_converted - want).abs().max())
    result["trained_vs_untrained_max_abs_diff"] = float((base - want).abs().max())
    print(json.dumps(result))


if __name__ == "__main__":
    main()
