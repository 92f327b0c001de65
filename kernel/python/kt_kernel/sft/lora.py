"""Expert LoRA parameters: per expert A/B for gate, up and down (PEFT's initialisation)."""

from __future__ import annotations

import math

import torch
from torch import nn

from .config import PROJECTIONS, KTConfig

#: (projection, A shape, B shape) in terms of experts E, rank r, hidden H, inter I.
SHAPES = {
    "gate": (("E", "r", "H"), ("E", "I", "r")),
    "up": (("E", "r", "H"), ("E", "I", "r")),
    "down": (("E", "r", "I"), ("E", "H", "r")),
}


def param_name(proj: str, ab: str) -> str:
    # "lora_" in the name: PEFT's get_peft_model keeps such parameters trainable.
    """The parameter name of a projection's A or B (contains 'lora_', as PEFT's adapters do)."""
    return f"lora_{proj}_{ab}"


class ExpertLoRA(nn.Module):
    """LoRA A ``[E, r, in]`` and B ``[E, out, r]`` for each targeted projection; untargeted ones are
    zero buffers (no effect, no gradient kept). A: kaiming-uniform (as nn.Linear), B: zeros, so a
    fresh adapter changes nothing."""

    def __init__(self, experts: int, hidden: int, inter: int, config: KTConfig) -> None:
        super().__init__()
        self.rank = config.lora_rank
        self.scale = config.lora_scale
        self.targets = tuple(p for p in PROJECTIONS if p in config.lora_targets)
        dims = {"E": experts, "r": self.rank, "H": hidden, "I": inter}
        for proj in PROJECTIONS:
            for ab, shape in zip("AB", SHAPES[proj], strict=True):
                t = torch.zeros(tuple(dims[d] for d in shape))
                if proj in self.targets and ab == "A":
                    for e in range(experts):
                        nn.init.kaiming_uniform_(t[e], a=math.sqrt(5))
                if proj in self.targets:
                    self.register_parameter(param_name(proj, ab), nn.Parameter(t))
                else:
                    self.register_buffer(param_name(proj, ab), t, persistent=False)

    def tensors(self) -> tuple[torch.Tensor, ...]:
        """gate A, gate B, up A, up B, down A, down B (the kernels' order)."""
        return tuple(getattr(self, param_name(p, ab)) for p in PROJECTIONS for ab in "AB")
