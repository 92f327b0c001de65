"""Each token's output alone against the same token inside a batch of 23, per format and group size,
bit for bit. Run in a venv with the kt-kernel wheel: kt_kernel's choice of variant, or a test-only
emulated library (KT_TEST_VARIANT_LIBRARY). Prints one JSON object: {"variant": ..., "fmt/group": bool}."""

from __future__ import annotations

import json
import os
from typing import Literal

import kt_kernel as kk
import numpy as np

if os.environ.get("KT_TEST_VARIANT_LIBRARY"):
    kk._VARIANT = kk._core.Variant(os.environ["KT_TEST_VARIANT_LIBRARY"])
    kk.__cpu_variant__ = kk._VARIANT.name + "-emulated"
rng = np.random.default_rng(0)
out: dict[str, object] = {"variant": kk.__cpu_variant__}
FORMATS: list[tuple[Literal["int8", "rawint4"], int]] = [
    ("int8", 64),
    ("rawint4", 32),
    ("rawint4", 64),
    ("rawint4", 128),
]
for fmt, g in FORMATS:
    q = [kk.quantize(rng.standard_normal(s, dtype=np.float32) * 0.05, fmt, g) for s in ((4, 128, 256),) * 2]
    q.append(kk.quantize(rng.standard_normal((4, 256, 128), dtype=np.float32) * 0.05, fmt, g))
    m = kk.MoE(*q)
    # 23 tokens over 4 experts, top-2, routed so that the experts get 4, 6, 13 and 23 pairs: a batch runs
    # every pair block (4, and after them a rest of 3, 2 or 1 pairs in one pass) and AMX tiles (from 6
    # pairs, two tiles at 23), which a token alone never does.
    x = rng.standard_normal((23, 256), dtype=np.float32)
    others = rng.permutation([0] * 4 + [1] * 6 + [2] * 13)
    ids = np.stack([rng.permutation([3, o]) for o in others])
    assert np.bincount(ids.ravel(), minlength=4).tolist() == [4, 6, 13, 23]
    w = rng.random((23, 2), dtype=np.float32)
    full = m(x, ids, w)
    alone = np.concatenate([m(x[i : i + 1], ids[i : i + 1], w[i : i + 1]) for i in range(23)])
    out[f"{fmt}/{g}"] = bool(np.array_equal(full, alone))
print(json.dumps(out))
