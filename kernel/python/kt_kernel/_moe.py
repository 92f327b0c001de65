"""MoE expert forward over quantized weights, dispatched to the chosen CPU variant."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import numpy.typing as npt

from ._cpu import KTKernelError
from ._quant import QuantizedWeights

_F32, _BF16 = 0, 1
_WFMT = {"int8": 0, "rawint4": 1}
THREADS_ENV = "KT_KERNEL_NUM_THREADS"


def _default_threads() -> int:
    env = os.environ.get(THREADS_ENV)
    if env:
        try:
            n = int(env)
        except ValueError:
            raise KTKernelError(f"{THREADS_ENV}={env!r} is not an integer") from None
        if n < 1:
            raise KTKernelError(f"{THREADS_ENV}={env!r} must be >= 1")
        return n
    return len(os.sched_getaffinity(0))


def _is_torch(x: Any) -> bool:
    return type(x).__module__.startswith("torch")


def _activations(x: Any) -> tuple[npt.NDArray[Any], int, Any]:
    """(contiguous array, dtype code, torch dtype or None) for x: f32 or bf16, [T, H]."""
    if _is_torch(x):
        import torch

        if x.device.type != "cpu":
            raise KTKernelError(f"x is on {x.device}; the CPU kernels take CPU tensors")
        t = x.detach().contiguous()
        if t.dtype == torch.bfloat16:
            return t.view(torch.int16).numpy().view(np.uint16), _BF16, torch.bfloat16
        if t.dtype == torch.float32:
            return t.numpy(), _F32, torch.float32
        raise KTKernelError(f"x dtype {t.dtype} is not supported; use torch.float32 or torch.bfloat16")
    arr = np.asarray(x)
    if arr.dtype.name == "bfloat16":  # ml_dtypes
        return np.ascontiguousarray(arr).view(np.uint16), _BF16, None
    if arr.dtype != np.float32:
        raise KTKernelError(f"x dtype {arr.dtype} is not supported; use float32 or bfloat16")
    return np.ascontiguousarray(arr), _F32, None


def _plain(x: Any, dtype: Any) -> npt.NDArray[Any]:
    if _is_torch(x):
        x = x.detach().to("cpu").numpy()
    return np.ascontiguousarray(np.asarray(x), dtype=dtype)


class MoE:
    """A MoE layer's experts: gate/up ``[E, inter, hidden]``, down ``[E, hidden, inter]``."""

    def __init__(self, gate: QuantizedWeights, up: QuantizedWeights, down: QuantizedWeights) -> None:
        if not (gate.format == up.format == down.format):
            raise KTKernelError(f"gate/up/down formats differ: {gate.format}, {up.format}, {down.format}")
        if not (gate.group_size == up.group_size == down.group_size):
            raise KTKernelError("gate/up/down group sizes differ; quantize them with one group_size")
        if gate.q.shape != up.q.shape:
            raise KTKernelError(f"gate {gate.q.shape} and up {up.q.shape} shapes differ")
        e, inter, hidden = gate.experts, gate.rows, gate.cols
        if (down.experts, down.rows, down.cols) != (e, hidden, inter):
            raise KTKernelError(
                f"down must be [experts={e}, hidden={hidden}, inter={inter}], "
                f"got [{down.experts}, {down.rows}, {down.cols}]"
            )
        self.gate, self.up, self.down = gate, up, down
        self.experts, self.hidden, self.inter = e, hidden, inter

    def __call__(self, x: Any, ids: Any, weights: Any, *, num_threads: int | None = None) -> Any:
        """``y[t] = sum_k weights[t,k] * down(silu(gate x[t]) * up x[t])`` with experts ``ids[t,k]``."""
        from . import _VARIANT

        xa, xcode, torch_dtype = _activations(x)
        if xa.ndim != 2 or xa.shape[1] != self.hidden:
            raise KTKernelError(f"x must be [tokens, hidden={self.hidden}], got {tuple(xa.shape)}")
        ida = _plain(ids, np.int64)
        wa = _plain(weights, np.float32)
        tokens = xa.shape[0]
        if ida.ndim != 2 or ida.shape[0] != tokens:
            raise KTKernelError(f"ids must be [tokens={tokens}, topk], got {ida.shape}")
        if wa.shape != ida.shape:
            raise KTKernelError(f"weights {wa.shape} must match ids {ida.shape}")
        y = np.empty_like(xa)
        threads = num_threads if num_threads is not None else _default_threads()
        try:
            _VARIANT.moe_forward(
                xa,
                ida,
                wa,
                self.gate.q,
                self.gate.scale,
                self.up.q,
                self.up.scale,
                self.down.q,
                self.down.scale,
                y,
                tokens,
                self.hidden,
                self.inter,
                self.experts,
                ida.shape[1],
                xcode,
                _WFMT[self.gate.format],
                self.gate.group_size,
                threads,
            )
        except ValueError as exc:
            raise KTKernelError(str(exc)) from None
        if torch_dtype is not None:
            import torch

            out = torch.from_numpy(y)
            return out.view(torch.bfloat16) if xcode == _BF16 else out
        return y


def moe_forward(
    x: Any,
    ids: Any,
    weights: Any,
    gate: QuantizedWeights,
    up: QuantizedWeights,
    down: QuantizedWeights,
    *,
    num_threads: int | None = None,
) -> Any:
    """Functional form of :class:`MoE`."""
    return MoE(gate, up, down)(x, ids, weights, num_threads=num_threads)
