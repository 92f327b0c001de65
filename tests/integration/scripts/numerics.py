"""Run inside a fresh venv: kt_kernel against a torch fp32 reference.

Prints one JSON line: {"variant": ..., "cases": [{"fmt", "group", "experts",
"tokens", "dtype", "rel_err", "max_err"}...]}. The reference is torch fp32 on the
*dequantized* weights, so the error measured is the kernel's alone.
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


def reference(x: torch.Tensor, ids: torch.Tensor, w: torch.Tensor, gate: torch.Tensor, up: torch.Tensor,
              down: torch.Tensor) -> torch.Tensor:  # fmt: skip
    y = torch.zeros_like(x)
    for e in torch.unique(ids).tolist():
        tok, k = (ids == e).nonzero(as_tuple=True)
        xe = x[tok]
        h = torch.nn.functional.silu(xe @ gate[e].T) * (xe @ up[e].T)
        y.index_add_(0, tok, (h @ down[e].T) * w[tok, k, None])
    return y


def main() -> None:
    formats: list[tuple[Literal["int8", "rawint4"], int]] = [
        ("int8", 0), ("rawint4", 32), ("rawint4", 64), ("rawint4", 128),
    ]  # fmt: skip
    if len(sys.argv) > 1 and sys.argv[1] == "--quick":
        formats = [("int8", 0), ("rawint4", 64)]
    rng = np.random.default_rng(1234)
    cases = []
    for fmt, group in formats:
        for experts in EXPERTS:
            wg = rng.standard_normal((experts, INTER, HIDDEN), dtype=np.float32) * 0.05
            wu = rng.standard_normal((experts, INTER, HIDDEN), dtype=np.float32) * 0.05
            wd = rng.standard_normal((experts, HIDDEN, INTER), dtype=np.float32) * 0.05
            q = [kt_kernel.quantize(w, fmt, group or 64) for w in (wg, wu, wd)]
            deq = [torch.from_numpy(kt_kernel.dequantize(qq)) for qq in q]
            layer = kt_kernel.MoE(*q)
            topk = min(experts, 4)
            for tokens in TOKENS:
                x = torch.from_numpy(rng.standard_normal((tokens, HIDDEN), dtype=np.float32))
                ids = torch.from_numpy(np.stack([rng.permutation(experts)[:topk] for _ in range(tokens)]))
                w = torch.from_numpy(rng.random((tokens, topk), dtype=np.float32))
                for dtype in ("f32", "bf16"):
                    xin = x if dtype == "f32" else x.bfloat16()
                    ref = reference(xin.float(), ids, w, *deq)
                    y = layer(xin, ids, w).float()
                    rel = float((y - ref).norm() / ref.norm())
                    cases.append({"fmt": fmt, "group": group, "experts": experts, "tokens": tokens,
                                  "dtype": dtype, "rel_err": rel,
                                  "max_err": float((y - ref).abs().max())})  # fmt: skip
    print(json.dumps({"variant": kt_kernel.__cpu_variant__, "cases": cases}))


if __name__ == "__main__":
    main()
