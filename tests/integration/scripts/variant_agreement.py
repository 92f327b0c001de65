"""The sha256 of each CPU variant library's outputs on one fixed problem, per format and group size. Run
in a venv with the kt-kernel wheel; the libraries are the arguments (native ones from the wheel, or
test-only emulated builds), each loaded by kt_kernel's own loader (_core.Variant). 23 tokens over 4
experts, top-2, so the blocked paths (4 and 2 pairs per pass, AMX tiles) run beside single pairs; INT8
once more with an expert LoRA.
Prints one JSON object: {library path: {"fmt/group": sha256}}."""

from __future__ import annotations

import hashlib
import json
import sys
from typing import Any, Literal

import kt_kernel as kk
import numpy as np

FORMATS: list[tuple[Literal["int8", "rawint4"], int]] = [("int8", 64), ("rawint4", 32), ("rawint4", 128)]
rng = np.random.default_rng(7)
problems: list[tuple[str, Any, Any, Any, Any, kk.LoRA | None]] = []
for fmt, g in FORMATS:
    q = [kk.quantize(rng.standard_normal(s, dtype=np.float32) * 0.05, fmt, g) for s in ((4, 128, 256),) * 2]
    q.append(kk.quantize(rng.standard_normal((4, 256, 128), dtype=np.float32) * 0.05, fmt, g))
    x = rng.standard_normal((23, 256), dtype=np.float32)
    ids = np.stack([rng.permutation(4)[:2] for _ in range(23)])
    w = rng.random((23, 2), dtype=np.float32)
    problems.append((f"{fmt}/{g}", kk.MoE(*q), x, ids, w, None))
# With an expert LoRA the down projection's A reads h in fp32 before it is quantized, so the outputs
# depend on every bit of silu (without it, an ulp of h rarely moves its int8 rounding).
shapes = ((4, 4, 256), (4, 128, 4), (4, 4, 256), (4, 128, 4), (4, 4, 128), (4, 256, 4))
lora = kk.LoRA.of([rng.standard_normal(s, dtype=np.float32) * 0.05 for s in shapes], 1.0)
problems.append(("int8/64+lora", *problems[0][1:5], lora))

out: dict[str, dict[str, str]] = {}
for lib in sys.argv[1:]:
    kk._VARIANT = kk._core.Variant(lib)
    digests = {}
    for name, m, x, ids, w, lo in problems:
        digests[name] = hashlib.sha256(np.asarray(m(x, ids, w, lora=lo)).tobytes()).hexdigest()
    out[lib] = digests
print(json.dumps(out))
