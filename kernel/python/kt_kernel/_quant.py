"""Weight quantizer: fp32 expert weights -> INT8 (per row) or RAWINT4 (per group)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from ._cpu import KTKernelError

Format = Literal["int8", "rawint4"]
FORMATS: tuple[str, ...] = ("int8", "rawint4")
GROUP_SIZES = (32, 64, 128)


@dataclass(frozen=True)
class QuantizedWeights:
    """One projection for all experts: ``experts x rows x cols`` logical fp32 weights.

    int8:    ``q`` int8 [E, rows, cols], ``scale`` f32 [E, rows]
    rawint4: ``q`` uint8 [E, rows, cols // 2], ``scale`` f32 [E, rows, cols // group_size];
             in each 32-element block byte j holds element j (low nibble) and
             element j + 16 (high nibble), signed two's complement.
    """

    format: Format
    q: npt.NDArray[Any]
    scale: npt.NDArray[np.float32]
    cols: int
    group_size: int = 0

    @property
    def experts(self) -> int:
        return int(self.q.shape[0])

    @property
    def rows(self) -> int:
        return int(self.q.shape[1])

    @property
    def nbytes(self) -> int:
        return int(self.q.nbytes + self.scale.nbytes)


def _as_f32(w: Any, what: str) -> npt.NDArray[np.float32]:
    if type(w).__module__.startswith("torch"):
        w = w.detach().to("cpu").float().numpy()
    arr = np.ascontiguousarray(np.asarray(w, dtype=np.float32))
    if arr.ndim != 3:
        raise KTKernelError(f"{what} must be 3-D [experts, rows, cols], got shape {arr.shape}")
    return arr


def quantize(w: Any, fmt: Format = "int8", group_size: int = 64) -> QuantizedWeights:
    """Quantize fp32 weights ``[experts, rows, cols]`` (numpy or torch) to ``fmt``."""
    arr = _as_f32(w, "weights")
    e, r, c = arr.shape
    if c % 64:
        raise KTKernelError(f"cols must be a multiple of 64 (got {c}); pad the weights")
    if fmt == "int8":
        amax = np.abs(arr).max(axis=2)
        scale = (amax / 127.0).astype(np.float32)
        inv = np.divide(1.0, scale, out=np.zeros_like(scale), where=scale > 0)
        q = np.clip(np.rint(arr * inv[..., None]), -127, 127).astype(np.int8)
        return QuantizedWeights("int8", q, scale, c)
    if fmt == "rawint4":
        if group_size not in GROUP_SIZES:
            raise KTKernelError(f"group_size must be one of {GROUP_SIZES}, got {group_size}")
        if c % group_size:
            raise KTKernelError(
                f"cols ({c}) must be a multiple of group_size ({group_size}); choose a group size that divides it"
            )
        g = arr.reshape(e, r, c // group_size, group_size)
        scale = (np.abs(g).max(axis=3) / 7.0).astype(np.float32)
        inv = np.divide(1.0, scale, out=np.zeros_like(scale), where=scale > 0)
        q = np.clip(np.rint(g * inv[..., None]), -8, 7).astype(np.int8).reshape(e, r, c // 32, 2, 16)
        nib = q.astype(np.uint8) & 0x0F
        packed = (nib[..., 0, :] | (nib[..., 1, :] << 4)).astype(np.uint8).reshape(e, r, c // 2)
        return QuantizedWeights("rawint4", packed, scale, c, group_size)
    raise KTKernelError(f"unknown weight format {fmt!r}; use one of {FORMATS}")


def dequantize(qw: QuantizedWeights) -> npt.NDArray[np.float32]:
    """The fp32 weights that ``qw`` represents exactly (the kernels' reference)."""
    e, r, c = qw.experts, qw.rows, qw.cols
    if qw.format == "int8":
        return (qw.q.astype(np.float32) * qw.scale[..., None]).astype(np.float32)
    b = qw.q.reshape(e, r, c // 32, 16)
    lo = (b & 0x0F).astype(np.int8)
    hi = (b >> 4).astype(np.int8)
    vals = np.stack([lo, hi], axis=3).reshape(e, r, c)
    vals = np.where(vals >= 8, vals - 16, vals).astype(np.float32)
    g = vals.reshape(e, r, c // qw.group_size, qw.group_size) * qw.scale[..., None]
    return g.reshape(e, r, c).astype(np.float32)
