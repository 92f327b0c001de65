"""The KTransformers side of `nox -s bench -- --only anchor` (bench/anchor.py): KTransformers' kt-kernel
0.7.2 CPU MoE, driven in its own venv (lockfiles/anchor.txt), one process per CPU variant and thread count.

Standalone on purpose (numpy, torch and KTransformers' kt_kernel only): it runs under the anchor venv's
Python, which has none of this project's packages. It speaks JSON lines on stdin/stdout with
bench/anchor.py; see `Worker` there for the protocol. The layer is built the way KTransformers' own
wrappers build it (kt_kernel.utils.amx: MOEConfig, the backend its runtime selection picks for the
format, load_weights_task on its CPUInfer), and driven with the extension's forward_task on plain CPU
buffers: the wrappers' forward() needs CUDA-pinned buffers, and this host has no CUDA driver.

Weights: the same fp32 weights as ours (one seed, numpy's PCG64 stream), quantized here to
KTransformers' layouts: RAWINT4 (signed 4-bit, offset by 8, eight values per little-endian uint32,
bf16 scales per k-group) and, for the 8-bit pair, INT8 (AMXInt8_MOE's own online quantization from bf16)
where the variant has it, else FP8 E4M3 with 128x128 block scales (AVX2FP8_MOE): one byte per weight,
the nearest 8-bit format it has.
"""

from __future__ import annotations

import hashlib
import importlib
import itertools
import json
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

if not __package__:  # run as a script under the anchor venv: bench/timing.py (stdlib only) beside it
    sys.path.insert(0, str(Path(__file__).resolve().parent))
median_seconds: Callable[..., float] = importlib.import_module(
    f"{__package__}.timing" if __package__ else "timing"
).median_seconds


def weights(seed: int, experts: int, hidden: int, inter: int) -> list[np.ndarray]:
    """gate, up [E, inter, hidden] and down [E, hidden, inter], fp32, exactly as bench/anchor.py makes them."""
    rng = np.random.default_rng(seed)
    shapes = ((inter, hidden), (inter, hidden), (hidden, inter))
    return [rng.standard_normal((experts, r, c), dtype=np.float32) * np.float32(0.02) for r, c in shapes]


def digest(ws: list[np.ndarray]) -> str:
    h = hashlib.sha256()
    for w in ws:
        h.update(w.tobytes())
    return h.hexdigest()


