"""Run inside a fresh venv: kt_kernel against a torch fp32 reference.

Prints one JSON line: {"variant": ..., "cases": [{"fmt", "group", "experts", "tokens",
"dtype", "rel_err", "max_err", "quant_err", "e2e_err"}...]}. Nothing of kt_kernel's own
dequantizer is used: the weights are decoded here from the layout QuantizedWeights documents
(`decode`), so a quantizer bug that kt_kernel.dequantize would mirror (a wrong scale, a swapped
nibble) shows up. Three errors per case, each relative L2:
- rel_err: the kernel against torch fp32 on the decoded weights (the kernel's own error);
- quant_err: the decoded weights against the original fp32 weights (the quantizer's error);
- e2e_err: the kernel against torch fp32 on the original weights (what a user sees).
"""

from __future__ import annotations

import json
import sys
from typing import Literal

import kt_kernel
import numpy as np
import torch

HIDDEN, INTER = 256, 128
EXPERTS = (1, 3, 5, 7, 64)
TOKENS = (1, 3, 17, 256)
# Rows that are an odd multiple of 64 end in the wide variants' 64-element tail step (their main
# steps take 128): one more shape for every format whose group divides it.
TAIL_HIDDEN, TAIL_INTER, TAIL_EXPERTS = 320, 192, 3


def reference(
    x: torch.Tensor, ids: torch.Tensor, w: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor
) -> torch.Tensor:
    y = torch.zeros_like(x)
    for e in torch.unique(ids).tolist():
        tok, k = (ids == e).nonzero(as_tuple=True)
        xe = x[tok]
        h = torch.nn.functional.silu(xe @ gate[e].T) * (xe @ up[e].T)
        y.index_add_(0, tok, (h @ down[e].T) * w[tok, k, None])
    return y


def decode(q: kt_kernel.QuantizedWeights) -> np.ndarray:
    """The fp32 weights of the documented layout, decoded independently of kt_kernel.dequantize:
    int8 q[e, r, c] * scale[e, r]; rawint4: per 32-element block, byte j's low nibble is element j
    and its high nibble element j + 16, two's complement, times scale[e, r, c // group]."""
    e, r = q.q.shape[:2]
    c = q.cols
    if q.format == "int8":
        return q.q.astype(np.float64) * q.scale[:, :, None]
    blocks = q.q.reshape(e, r, c // 32, 16).astype(np.int16)
    nibbles = np.concatenate([blocks & 0xF, blocks >> 4], axis=3)  # element j, then element j + 16
    values = ((nibbles ^ 8) - 8).reshape(e, r, c)  # sign-extend 4 bits
    return values * np.repeat(q.scale.astype(np.float64), q.group_size, axis=2)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def main() -> None:
    formats: list[tuple[Literal["int8", "rawint4"], int]] = [
        ("int8", 0),
        ("rawint4", 32),
        ("rawint4", 64),
        ("rawint4", 128),
    ]
    if len(sys.argv) > 1 and sys.argv[1] == "--quick":
        formats = [("int8", 0), ("rawint4", 64)]
    main_rng = np.random.default_rng(1234)
    cases = []
    shapes = [(HIDDEN, INTER, experts) for experts in EXPERTS]
    tail_rng = np.random.default_rng(5678)  # its own stream: the other cases draw what they always drew
    for fmt, group in formats:
        tail = [(TAIL_HIDDEN, TAIL_INTER, TAIL_EXPERTS)] if TAIL_INTER % (group or 64) == 0 else []
        for hidden, inter, experts in shapes + tail:
            rng = tail_rng if hidden == TAIL_HIDDEN else main_rng
            wg = rng.standard_normal((experts, inter, hidden), dtype=np.float32) * 0.05
            wu = rng.standard_normal((experts, inter, hidden), dtype=np.float32) * 0.05
            wd = rng.standard_normal((experts, hidden, inter), dtype=np.float32) * 0.05
            originals = (wg, wu, wd)
            q = [kt_kernel.quantize(w, fmt, group or 64) for w in originals]
            deq = [torch.from_numpy(decode(qq).astype(np.float32)) for qq in q]
            orig = [torch.from_numpy(w) for w in originals]
            quant_err = max(rel(d, o) for d, o in zip(deq, orig, strict=True))
            layer = kt_kernel.MoE(*q)
            topk = min(experts, 4)
            for tokens in TOKENS:
                x = torch.from_numpy(rng.standard_normal((tokens, hidden), dtype=np.float32))
                ids = torch.from_numpy(np.stack([rng.permutation(experts)[:topk] for _ in range(tokens)]))
                w = torch.from_numpy(rng.random((tokens, topk), dtype=np.float32))
                for dtype in ("f32", "bf16"):
                    xin = x if dtype == "f32" else x.bfloat16()
                    ref = reference(xin.float(), ids, w, *deq)
                    y = layer(xin, ids, w).float()
                    cases.append(
                        {
                            "fmt": fmt,
                            "group": group,
                            "experts": experts,
                            "hidden": hidden,
                            "inter": inter,
                            "tokens": tokens,
                            "dtype": dtype,
                            "rel_err": rel(y, ref),
                            "max_err": float((y - ref).abs().max() / ref.abs().max()),
                            "quant_err": quant_err,
                            "e2e_err": rel(y, reference(xin.float(), ids, w, *orig)),
                        }
                    )
    print(json.dumps({"variant": kt_kernel.__cpu_variant__, "cases": cases}))


if __name__ == "__main__":
    main()
