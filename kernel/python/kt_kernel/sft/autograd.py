"""torch.autograd.Function over the native forward and backward kernels."""

from __future__ import annotations

from typing import Any

import torch


class KTExpertsFunction(torch.autograd.Function):
    """y = experts(x, ids, w) with the expert LoRA tensors as further inputs; backward gives
    grad of x, of the routing weights w and of the six LoRA tensors (never of the base weights)."""

    @staticmethod
    def forward(ctx: Any, layer: Any, x: torch.Tensor, ids: torch.Tensor, w: torch.Tensor, *lora: torch.Tensor) -> Any:
        y, step = layer.native_forward(x, ids, w, lora, keep=not layer.config.checkpointing)
        ctx.layer, ctx.step = layer, step
        ctx.save_for_backward(x, ids, w, *lora)
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, dy: torch.Tensor) -> Any:
        x, ids, w, *lora = ctx.saved_tensors
        dx, dw, dl = ctx.layer.native_backward(ctx.step, x, ids, w, tuple(lora), dy)
        ctx.step = None
        return (None, dx, None, dw, *dl)
