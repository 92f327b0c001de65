"""Run under qemu-x86_64 -cpu MODEL: import, report the variant, and check one
small MoE forward against a numpy reference (no torch: it is slow to emulate)."""

from __future__ import annotations

import json

import kt_kernel
import numpy as np


def main() -> None:
    rng = np.random.default_rng(7)
    e, h, i, t, k = 3, 128, 64, 5, 2
    ws = [rng.standard_normal(s, dtype=np.float32) * 0.05 for s in ((e, i, h), (e, i, h), (e, h, i))]
    q = [kt_kernel.quantize(w, "rawint4", 32) for w in ws]
    g, u, d = (kt_kernel.dequantize(x) for x in q)
    x = rng.standard_normal((t, h), dtype=np.float32)
    ids = np.array([[0, 1], [1, 2], [2, 0], [0, 2], [1, 0]])
    w = rng.random((t, k), dtype=np.float32)
    y = kt_kernel.moe_forward(x, ids, w, *q)
    ref = np.zeros_like(x)
    for ti in range(t):
        for ki in range(k):
            ex = ids[ti, ki]
            a = g[ex] @ x[ti]
            hh = a / (1 + np.exp(-a)) * (u[ex] @ x[ti])
            ref[ti] += w[ti, ki] * (d[ex] @ hh)
    rel = float(np.linalg.norm(y - ref) / np.linalg.norm(ref))
    print(json.dumps({"variant": kt_kernel.__cpu_variant__, "rel_err": rel}))


if __name__ == "__main__":
    main()
