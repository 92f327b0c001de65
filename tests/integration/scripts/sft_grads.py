"""Run inside a venv with kt-kernel and torch: kt_kernel.sft's experts (forward, backward, autograd,
TP) against the torch fp32 autograd reference on the dequantized weights (TorchExperts, same LoRA
values), and the training properties the issue names. The variant is kt_kernel's choice
(KT_KERNEL_CPU_VARIANT) or a test-only emulated library (KT_TEST_VARIANT_LIBRARY).
`--quick` runs a subset. Prints one JSON object."""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import kt_kernel
import torch

if os.environ.get("KT_TEST_VARIANT_LIBRARY"):
    kt_kernel._VARIANT = kt_kernel._core.Variant(os.environ["KT_TEST_VARIANT_LIBRARY"])
    kt_kernel.__cpu_variant__ = kt_kernel._VARIANT.name + "-emulated"

from kt_kernel.sft import KTConfig, KTExperts, TorchExperts

QUICK = "--quick" in sys.argv
H, INTER, K, T, R = 256, 128, 2, 9, 4
NAMES = ("x", "w", "gate_a", "gate_b", "up_a", "up_b", "down_a", "down_b")


def make(experts: int, fmt: Any, tp: int, **kw: Any) -> tuple[KTExperts, TorchExperts]:
    g = torch.Generator().manual_seed(experts)
    shapes = ((experts, INTER, H), (experts, INTER, H), (experts, H, INTER))
    weights = [torch.randn(s, generator=g) * 0.05 for s in shapes]
    cfg = KTConfig(weight_format=fmt, group_size=64, tp=tp, lora_rank=R, lora_alpha=8.0, num_threads=2, **kw)
    quantized = [kt_kernel.quantize(w, fmt, 64) for w in weights]
    g8, u8, d8 = quantized
    kt, ref = KTExperts(g8, u8, d8, cfg), TorchExperts(g8, u8, d8, cfg)
    with torch.no_grad():  # B non-zero, so every LoRA gradient is
        for p in kt.adapter().tensors():
            p.copy_(torch.randn(p.shape, generator=g) * 0.1)
        for p, q in zip(ref.adapter().tensors(), kt.adapter().tensors(), strict=True):
            p.copy_(q)
    return kt, ref


def inputs(experts: int, dtype: torch.dtype, tokens: int = T, seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(100 + seed)
    x = torch.randn(tokens, H, generator=g).to(dtype)
    ids = (
        torch.stack([torch.randperm(experts, generator=g)[:K] for _ in range(tokens)])
        if tokens
        else torch.zeros(0, K, dtype=torch.int64)
    )
    w = torch.rand(tokens, K, generator=g)
    dy = torch.randn(tokens, H, generator=g).to(dtype)
    return x, ids, w, dy


def grads(layer: Any, x: torch.Tensor, ids: torch.Tensor, w: torch.Tensor, dy: torch.Tensor) -> dict[str, Any]:
    x = x.clone().requires_grad_()
    w = w.clone().requires_grad_()
    for p in layer.adapter().tensors():
        p.grad = None
    y = layer(x, ids, w)
    (y.float() * dy.float()).sum().backward()
    out = {"y": y.detach().float(), "x": x.grad.float(), "w": w.grad.float()}
    for n, p in zip(NAMES[2:], layer.adapter().tensors(), strict=True):
        out[n] = p.grad.clone()
    return out


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / (b.norm() + 1e-30))


# (format, tp, dtype, experts, tokens); the 48-token cases route >= 16 pairs to each of 3 experts,
# which takes the AMX tile path of the amx variant for INT8.
MATRIX = [
    (fmt, tp, dtype, experts, T)
    for fmt in ("int8", "rawint4")
    for tp in (1, 2)
    for dtype in (torch.float32, torch.bfloat16)
    for experts in ((3,) if QUICK else (3, 5, 7))
] + [("int8", 1, torch.float32, 3, 48), ("int8", 2, torch.bfloat16, 3, 48)]
cases = []
for fmt, tp, dtype, experts, tokens in MATRIX:
    kt, ref = make(experts, fmt, tp)
    x, ids, w, dy = inputs(experts, dtype, tokens=tokens)
    got, want = grads(kt, x, ids, w, dy), grads(ref, x, ids, w, dy)
    cases.append(
        {
            "fmt": fmt,
            "tp": tp,
            "dtype": str(dtype),
            "experts": experts,
            "tokens": tokens,
            "err": {k: rel(got[k], want[k]) for k in got},
        }
    )