def rawint4(w: np.ndarray, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """KTransformers' RAWINT4: uint8 [E, n, k/2] (element 2j in the low nibble of byte j, value + 8) and
    bf16 scales [E, n, k/group] (absmax / 7)."""
    e, n, k = w.shape
    g = w.reshape(e, n, k // group, group)
    scale = np.abs(g).max(axis=3) / np.float32(7.0)
    inv = np.divide(1.0, scale, out=np.zeros_like(scale), where=scale > 0)
    q = (np.clip(np.rint(g * inv[..., None]), -8, 7).astype(np.int16) + 8).astype(np.uint8).reshape(e, n, k)
    packed = (q[..., 0::2] | (q[..., 1::2] << 4)).astype(np.uint8)
    return torch.from_numpy(np.ascontiguousarray(packed)), torch.from_numpy(scale).to(torch.bfloat16).contiguous()


def fp8(w: np.ndarray, block: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    """FP8 E4M3 weights [E, n, k] and fp32 block scales [E, n/block, k/block] (absmax / 448)."""
    t = torch.from_numpy(w)
    e, n, k = t.shape
    b = t.reshape(e, n // block, block, k // block, block)
    scale = b.abs().amax(dim=(2, 4)).clamp_min(1e-12) / 448.0
    q = (b / scale[:, :, None, :, None]).reshape(e, n, k).to(torch.float8_e4m3fn)
    return q.contiguous(), scale.float().contiguous()


class Layer:
    """One KTransformers MoE layer of one format, on this process's CPUInfer."""

    def __init__(self, ext: Any, cpu: Any, fmt: str, ws: list[np.ndarray], topk: int, max_len: int) -> None:
        kt_amx = importlib.import_module("kt_kernel.utils.amx")  # KTransformers' module: its backend selection

        experts, inter, hidden = ws[0].shape
        self.cpu, self.topk, self.hidden = cpu, topk, hidden
        self.mask = torch.zeros(experts, dtype=torch.bool)  # no expert on a GPU
        self.map = torch.arange(experts, dtype=torch.int64)
        config = ext.moe.MOEConfig(experts, topk, hidden, inter, self.mask.data_ptr())
        config.layer_idx = 0
        config.pool = cpu.backend_
        config.max_len = max_len
        self.keep: list[Any] = []
        if fmt == "rawint4":
            group = 32  # Kimi's native group, KTransformers' RAWINT4
            packed = [rawint4(w, group) for w in ws]
            self._per_expert(config, packed)
            config.quant_config.bits, config.quant_config.group_size, config.quant_config.zero_point = 4, group, False
            cls = kt_amx._select_rawint4_backend(group)
            self.format = f"RAWINT4 group {group} ({cls.__name__})"
        elif getattr(ext.moe, "AMXInt8_MOE", None) is not None:
            bf = [torch.from_numpy(w).to(torch.bfloat16).contiguous() for w in ws]
            self.keep += bf
            config.gate_proj, config.up_proj, config.down_proj = (t.data_ptr() for t in bf)
            config.save, config.load = True, False
            self.tmp = tempfile.TemporaryDirectory(prefix="kt-anchor-int8-")
            config.path = self.tmp.name
            cls = ext.moe.AMXInt8_MOE
            self.format = "INT8 per channel (AMXInt8_MOE, its own quantization from bf16)"
        else:
            packed = [fp8(w) for w in ws]
            self._per_expert(config, packed)
            config.quant_config.bits, config.quant_config.group_size, config.quant_config.zero_point = 8, 128, False
            cls = ext.moe.AMXFP8_MOE if getattr(kt_amx, "_HAS_FP8_SUPPORT", False) else ext.moe.AVX2FP8_MOE
            self.format = f"FP8 E4M3, 128x128 block scales ({cls.__name__}): its nearest 8-bit format here"
        self.moe = cls(config)
        cpu.submit(self.moe.load_weights_task(self.map.data_ptr()))
        cpu.sync()

    def _per_expert(self, config: Any, packed: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        self.keep += [t for pair in packed for t in pair]
        (gq, gs), (uq, us), (dq, ds) = packed
        config.gate_projs = [[t.data_ptr() for t in gq]]
        config.up_projs = [[t.data_ptr() for t in uq]]
        config.down_projs = [[t.data_ptr() for t in dq]]
        config.gate_scales = [[t.data_ptr() for t in gs]]
        config.up_scales = [[t.data_ptr() for t in us]]
        config.down_scales = [[t.data_ptr() for t in ds]]

    def __call__(self, x: torch.Tensor, ids: torch.Tensor, w: torch.Tensor, out: torch.Tensor) -> None:
        bsz = torch.tensor([x.shape[0]], dtype=torch.int32)
        task = self.moe.forward_task(
            bsz.data_ptr(), self.topk, ids.data_ptr(), w.data_ptr(), x.data_ptr(), out.data_ptr(), False
        )
        self.cpu.submit(task)
        self.cpu.sync()


def inputs(seed: int, tokens: int, experts: int, hidden: int, topk: int, routings: int) -> Any:
    """x (bf16), routings (int64) and routing weights (fp32), exactly as bench/anchor.py makes them."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((tokens, hidden), dtype=np.float32)
    w = rng.random((tokens, topk), dtype=np.float32)
    routes = [np.stack([rng.permutation(experts)[:topk] for _ in range(tokens)]) for _ in range(routings)]
    return (
        torch.from_numpy(x).to(torch.bfloat16),
        [torch.from_numpy(r).contiguous() for r in routes],
        torch.from_numpy(w),
    )


def main() -> int:
    # Replies go to the original stdout; everything else written to fd 1 (KTransformers' C++ logs its
    # loads with printf) goes to stderr, so the JSON lines stay whole.
    replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    import kt_kernel
    from kt_kernel import kt_kernel_ext as ext

    threads = int(sys.argv[1])
    cfg = ext.WorkerPoolConfig()
    cfg.subpool_count, cfg.subpool_numa_map, cfg.subpool_thread_count = 1, [0], [threads]
    cpu = ext.CPUInfer(cfg)
    layers: dict[str, Layer] = {}
    ws: list[np.ndarray] = []
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "load":
            ws = weights(cmd["seed"], cmd["experts"], cmd["hidden"], cmd["inter"])
            reply: dict[str, Any] = {
                "digest": digest(ws),
                "variant": kt_kernel.__cpu_variant__,
                "version": getattr(kt_kernel, "__version__", None),
                "formats": {},
            }
            for fmt in cmd["formats"]:
                layers[fmt] = Layer(ext, cpu, fmt, ws, cmd["topk"], cmd["max_len"])
                reply["formats"][fmt] = layers[fmt].format
            ws = []
        elif cmd["op"] in ("time", "output"):
            layer = layers[cmd["fmt"]]
            x, routes, w = inputs(cmd["seed"], cmd["tokens"], cmd["experts"], layer.hidden, layer.topk, cmd["routings"])
            out = torch.empty_like(x)
            if cmd["op"] == "output":
                layer(x, routes[0], w, out)
                reply = {"y": out.float().numpy().ravel().tolist()}
            else:
                turn = itertools.cycle(routes)

                def call(layer: Layer = layer, x: Any = x, turn: Any = turn, w: Any = w, out: Any = out) -> None:
                    layer(x, next(turn), w, out)

                reply = {"s": median_seconds(call, min_reps=5, min_time=cmd["min_time"])}
        else:
            reply = {"error": f"unknown op {cmd['op']!r}"}
        print(json.dumps(reply), file=replies, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
