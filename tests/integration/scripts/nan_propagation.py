"""Run inside a fresh venv: NaN and infinity in the activations propagate as in torch (the token's
output row is NaN), and leave every other token's output exactly as without them. The variant is
kt_kernel's choice (KT_KERNEL_CPU_VARIANT) or a test-only emulated library (KT_TEST_VARIANT_LIBRARY).
Prints one JSON line per format x dtype."""

from __future__ import annotations

import json
import os

import kt_kernel
import numpy as np
import torch

if os.environ.get("KT_TEST_VARIANT_LIBRARY"):
    kt_kernel._VARIANT = kt_kernel._core.Variant(os.environ["KT_TEST_VARIANT_LIBRARY"])
    kt_kernel.__cpu_variant__ = kt_kernel._VARIANT.name + "-emulated"

HIDDEN, INTER, E, TOPK, T = 256, 128, 5, 2, 6
rng = np.random.default_rng(7)
SHAPES = ((E, INTER, HIDDEN), (E, INTER, HIDDEN), (E, HIDDEN, INTER))  # gate, up, down
weights = [rng.standard_normal(shape, dtype=np.float32) * 0.05 for shape in SHAPES]
x = torch.from_numpy(rng.standard_normal((T, HIDDEN), dtype=np.float32))
ids = torch.from_numpy(np.stack([rng.permutation(E)[:TOPK] for _ in range(T)]))
w = torch.from_numpy(rng.random((T, TOPK), dtype=np.float32))
bad = x.clone()
bad[1, 7] = float("nan")
bad[3, 0] = float("inf")
out = []
for fmt in ("int8", "rawint4"):
    layer = kt_kernel.MoE(*(kt_kernel.quantize(m, fmt, 64) for m in weights))
    for dtype in (torch.float32, torch.bfloat16):
        clean = layer(x.to(dtype), ids, w).float()
        y = layer(bad.to(dtype), ids, w).float()
        out.append(
            {
                "variant": kt_kernel.__cpu_variant__,
                "fmt": fmt,
                "dtype": str(dtype),
                "nan_rows": [t for t in range(T) if bool(torch.isnan(y[t]).all())],
                "finite_rows": [t for t in range(T) if bool(torch.isfinite(y[t]).all())],
                "others_unchanged": bool(torch.equal(y[[0, 2, 4, 5]], clean[[0, 2, 4, 5]])),
            }
        )
print(json.dumps(out))
