"""Run inside a fresh venv of another CPython (verify.interpreters): the release's kt-kernel runs a MoE
forward that must equal an independent numpy reference, and the installed sglang-kt is this Python's own
wheel. Prints one JSON line. Standard library, numpy and the installed release only."""

from __future__ import annotations

import json
import sys
from importlib.metadata import distribution

import kt_kernel
import numpy as np

rng = np.random.default_rng(7)
E, H, INTER, T, K = 8, 256, 128, 5, 2
q = [
    kt_kernel.quantize(rng.standard_normal((E, r, c), dtype=np.float32) * 0.05, "int8")
    for r, c in ((INTER, H), (INTER, H), (H, INTER))
]
x = rng.standard_normal((T, H), dtype=np.float32)
ids = np.stack([rng.permutation(E)[:K] for _ in range(T)])
w = rng.random((T, K), dtype=np.float32)
y = np.asarray(kt_kernel.MoE(*q)(x, ids, w), dtype=np.float64)


def weights(qw: kt_kernel.QuantizedWeights) -> np.ndarray:
    # INT8 layout (kt_cpu_api.h): q int8 [E, rows, cols] times a per-row f32 scale; not kt_kernel.dequantize
    return qw.q.astype(np.float64) * qw.scale.astype(np.float64)[:, :, None]


gate, up, down = (weights(p) for p in q)
ref = np.zeros((T, H))
for t in range(T):
    for k in range(K):
        e = ids[t, k]
        g, u = gate[e] @ x[t], up[e] @ x[t]
        ref[t] += w[t, k] * (down[e] @ (g / (1 + np.exp(-g)) * u))
err = float(np.abs(y - ref).max() / np.abs(ref).max())
wheel = distribution("sglang-kt").read_text("WHEEL") or ""
tags = [ln.split(": ", 1)[1] for ln in wheel.splitlines() if ln.startswith("Tag: ")]
print(
    json.dumps(
        {
            "python": f"{sys.version_info.major}.{sys.version_info.minor}.{sys.version_info.micro}",
            "variant": kt_kernel.__cpu_variant__,
            "moe_max_rel_error": err,
            "sglang_kt_tags": tags,
        }
    )
)
