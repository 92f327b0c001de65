"""kt_kernel: CPU Mixture-of-Experts kernels with runtime ISA dispatch.

Import order matters: only the baseline ``_core`` extension and pure Python run
before the CPU check, so a CPU that can run no variant gets an ImportError that
names the missing features instead of "Illegal instruction".
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import _core
from ._cpu import VARIANT_ENV, CpuState, CpuVariantError, Decision, KTKernelError, Ladder, choose, render_report
from ._version import __version__

_HERE = Path(__file__).resolve().parent


def _probe() -> CpuState:
    info = _core.detect_cpu()
    cpuid = dict(info["cpuid"])
    permitted: bool | None = None
    err = 0
    if info["os_amx"] and cpuid.get("AMX_TILE"):
        err = _core.request_amx_permission()
        permitted = err == 0
    return CpuState(
        cpuid=cpuid,
        os_avx=info["os_avx"],
        os_avx512=info["os_avx512"],
        os_amx=info["os_amx"],
        amx_permitted=permitted,
        amx_errno=err,
        vendor=info["vendor"],
        brand=info["brand"],
    )


def _read_manifest() -> dict[str, Any]:
    path = _HERE / "_build.json"
    try:
        data: dict[str, Any] = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ImportError(f"{path}: the build manifest is missing or corrupt ({exc}); reinstall kt-kernel") from exc
    return data


_LADDER = Ladder.load()
_MANIFEST = _read_manifest()
_STATE = _probe()


def _decide() -> tuple[Decision, CpuVariantError | None]:
    """The variant for this process. A KT_KERNEL_CPU_VARIANT this CPU cannot run fails the import,
    except under kt-doctor, which must start to report it (and runs the automatic choice)."""
    override = os.environ.get(VARIANT_ENV) or None
    try:
        return choose(_LADDER, _STATE, override, _MANIFEST["variants"]), None
    except CpuVariantError as exc:
        if override is None or Path(sys.argv[0]).name not in ("kt-doctor", "doctor.py"):
            raise
        return choose(_LADDER, _STATE, None, _MANIFEST["variants"]), exc


_DECISION, _OVERRIDE_ERROR = _decide()
_VARIANT = _core.Variant(str(_HERE.parent / _MANIFEST["variants"][_DECISION.chosen]["file"]))

#: The CPU variant this process runs (e.g. "avx2", "avx512_vnni").
__cpu_variant__: str = _DECISION.chosen


@dataclass(frozen=True)
class CpuReport:
    """Detected features, and each variant with why it is or is not usable."""

    state: CpuState
    decision: Decision

    def __str__(self) -> str:
        return render_report(self.state, self.decision, _LADDER)

    def as_dict(self) -> dict[str, Any]:
        return {
            "vendor": self.state.vendor,
            "brand": self.state.brand,
            "cpuid": dict(self.state.cpuid),
            "os": {"avx": self.state.os_avx, "avx512": self.state.os_avx512, "amx": self.state.os_amx},
            "amx_permitted": self.state.amx_permitted,
            "selected": self.decision.chosen,
            "overridden": self.decision.overridden,
            "variants": {s.name: {"usable": s.usable, "why": s.describe()} for s in self.decision.statuses},
        }


def cpu_report() -> CpuReport:
    """What kt_kernel detected and decided; ``print()`` it, or ``.as_dict()``."""
    return CpuReport(_STATE, _DECISION)


def build_manifest() -> dict[str, Any]:
    """The wheel's build manifest (kt_kernel/_build.json), as a copy."""
    copy: dict[str, Any] = json.loads(json.dumps(_MANIFEST))
    return copy


# numpy and the kernels' Python API load only after the CPU check passed.
from ._moe import LoRA, MoE, Saved, moe_forward  # noqa: E402
from ._quant import QuantizedWeights, dequantize, quantize  # noqa: E402

__all__ = [
    "VARIANT_ENV",
    "CpuReport",
    "CpuVariantError",
    "KTKernelError",
    "LoRA",
    "MoE",
    "QuantizedWeights",
    "Saved",
    "__cpu_variant__",
    "__version__",
    "build_manifest",
    "cpu_report",
    "dequantize",
    "moe_forward",
    "quantize",
]


def __getattr__(name: str) -> Any:
    # kt_kernel.sft (fine-tuning, needs torch) loads on first use: inference never imports it.
    if name == "sft":
        import importlib

        return importlib.import_module(".sft", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
