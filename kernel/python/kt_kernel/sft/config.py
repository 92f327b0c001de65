"""KTConfig: how kt_kernel.sft runs a model's experts. Trainers pass it through opaquely."""

from __future__ import annotations

import dataclasses
import difflib
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .._cpu import KTKernelError
from .._quant import FORMATS, GROUP_SIZES

BACKENDS = ("kt", "torch")
PROJECTIONS = ("gate", "up", "down")

#: Older field names (KTransformers / LLaMA-Factory style) -> the current ones. The one table:
#: KTConfig.from_dict warns (DeprecationWarning) and maps each.
LEGACY_NAMES: dict[str, str] = {
    "kt_backend": "backend",
    "expert_backend": "backend",
    "kt_weight_type": "weight_format",
    "weight_type": "weight_format",
    "kt_group_size": "group_size",
    "kt_num_threads": "num_threads",
    "cpu_infer": "num_threads",
    "kt_tp_size": "tp",
    "tp_size": "tp",
    "lora_r": "lora_rank",
    "kt_lora_rank": "lora_rank",
    "kt_lora_alpha": "lora_alpha",
    "lora_target_modules": "lora_targets",
    "kt_use_checkpoint": "checkpointing",
    "use_checkpoint": "checkpointing",
}


class KTConfigError(KTKernelError):
    """A KTConfig field is unknown or out of range; the message names it and the fix."""


@dataclass(frozen=True)
class KTConfig:
    """Expert backend, weight format and LoRA settings for :func:`kt_kernel.sft.wrap_model`.

    backend        "kt": the native CPU kernels (kt_kernel's CPU variant: AMX, AVX-512 or AVX2);
                   "torch": the same quantized weights dequantized, in torch (reference, debugging)
    weight_format  "int8" (per row) or "rawint4" (per group of ``group_size``)
    num_threads    threads for the experts (None: the process's CPU affinity, or KT_KERNEL_NUM_THREADS)
    tp             partitions of the experts' intermediate dimension (each with num_threads / tp threads)
    lora_rank, lora_alpha, lora_targets
                   LoRA on the experts' projections ("gate", "up", "down"); rank 0 trains none
    checkpointing  keep nothing for the backward; recompute the experts' forward in it
    """

    backend: str = "kt"
    weight_format: str = "int8"
    group_size: int = 64
    num_threads: int | None = None
    tp: int = 1
    lora_rank: int = 8
    lora_alpha: float = 16.0
    lora_targets: tuple[str, ...] = PROJECTIONS
    checkpointing: bool = False

    def __post_init__(self) -> None:
        def bad(field: str, why: str) -> KTConfigError:
            return KTConfigError(f"KTConfig.{field}={getattr(self, field)!r}: {why}")

        if self.backend not in BACKENDS:
            raise bad("backend", f"use one of {BACKENDS}")
        if self.weight_format not in FORMATS:
            raise bad("weight_format", f"use one of {FORMATS}")
        if self.weight_format == "rawint4" and self.group_size not in GROUP_SIZES:
            raise bad("group_size", f"RAWINT4 groups are one of {GROUP_SIZES}")
        if self.num_threads is not None and (not isinstance(self.num_threads, int) or self.num_threads < 1):
            raise bad("num_threads", "must be a positive integer or None")
        if not isinstance(self.tp, int) or self.tp < 1:
            raise bad("tp", "must be a positive integer")
        if not isinstance(self.lora_rank, int) or not 0 <= self.lora_rank <= 1024:
            raise bad("lora_rank", "must be an integer in [0, 1024]")
        if self.lora_alpha <= 0:
            raise bad("lora_alpha", "must be positive")
        raw: Any = self.lora_targets  # a single name is accepted too
        targets = (raw,) if isinstance(raw, str) else tuple(raw)
        object.__setattr__(self, "lora_targets", targets)
        unknown = [t for t in targets if t not in PROJECTIONS]
        if unknown:
            raise bad("lora_targets", f"{unknown} are not expert projections; use a subset of {PROJECTIONS}")

    @property
    def lora_scale(self) -> float:
        return self.lora_alpha / self.lora_rank if self.lora_rank else 0.0

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> KTConfig:
        """A KTConfig from a trainer's arguments: older names are mapped (with a DeprecationWarning),
        unknown ones are errors that suggest the closest field."""
        fields = [f.name for f in dataclasses.fields(cls)]
        out: dict[str, Any] = {}
        for key, value in data.items():
            name = key
            if key in LEGACY_NAMES:
                name = LEGACY_NAMES[key]
                warnings.warn(f"KTConfig field {key!r} is deprecated; use {name!r}", DeprecationWarning, stacklevel=2)
            if name not in fields:
                close = difflib.get_close_matches(name, fields + list(LEGACY_NAMES), n=1)
                hint = f"; did you mean {close[0]!r}?" if close else f"; the fields are {fields}"
                raise KTConfigError(f"unknown KTConfig field {key!r}{hint}")
            if name in out:
                raise KTConfigError(f"KTConfig field {name!r} is given twice (once as {key!r})")
            out[name] = value
        return cls(**out)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["lora_targets"] = list(self.lora_targets)
        return d
