"""wrap_model: every MoE block's experts replaced by the KT experts (router and shared experts stay
in torch); the expert LoRA exported and imported under PEFT's per-expert names."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .._cpu import KTKernelError
from .arch import arch_for
from .base import ExpertsBase
from .config import PROJECTIONS, KTConfig
from .layer import BACKENDS
from .lora import param_name
from .weights import expert_weights, quantize_experts

PEFT_PREFIX = "base_model.model."
ADAPTER_FILE = "kt_expert_adapter.safetensors"
ADAPTER_CONFIG = "kt_expert_adapter.json"


@dataclass(frozen=True)
class Wrapped:
    """One replaced block: its module path (without PEFT's prefix) and the new experts module."""

    path: str
    experts: ExpertsBase


def _base(model: nn.Module) -> nn.Module:
    """The transformers model inside a PEFT wrapper (or the model itself)."""
    if hasattr(model, "peft_config") and hasattr(model, "base_model"):  # PeftModel -> LoraModel -> model
        inner = model.base_model
        return getattr(inner, "model", inner)
    return model


def _model_type(model: nn.Module) -> str:
    config = getattr(_base(model), "config", None)
    model_type = getattr(config, "model_type", None)
    if not model_type:
        raise KTKernelError(f"{type(model).__name__} has no config.model_type; pass a transformers model")
    return str(model_type)


def wrap_model(model: nn.Module, config: KTConfig | dict[str, Any] | None = None) -> list[Wrapped]:
    """Replace the experts of every MoE block of ``model`` (in place) and return what was replaced.
    ``model`` may be a PEFT model: call this after ``get_peft_model`` (which freezes every parameter
    that is not its own adapter's), or call :func:`mark_expert_lora_trainable` after it."""
    cfg = config if isinstance(config, KTConfig) else KTConfig.from_dict(config or {})
    base = _base(model)
    arch = arch_for(_model_type(model))
    act = getattr(base.config, "hidden_act", arch.activation)
    if act != arch.activation:
        raise KTKernelError(f"{arch.family}: hidden_act {act!r} is not {arch.activation!r}, the kernels' activation")
    out = []
    for path, block in list(base.named_modules()):
        experts = getattr(block, arch.experts, None)
        if experts is None or not hasattr(block, arch.router) or isinstance(experts, ExpertsBase):
            continue
        where = f"{path}.{arch.experts}" if path else arch.experts
        weights = expert_weights(experts, arch, where)
        quantized = quantize_experts(*weights, cfg, where)
        new = BACKENDS[cfg.backend](*quantized, cfg)
        setattr(block, arch.experts, new)  # the original (full precision) experts are released
        out.append(Wrapped(where, new))
    if not out:
        raise KTKernelError(
            f"no MoE block ({arch.router!r} and {arch.experts!r} submodules) found in {type(base).__name__}"
        )
    mark_expert_lora_trainable(model)
    return out


def mark_expert_lora_trainable(model: nn.Module) -> int:
    """requires_grad on every targeted expert LoRA parameter (PEFT's get_peft_model turns it off for
    parameters outside its own adapters); returns how many tensors."""
    n = 0
    for w in kt_experts(model):
        if w.experts.lora is not None:
            for p in w.experts.lora.parameters():
                p.requires_grad_(True)
                n += 1
    return n


def kt_experts(model: nn.Module) -> list[Wrapped]:
    """Every KT experts module in the model, with its path (without PEFT's prefix)."""
    base = _base(model)
    return [Wrapped(path, m) for path, m in base.named_modules() if isinstance(m, ExpertsBase)]


def _slots(model: nn.Module) -> list[tuple[str, list[str], torch.Tensor]]:
    """For every targeted expert LoRA tensor: its name in the KT layout, its E per-expert names in
    PEFT's layout, and the parameter ([E, rank, in] for A, [E, out, rank] for B)."""
    arch = arch_for(_model_type(model))
    out = []
    for w in kt_experts(model):
        lora = w.experts.lora
        if lora is None:
            continue
        for proj in lora.targets:
            module = arch.per_expert[PROJECTIONS.index(proj)]
            for ab in "AB":
                stacked = f"{PEFT_PREFIX}{w.path}.{module}.lora_{ab}.weight"
                per = [f"{PEFT_PREFIX}{w.path}.{e}.{module}.lora_{ab}.weight" for e in range(w.experts.num_experts)]
                out.append((stacked, per, getattr(lora, param_name(proj, ab))))
    return out


def expert_lora_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The expert LoRA in the KT layout: per MoE block and projection, the experts stacked,
    ``base_model.model.<block>.experts.gate_proj.lora_A.weight`` [E, rank, in] and ``lora_B`` [E, out, rank]
    (``kt-lora-convert to-peft`` splits them into PEFT's one tensor per expert)."""
    return {name: t.detach().clone().contiguous() for name, _, t in _slots(model)}


def load_expert_lora_state_dict(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Copy an expert LoRA into the wrapped model, from the KT layout or PEFT's per-expert one; every
    expected tensor must be present with its shape, and no key may be left over."""
    left = set(state)
    with torch.no_grad():
        for name, per, dst in _slots(model):
            if name in state:
                src, used = state[name], [name]
            elif all(n in state for n in per):
                src, used = torch.stack([state[n] for n in per]), per
            else:
                raise KTKernelError(
                    f"expert LoRA lacks {name} (or its per-expert tensors); was it saved from this model?"
                )
            if tuple(src.shape) != tuple(dst.shape):
                raise KTKernelError(f"{name}: shape {list(src.shape)}, the model has {list(dst.shape)}")
            dst.copy_(src)
            left.difference_update(used)
    if left:
        raise KTKernelError(f"expert LoRA has {len(left)} tensors this model has no place for, e.g. {sorted(left)[0]}")


def save_expert_lora(model: nn.Module, directory: str | Path) -> Path:
    """Write the expert LoRA beside a PEFT adapter: ``kt_expert_adapter.safetensors`` (KT layout, see
    :func:`expert_lora_state_dict`) and ``kt_expert_adapter.json`` (rank, alpha, targets, weight format)."""
    from safetensors.torch import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    wrapped = kt_experts(model)
    if not wrapped:
        raise KTKernelError("the model has no KT experts; call kt_kernel.sft.wrap_model first")
    cfg = wrapped[0].experts.config
    tmp = directory / (ADAPTER_FILE + ".tmp")
    save_file(expert_lora_state_dict(model), str(tmp), metadata={"format": "pt"})
    tmp.replace(directory / ADAPTER_FILE)
    meta = {
        "r": cfg.lora_rank,
        "lora_alpha": cfg.lora_alpha,
        "targets": list(cfg.lora_targets),
        "weight_format": cfg.weight_format,
        "blocks": [w.path for w in wrapped],
    }
    (directory / ADAPTER_CONFIG).write_text(json.dumps(meta, indent=2) + "\n")
    return directory / ADAPTER_FILE


def load_expert_lora(model: nn.Module, directory: str | Path) -> None:
    """Load what save_expert_lora wrote into a wrapped model; rank and alpha must match."""
    from safetensors.torch import load_file

    directory = Path(directory)
    path = directory / ADAPTER_FILE
    if not path.is_file():
        raise KTKernelError(f"{path} is missing; save it with kt_kernel.sft.save_expert_lora")
    meta = json.loads((directory / ADAPTER_CONFIG).read_text())
    cfg = kt_experts(model)[0].experts.config
    if (meta["r"], float(meta["lora_alpha"])) != (cfg.lora_rank, float(cfg.lora_alpha)):
        raise KTKernelError(
            f"{path}: saved with r={meta['r']}, alpha={meta['lora_alpha']}; the model has r={cfg.lora_rank}, "
            f"alpha={cfg.lora_alpha}"
        )
    load_expert_lora_state_dict(model, load_file(str(path)))
