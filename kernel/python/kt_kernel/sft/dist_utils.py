"""Tensor parallelism on the CPU: the experts' intermediate dimension split into N partitions,
each run by its own thread pool (e.g. one per NUMA node), partial results reduced.

Splitting is exact: gate/up keep whole rows (with their scales), down keeps whole columns (its
INT8 scales are per row, its RAWINT4 groups lie within a partition), so every partition holds the
very values of the unsplit weights. LoRA A of gate/up and B of down are replicated (their gradients
are summed); B of gate/up and A of down are split like the weights (gradients concatenated).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import numpy as np

from .._moe import LoRA
from .._quant import QuantizedWeights

T = TypeVar("T")
_EXECUTORS: dict[int, ThreadPoolExecutor] = {}


def bounds(inter: int, n: int) -> list[tuple[int, int]]:
    """[start, end) of each of `n` equal partitions of the intermediate dimension."""
    step = inter // n
    return [(i * step, (i + 1) * step) for i in range(n)]


def split_rows(qw: QuantizedWeights, b: list[tuple[int, int]]) -> list[QuantizedWeights]:
    """gate/up [E, inter, hidden]: whole rows per partition."""
    return [
        QuantizedWeights(qw.format, qw.q[:, r0:r1].copy(), qw.scale[:, r0:r1].copy(), qw.cols, qw.group_size)
        for r0, r1 in b
    ]


def split_cols(qw: QuantizedWeights, b: list[tuple[int, int]]) -> list[QuantizedWeights]:
    """down [E, hidden, inter]: whole columns (and RAWINT4 groups) per partition."""
    out = []
    for c0, c1 in b:
        if qw.format == "int8":
            out.append(QuantizedWeights("int8", qw.q[:, :, c0:c1].copy(), qw.scale.copy(), c1 - c0))
        else:
            g = qw.group_size
            q = qw.q[:, :, c0 // 2 : c1 // 2].copy()
            out.append(QuantizedWeights("rawint4", q, qw.scale[:, :, c0 // g : c1 // g].copy(), c1 - c0, g))
    return out


def shard_lora(lora: LoRA, b: list[tuple[int, int]]) -> list[LoRA]:
    """Each partition's view of an expert LoRA (replicated A of gate/up and B of down; the rest split)."""
    if len(b) == 1:
        return [lora]
    return [
        LoRA(
            lora.gate_a,
            np.ascontiguousarray(lora.gate_b[:, i0:i1]),
            lora.up_a,
            np.ascontiguousarray(lora.up_b[:, i0:i1]),
            np.ascontiguousarray(lora.down_a[:, :, i0:i1]),
            lora.down_b,
            scale=lora.scale,
        )
        for i0, i1 in b
    ]


def gather_lora(grads: list[LoRA]) -> LoRA:
    """The unsplit LoRA gradient from the partitions': replicated tensors summed, split ones joined."""
    if len(grads) == 1:
        return grads[0]
    first = grads[0]
    return LoRA(
        np.sum([g.gate_a for g in grads], axis=0, dtype=np.float32),
        np.concatenate([g.gate_b for g in grads], axis=1),
        np.sum([g.up_a for g in grads], axis=0, dtype=np.float32),
        np.concatenate([g.up_b for g in grads], axis=1),
        np.concatenate([g.down_a for g in grads], axis=2),
        np.sum([g.down_b for g in grads], axis=0, dtype=np.float32),
        scale=first.scale,
    )


def run_partitions(fns: list[Callable[[], T]]) -> list[T]:
    """Run one callable per partition concurrently (the native calls release the GIL; each calling
    thread has its own native worker pool), in a persistent executor so those pools are reused."""
    if len(fns) == 1:
        return [fns[0]()]
    ex = _EXECUTORS.get(len(fns))
    if ex is None:
        ex = _EXECUTORS[len(fns)] = ThreadPoolExecutor(len(fns), thread_name_prefix="kt-tp")
    futures = [ex.submit(f) for f in fns]
    return [f.result() for f in futures]


def reduce_sum(parts: list[Any]) -> Any:
    """Sum of partial outputs, in fp32."""
    acc = parts[0].float() if hasattr(parts[0], "float") else parts[0].astype(np.float32)
    for p in parts[1:]:
        acc = acc + (p.float() if hasattr(p, "float") else p)
    return acc
