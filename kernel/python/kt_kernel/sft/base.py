"""The experts module shared by every backend: LoRA parameters, frozen quantized base weights,
buffers for saved activations (sized once, reused across steps), checkpointing, TP partitions.
A backend subclass supplies only how one partition runs forward and backward."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from .._cpu import KTKernelError
from .._moe import LoRA, Saved
from .._quant import QuantizedWeights
from . import dist_utils
from .config import KTConfig
from .lora import ExpertLoRA


@dataclass
class Step:
    """One forward's state for its backward: the partitions' saved buffers (None: checkpointing)."""

    saved: list[Saved] | None
    pooled: bool


class SavedPool:
    """Saved-activation buffers per partition, sized for the largest batch seen and reused: a step
    takes them if free (a second forward before the first's backward gets fresh ones)."""

    def __init__(self, parts: list[tuple[int, int]], rank: int) -> None:
        self.parts, self.rank = parts, rank
        self.capacity = 0
        self.buffers: list[Saved] = []
        self.busy = False

    def take(self, rows: int) -> tuple[list[Saved], bool]:
        if self.busy:
            return [Saved.allocate(rows, i1 - i0, self.rank) for i0, i1 in self.parts], False
        if rows > self.capacity:
            self.buffers = [Saved.allocate(rows, i1 - i0, self.rank) for i0, i1 in self.parts]
            self.capacity = rows
        self.busy = True
        return [b.view(rows) for b in self.buffers], True

    def give_back(self) -> None:
        self.busy = False

    @property
    def nbytes(self) -> int:
        return sum(b.nbytes for b in self.buffers)


class ExpertsBase(nn.Module):
    """Replaces a HF MoE block's experts: called as ``experts(hidden_states, top_k_index,
    top_k_weights)`` like transformers' fused experts modules; the router stays in torch."""

    backend = "base"

    def __init__(self, gate: QuantizedWeights, up: QuantizedWeights, down: QuantizedWeights, config: KTConfig) -> None:
        super().__init__()
        self.config = config
        self.num_experts, self.inter, self.hidden = gate.experts, gate.rows, gate.cols
        self.quantized = (gate, up, down)  # frozen: never a parameter, never written
        self.lora = ExpertLoRA(self.num_experts, self.hidden, self.inter, config) if config.lora_rank else None
        self.partitions = dist_utils.bounds(self.inter, config.tp)
        self.pool = SavedPool(self.partitions, config.lora_rank)

    def extra_repr(self) -> str:
        c = self.config
        return (
            f"backend={self.backend}, experts={self.num_experts}, hidden={self.hidden}, inter={self.inter}, "
            f"weights={c.weight_format}, lora_rank={c.lora_rank}, tp={c.tp}"
        )

    def base_digest(self) -> str:
        """sha256 over the quantized base weights (tests: bit-identical after optimizer steps)."""
        h = hashlib.sha256()
        for qw in self.quantized:
            h.update(np.ascontiguousarray(qw.q).tobytes())
            h.update(np.ascontiguousarray(qw.scale).tobytes())
        return h.hexdigest()

    def adapter(self) -> ExpertLoRA:
        """The expert LoRA (an error when this layer trains none)."""
        if self.lora is None:
            raise KTKernelError("this experts module has lora_rank=0: it has no expert LoRA")
        return self.lora

    def lora_tensors(self) -> tuple[torch.Tensor, ...]:
        return self.lora.tensors() if self.lora is not None else ()

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor) -> Any:
        shape = hidden_states.shape
        x = hidden_states.reshape(-1, self.hidden)
        k = top_k_index.shape[-1]
        y = self.run(x, top_k_index.reshape(x.shape[0], k), top_k_weights.reshape(x.shape[0], k))
        return y.reshape(shape)

    def run(self, x: torch.Tensor, ids: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def saved_bytes_per_token(self, topk: int) -> int:
        """Saved activations per token (checkpointing: none): gate and up per pair, LoRA projections."""
        if self.config.checkpointing:
            return 0
        return topk * (2 * self.inter + 3 * self.config.lora_rank * self.config.tp) * 4

    def lora_numpy(self, tensors: tuple[torch.Tensor, ...]) -> LoRA | None:
        if not tensors:
            return None
        arrays = [t.detach().float().contiguous().numpy() for t in tensors]
        return LoRA.of(arrays, self.config.lora_scale)
