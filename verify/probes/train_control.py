"""Training/resume control, run inside the sft-cpu venv by verify_install.

A tiny randomly initialised causal LM (from a config: no hub download) with a
PEFT LoRA adapter trains 3 steps, writes a full checkpoint (adapter, optimizer,
scheduler, RNG), resumes in fresh objects and trains 3 more. Adapter weights and
optimizer state must be bit-identical to an uninterrupted 6-step run. Each
example is its own padded row: packing is disabled.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
from peft import LoraConfig, get_peft_model, get_peft_model_state_dict, load_peft_weights, set_peft_model_state_dict
from transformers import LlamaConfig, LlamaForCausalLM

STEPS, SPLIT = 6, 3


def make() -> tuple[Any, torch.optim.Optimizer, Any]:
    """Model, optimizer and scheduler, seeded: every call gives the same objects."""
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=96,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=32,
    )
    model = get_peft_model(
        LlamaForCausalLM(cfg), LoraConfig(r=4, lora_alpha=8, lora_dropout=0.1, target_modules=["q_proj", "v_proj"])
    )
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=5e-3)
    sched = torch.optim.lr_scheduler.LinearLR(opt, start_factor=1.0, end_factor=0.2, total_iters=STEPS)
    return model, opt, sched


def batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The STEPS batches, one example per padded row."""
    g = torch.Generator().manual_seed(1)
    out = []
    for _ in range(STEPS):
        ids = torch.randint(1, 96, (4, 16), generator=g)
        lengths = torch.randint(8, 17, (4,), generator=g)
        mask = (torch.arange(16)[None, :] < lengths[:, None]).long()  # one example per row, right-padded
        out.append((ids * mask, mask))
    return out


def train(model: Any, opt: torch.optim.Optimizer, sched: Any, data: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    """One optimizer step per batch."""
    model.train()
    for ids, mask in data:
        labels = ids.masked_fill(mask == 0, -100)
        model(input_ids=ids, attention_mask=mask, labels=labels).loss.backward()
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)


def main() -> int:
    """Print whether 3 + resume + 3 steps equal 6 uninterrupted ones, bit for bit."""
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    data = batches()
    ref_model, ref_opt, ref_sched = make()
    train(ref_model, ref_opt, ref_sched, data)

    model, opt, sched = make()
    train(model, opt, sched, data[:SPLIT])
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = Path(tmp)
        model.save_pretrained(ckpt / "adapter")
        torch.save(
            {
                "optimizer": opt.state_dict(),
                "scheduler": sched.state_dict(),
                "rng": torch.get_rng_state(),
                "step": SPLIT,
            },
            ckpt / "trainer_state.pt",
        )
        del model, opt, sched
        model, opt, sched = make()  # fresh objects, as a restarted process would have
        set_peft_model_state_dict(model, load_peft_weights(str(ckpt / "adapter")))
        state = torch.load(ckpt / "trainer_state.pt", weights_only=False)
        opt.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["scheduler"])
        torch.set_rng_state(state["rng"])
    train(model, opt, sched, data[state["step"] :])

    a, b = get_peft_model_state_dict(ref_model), get_peft_model_state_dict(model)
    adapter_equal = a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    sa, sb = ref_opt.state_dict()["state"], opt.state_dict()["state"]
    opt_equal = sa.keys() == sb.keys() and all(
        torch.equal(torch.as_tensor(sa[i][k]), torch.as_tensor(sb[i][k])) for i in sa for k in sa[i]
    )
    moved = any(not torch.equal(v, get_peft_model_state_dict(make()[0])[k]) for k, v in a.items())
    print(
        json.dumps(
            {
                "adapter_bit_identical": adapter_equal,
                "optimizer_bit_identical": opt_equal,
                "adapter_tensors": len(a),
                "trained": moved,
            }
        )
    )
    return 0 if adapter_equal and opt_equal and moved else 1


if __name__ == "__main__":
    sys.exit(main())
