"""Expert weights out of a Hugging Face MoE block, quantized with kt_kernel's quantizer."""

from __future__ import annotations

from typing import Any, cast

import torch

from .._cpu import KTKernelError
from .._quant import Format, QuantizedWeights, quantize
from .arch import MoEArch
from .config import KTConfig


def expert_weights(experts: Any, arch: MoEArch, where: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """fp32 (gate [E, inter, hidden], up [E, inter, hidden], down [E, hidden, inter]) of one block."""
    gu_name, down_name = arch.fused
    if hasattr(experts, gu_name) and hasattr(experts, down_name):
        gu = getattr(experts, gu_name).detach().float()
        down = getattr(experts, down_name).detach().float()
        if gu.ndim != 3 or gu.shape[1] % 2:
            raise KTKernelError(f"{where}.{gu_name}: expected [experts, 2 * inter, hidden], got {list(gu.shape)}")
        inter = gu.shape[1] // 2
        return gu[:, :inter], gu[:, inter:], down
    if isinstance(experts, torch.nn.ModuleList):
        try:
            stacked = [
                torch.stack([getattr(m, name).weight.detach().float() for m in experts]) for name in arch.per_expert
            ]
        except AttributeError as exc:
            raise KTKernelError(
                f"{where}: an expert lacks one of {arch.per_expert} ({exc}); fix the MoEArch of {arch.family}"
            ) from None
        return stacked[0], stacked[1], stacked[2]
    raise KTKernelError(
        f"{where} ({type(experts).__name__}) has neither fused {arch.fused} nor a ModuleList of experts with "
        f"{arch.per_expert}; describe this layout in kt_kernel.sft.arch"
    )


def quantize_experts(
    gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor, config: KTConfig, where: str
) -> tuple[QuantizedWeights, QuantizedWeights, QuantizedWeights]:
    """gate, up and down quantized as the config says; shapes the kernels cannot take are errors."""
    hidden, inter = gate.shape[2], gate.shape[1]
    if hidden % 64 or inter % 64:
        raise KTKernelError(
            f"{where}: hidden {hidden} and expert intermediate size {inter} must be multiples of 64 for the "
            "CPU kernels; use backend='torch' for this model"
        )
    if inter % (64 * config.tp) or (config.weight_format == "rawint4" and inter % (config.group_size * config.tp)):
        raise KTKernelError(
            f"{where}: intermediate size {inter} does not split into tp={config.tp} partitions of whole "
            f"64-column (and {config.group_size}-group) blocks; lower tp"
        )
    fmt = cast(Format, config.weight_format)
    g, u, d = (quantize(w, fmt, config.group_size) for w in (gate, up, down))
    return g, u, d
