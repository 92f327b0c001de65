"""kt_kernel.sft: LoRA fine-tuning of MoE models whose experts run on the CPU kernels.

Imported on first use only (``import kt_kernel`` never imports torch or this package)::

    from kt_kernel.sft import KTConfig, wrap_model
    model = peft.get_peft_model(model, LoraConfig(target_modules=["q_proj", "v_proj"]))
    wrap_model(model, KTConfig(weight_format="int8", lora_rank=8))   # experts -> KT experts

Modules: config (KTConfig), arch (where each model family keeps router and experts), weights
(extraction and quantization), lora (expert LoRA parameters), autograd (the torch Function over
the native kernels), base/layer (the experts modules), wrapper (wrap_model, LoRA export/import),
dist_utils (tensor parallelism over the intermediate dimension).
"""

from __future__ import annotations

from .arch import ARCHES, MoEArch, arch_for
from .base import ExpertsBase
from .config import LEGACY_NAMES, KTConfig, KTConfigError
from .layer import KTExperts, TorchExperts
from .wrapper import (
    expert_lora_state_dict,
    kt_experts,
    load_expert_lora,
    load_expert_lora_state_dict,
    mark_expert_lora_trainable,
    save_expert_lora,
    wrap_model,
)

__all__ = [
    "ARCHES",
    "LEGACY_NAMES",
    "ExpertsBase",
    "KTConfig",
    "KTConfigError",
    "KTExperts",
    "MoEArch",
    "TorchExperts",
    "arch_for",
    "expert_lora_state_dict",
    "kt_experts",
    "load_expert_lora",
    "load_expert_lora_state_dict",
    "mark_expert_lora_trainable",
    "save_expert_lora",
    "wrap_model",
]
