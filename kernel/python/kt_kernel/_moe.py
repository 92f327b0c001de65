"""MoE expert forward over quantized weights, dispatched to the chosen CPU variant."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, ClassVar

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

    def _common(self, x: Any, ids: Any, weights: Any) -> tuple[npt.NDArray[Any], int, Any, Any, Any]:
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
        return xa, xcode, torch_dtype, ida, wa

    def _args(self, xa: Any, ida: Any, wa: Any) -> list[Any]:
        return [
            xa,
            ida,
            wa,
            self.gate.q,
            self.gate.scale,
            self.up.q,
            self.up.scale,
            self.down.q,
            self.down.scale,
        ]

    def _shape_args(self, xa: Any, ida: Any, xcode: int, threads: int | None) -> list[Any]:
        return [
            xa.shape[0],
            self.hidden,
            self.inter,
            self.experts,
            ida.shape[1],
            xcode,
            _WFMT[self.gate.format],
            self.gate.group_size,
            threads if threads is not None else _default_threads(),
        ]

    def check_lora(self, lora: LoRA) -> None:
        """Shapes and dtypes of an expert LoRA for this layer (see :class:`LoRA`)."""
        e, h, i, r = self.experts, self.hidden, self.inter, lora.rank
        want = {
            "gate_a": (e, r, h),
            "gate_b": (e, i, r),
            "up_a": (e, r, h),
            "up_b": (e, i, r),
            "down_a": (e, r, i),
            "down_b": (e, h, r),
        }
        for name, shape in want.items():
            arr = getattr(lora, name)
            if arr.shape != shape or arr.dtype != np.float32 or not arr.flags.c_contiguous:
                raise KTKernelError(
                    f"LoRA {name} must be C-contiguous float32 {list(shape)} (experts, rows, cols), "
                    f"got {arr.dtype} {list(arr.shape)}"
                )

    def __call__(
        self, x: Any, ids: Any, weights: Any, *, lora: LoRA | None = None, num_threads: int | None = None
    ) -> Any:
        """``y[t] = sum_k weights[t,k] * down(silu(gate x[t]) * up x[t])`` with experts ``ids[t,k]``
        (each projection with its expert LoRA term when ``lora`` is given)."""
        y, _ = self._forward(x, ids, weights, lora, False, num_threads)
        return y

    def forward_train(
        self,
        x: Any,
        ids: Any,
        weights: Any,
        lora: LoRA | None = None,
        *,
        num_threads: int | None = None,
        out: Saved | None = None,
    ) -> tuple[Any, Saved]:
        """The forward with the expert LoRA (if any) that keeps what :meth:`backward` needs
        (into ``out`` when given: buffers reused across steps, see :meth:`Saved.allocate`)."""
        y, saved = self._forward(x, ids, weights, lora, out or True, num_threads)
        assert saved is not None
        return y, saved

    def _forward(
        self, x: Any, ids: Any, weights: Any, lora: LoRA | None, train: bool | Saved, num_threads: int | None
    ) -> tuple[Any, Saved | None]:
        from . import _VARIANT

        xa, xcode, torch_dtype, ida, wa = self._common(x, ids, weights)
        y = np.empty_like(xa)
        saved = None
        kwargs: dict[str, Any] = {}
        if lora is not None:
            self.check_lora(lora)
            kwargs.update(lora=lora.arrays(), rank=lora.rank, scale=lora.scale)
        if train is not False:
            rows, r = xa.shape[0] * ida.shape[1], lora.rank if lora is not None else 0
            if isinstance(train, Saved):
                if train.gate.shape != (rows, self.inter) or (train.lora.shape if train.lora is not None else None) != (
                    (rows, 3, r) if r else None
                ):
                    raise KTKernelError(f"out does not fit {rows} rows of inter={self.inter}, rank={r}")
                saved = train
            else:
                saved = Saved.allocate(rows, self.inter, r)
            kwargs["saved"] = (saved.gate, saved.up, saved.lora)
        try:
            _VARIANT.moe_forward(*self._args(xa, ida, wa), y, *self._shape_args(xa, ida, xcode, num_threads), **kwargs)
        except ValueError as exc:
            raise KTKernelError(str(exc)) from None
        return _out(y, xcode, torch_dtype), saved

    def backward(
        self,
        x: Any,
        ids: Any,
        weights: Any,
        saved: Saved,
        dy: Any,
        lora: LoRA | None = None,
        *,
        num_threads: int | None = None,
    ) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float32], LoRA | None]:
        """Gradients of ``forward_train``: (dx f32 [tokens, hidden], d weights f32 [tokens, topk],
        the expert LoRA's gradients or None). The quantized weights get none."""
        from . import _VARIANT

        xa, xcode, _, ida, wa = self._common(x, ids, weights)
        dya, dcode, _ = _activations(dy)
        if dya.shape != xa.shape or dcode != xcode:
            raise KTKernelError(f"dy must have x's shape {xa.shape} and dtype; got {dya.shape}")
        rows, r = xa.shape[0] * ida.shape[1], lora.rank if lora is not None else 0
        if saved.gate.shape != (rows, self.inter) or (r and (saved.lora is None or saved.lora.shape != (rows, 3, r))):
            raise KTKernelError("saved does not belong to this forward (shapes differ)")
        dx = np.empty(xa.shape, np.float32)
        dw = np.empty(ida.shape, np.float32)
        grads = None
        kwargs: list[Any] = [None, 0, 0.0, (saved.gate, saved.up, saved.lora)]
        dl: Any = None
        if lora is not None:
            self.check_lora(lora)
            grads = LoRA.of([np.empty_like(a) for a in lora.arrays()], lora.scale)
            kwargs[:3] = [lora.arrays(), lora.rank, lora.scale]
            dl = grads.arrays()
        try:
            _VARIANT.moe_backward(
                *self._args(xa, ida, wa),
                *self._shape_args(xa, ida, xcode, num_threads),
                *kwargs,
                dya,
                dx,
                dw,
                dl,
            )
        except ValueError as exc:
            raise KTKernelError(str(exc)) from None
        return dx, dw, grads


def _out(y: npt.NDArray[Any], xcode: int, torch_dtype: Any) -> Any:
    if torch_dtype is not None:
        import torch

        out = torch.from_numpy(y)
        return out.view(torch.bfloat16) if xcode == _BF16 else out
    return y


@dataclass(frozen=True)
class Saved:
    """What a training forward keeps for its backward, per (token, k) row: the gate and up
    projections (f32 [tokens * topk, inter]) and the LoRA projections A_gate x, A_up x, A_down h
    (f32 [tokens * topk, 3, rank], None without LoRA)."""

    gate: npt.NDArray[np.float32]
    up: npt.NDArray[np.float32]
    lora: npt.NDArray[np.float32] | None

    @property
    def nbytes(self) -> int:
        return int(self.gate.nbytes + self.up.nbytes + (self.lora.nbytes if self.lora is not None else 0))

    @classmethod
    def allocate(cls, rows: int, inter: int, rank: int) -> Saved:
        return cls(
            np.empty((rows, inter), np.float32),
            np.empty((rows, inter), np.float32),
            np.empty((rows, 3, rank), np.float32) if rank else None,
        )

    def view(self, rows: int) -> Saved:
        """The first ``rows`` rows (buffers sized once for the largest batch)."""
        return Saved(self.gate[:rows], self.up[:rows], self.lora[:rows] if self.lora is not None else None)


@dataclass(frozen=True)
class LoRA:
    """LoRA on every expert's gate, up and down projections, f32 C-contiguous:
    gate/up A ``[E, rank, hidden]``, B ``[E, inter, rank]``; down A ``[E, rank, inter]``,
    B ``[E, hidden, rank]``; each projection becomes ``W x + scale * B (A x)``."""

    gate_a: npt.NDArray[np.float32]
    gate_b: npt.NDArray[np.float32]
    up_a: npt.NDArray[np.float32]
    up_b: npt.NDArray[np.float32]
    down_a: npt.NDArray[np.float32]
    down_b: npt.NDArray[np.float32]
    scale: float = 1.0

    NAMES: ClassVar[tuple[str, ...]] = ("gate_a", "gate_b", "up_a", "up_b", "down_a", "down_b")

    @property
    def rank(self) -> int:
        return int(self.gate_a.shape[1])

    @classmethod
    def of(cls, arrays: list[npt.NDArray[np.float32]], scale: float) -> LoRA:
        """From the six arrays in :attr:`NAMES` order."""
        return cls(**dict(zip(cls.NAMES, arrays, strict=True)), scale=scale)

    def arrays(self) -> tuple[npt.NDArray[np.float32], ...]:
        return tuple(getattr(self, n) for n in self.NAMES)


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