# TP1 vs TP2 on the same layer and inputs.
kt1, _ = make(5, "int8", 1)
kt2, _ = make(5, "int8", 2)
x, ids, w, dy = inputs(5, torch.float32)
g1, g2 = grads(kt1, x, ids, w, dy), grads(kt2, x, ids, w, dy)
tp_agree = {k: rel(g2[k], g1[k]) for k in g1}

# Gradient accumulation: two micro-batches equal the full batch.
kt, _ = make(5, "rawint4", 1)
x, ids, w, dy = inputs(5, torch.float32, tokens=12)
full = grads(kt, x, ids, w, dy)
for p in kt.adapter().tensors():
    p.grad = None
for sl in (slice(0, 5), slice(5, 12)):
    (kt(x[sl], ids[sl], w[sl]) * dy[sl]).sum().backward()
accumulation = max(rel(p.grad, full[n]) for n, p in zip(NAMES[2:], kt.adapter().tensors(), strict=True))

# Loss scaling: a loss times 1024 gives gradients times 1024.
scaled = grads(kt, x, ids, w, dy * 1024)
loss_scaling = max(rel(scaled[n] / 1024, full[n]) for n in NAMES)

# Checkpointing (recompute in the backward) gives the same gradients.
ck, _ = make(5, "rawint4", 1, checkpointing=True)
checkpointing = max(rel(grads(ck, x, ids, w, dy)[n], full[n]) for n in NAMES)

# Optimizer steps change the LoRA, never the quantized base weights.
before = kt.base_digest()
lora_before = [p.detach().clone() for p in kt.adapter().tensors()]
pool_addresses = [b.gate.ctypes.data for b in kt.pool.buffers]
opt = torch.optim.AdamW(kt.adapter().parameters(), lr=1e-2)
for _step in range(3):
    opt.zero_grad()
    (kt(x, ids, w) * dy).sum().backward()
    opt.step()
base_unchanged = kt.base_digest() == before
# the saved-activation buffers were sized by the first step and reused by the others
buffers_reused = kt.pool.capacity == x.shape[0] * K and all(
    b.gate.ctypes.data == a for b, a in zip(kt.pool.buffers, pool_addresses, strict=True)
)
lora_moved = all(not torch.equal(a, b) for a, b in zip(lora_before, kt.adapter().tensors(), strict=True))

# Zero tokens.
x0, ids0, w0, dy0 = inputs(5, torch.float32, tokens=0)
g0 = grads(kt, x0, ids0, w0, dy0)
zero_tokens = {
    "y_shape": list(g0["y"].shape),
    "dx_shape": list(g0["x"].shape),
    "lora_grads_zero": all(bool((g0[n] == 0).all()) for n in NAMES[2:]),
}

# NaN in one token: the same NaN pattern as torch in the output and every gradient.
kt, ref = make(5, "int8", 1)
x, ids, w, dy = inputs(5, torch.float32)
x[2, 5] = float("nan")
got, want = grads(kt, x, ids, w, dy), grads(ref, x, ids, w, dy)
nan = {
    "same_pattern": {k: bool(torch.equal(torch.isnan(got[k]), torch.isnan(want[k]))) for k in got},
    "y_nan_rows": [t for t in range(T) if bool(torch.isnan(got["y"][t]).all())],
    "dx_finite_rows": [t for t in range(T) if bool(torch.isfinite(got["x"][t]).all())],
}

print(
    json.dumps(
        {
            "variant": kt_kernel.__cpu_variant__,
            "cases": cases,
            "tp_agree": tp_agree,
            "accumulation": accumulation,
            "loss_scaling": loss_scaling,
            "checkpointing": checkpointing,
            "base_unchanged": base_unchanged,
            "buffers_reused": buffers_reused,
            "lora_moved": lora_moved,
            "zero_tokens": zero_tokens,
            "nan": nan,
            "saved_bytes_per_token": kt.saved_bytes_per_token(K),
        }
    )
)
