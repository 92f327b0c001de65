"""Where each Hugging Face MoE model family keeps its router and experts: data, not code.

Transformers 5 stores a block's experts fused (``gate_up_proj`` [E, 2*inter, hidden] with the gate
rows first, ``down_proj`` [E, hidden, inter]) in a module called as ``experts(x, top_k_index,
top_k_weights)``; older releases kept a ModuleList of per-expert MLPs (``per_expert`` names).
"""

from __future__ import annotations

from dataclasses import dataclass

from .._cpu import KTKernelError


@dataclass(frozen=True)
class MoEArch:
    """One model family's MoE block: router, experts and shared-experts names, weight layouts, activation."""

    family: str
    model_types: tuple[str, ...]
    router: str = "gate"  # stays in torch
    experts: str = "experts"  # replaced by the KT experts
    shared_experts: str | None = None  # dense, stays in torch
    fused: tuple[str, str] = ("gate_up_proj", "down_proj")
    per_expert: tuple[str, str, str] = ("gate_proj", "up_proj", "down_proj")
    activation: str = "silu"  # config.hidden_act the kernels implement


ARCHES: tuple[MoEArch, ...] = (
    MoEArch("qwen3-moe", ("qwen3_moe",)),
    MoEArch("qwen2-moe", ("qwen2_moe",), shared_experts="shared_expert"),
    MoEArch("deepseek-v3", ("deepseek_v3", "kimi_k2"), shared_experts="shared_experts"),
    MoEArch("mixtral", ("mixtral",), per_expert=("w1", "w3", "w2")),
)


def arch_for(model_type: str) -> MoEArch:
    """The MoEArch of a transformers `model_type`; a clear error naming the known ones otherwise."""
    for arch in ARCHES:
        if model_type in arch.model_types:
            return arch
    known = sorted(t for a in ARCHES for t in a.model_types)
    raise KTKernelError(
        f"model_type {model_type!r} has no MoE description in kt_kernel.sft.arch; known: {known}. "
        "Add a MoEArch entry (router, experts and weight names of its MoE block)."
    )
