"""The experts modules: native CPU kernels ("kt") and the torch reference ("torch")."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import torch

from .._moe import LoRA, MoE, _default_threads
from .._quant import QuantizedWeights, dequantize
from . import dist_utils
from .autograd import KTExpertsFunction
from .base import ExpertsBase, Step
from .config import KTConfig


class KTExperts(ExpertsBase):
    """Experts on kt_kernel's CPU variant (its AMX, AVX-512 or AVX2 code paths), split into
    ``config.tp`` partitions of the intermediate dimension, each on num_threads / tp threads."""

    backend = "kt"

    def __init__(self, gate: QuantizedWeights, up: QuantizedWeights, down: QuantizedWeights, config: KTConfig) -> None:
        super().__init__(gate, up, down, config)
        b = self.partitions
        if len(b) == 1:
            self.parts = [MoE(gate, up, down)]
        else:
            gates, ups, downs = (
                dist_utils.split_rows(gate, b),
                dist_utils.split_rows(up, b),
                dist_utils.split_cols(down, b),
            )
            splits = zip(gates, ups, downs, strict=True)
            self.parts = [MoE(g, u, d) for g, u, d in splits]
        total = config.num_threads or _default_threads()
        self.threads = max(1, total // config.tp)
        import kt_kernel

        self.variant = kt_kernel.__cpu_variant__

    def run(self, x: torch.Tensor, ids: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        lora = self.lora_tensors()
        grad = torch.is_grad_enabled() and (x.requires_grad or w.requires_grad or any(t.requires_grad for t in lora))
        if grad:
            y: torch.Tensor = KTExpertsFunction.apply(self, x, ids, w, *lora)
            return y
        y, _ = self.native_forward(x, ids, w, lora, keep=False, train=False)
        return y

    @staticmethod
    def _inputs(x: torch.Tensor, ids: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, np.ndarray, torch.Tensor]:
        xd = x.detach()
        if xd.dtype not in (torch.float32, torch.bfloat16):
            xd = xd.float()
        return xd.contiguous(), ids.detach().to(torch.int64).contiguous().numpy(), w.detach().float().contiguous()

    def native_forward(
        self,
        x: torch.Tensor,
        ids: torch.Tensor,
        w: torch.Tensor,
        lora_t: tuple[torch.Tensor, ...],
        *,
        keep: bool,
        train: bool = True,
    ) -> tuple[torch.Tensor, Step]:
        xd, idn, wd = self._inputs(x, ids, w)
        lora = self.lora_numpy(lora_t)
        shards: list[LoRA | None] = (
            list(dist_utils.shard_lora(lora, self.partitions)) if lora is not None else [None] * len(self.parts)
        )
        saved, pooled = self.pool.take(xd.shape[0] * idn.shape[1]) if keep else (None, False)
        th = self.threads

        def one(i: int) -> Any:
            part = self.parts[i]
            if not train:
                return part(xd, idn, wd, lora=shards[i], num_threads=th)
            y, _ = part.forward_train(xd, idn, wd, shards[i], num_threads=th, out=saved[i] if saved else None)
            return y

        ys = dist_utils.run_partitions([functools.partial(one, i) for i in range(len(self.parts))])
        y = ys[0] if len(ys) == 1 else dist_utils.reduce_sum(ys).to(xd.dtype)
        return y.to(x.dtype), Step(saved, pooled)

    def native_backward(
        self,
        step: Step,
        x: torch.Tensor,
        ids: torch.Tensor,
        w: torch.Tensor,
        lora_t: tuple[torch.Tensor, ...],
        dy: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, ...]]:
        if step.saved is None:  # checkpointing: recompute what the forward did not keep
            _, step = self.native_forward(x, ids, w, lora_t, keep=True)
        assert step.saved is not None
        xd, idn, wd = self._inputs(x, ids, w)
        dyd = dy.detach().to(xd.dtype).contiguous()
        lora = self.lora_numpy(lora_t)
        shards: list[LoRA | None] = (
            list(dist_utils.shard_lora(lora, self.partitions)) if lora is not None else [None] * len(self.parts)
        )
        saved = step.saved
        try:
            outs = dist_utils.run_partitions(
                [
                    functools.partial(
                        self.parts[i].backward, xd, idn, wd, saved[i], dyd, shards[i], num_threads=self.threads
                    )
                    for i in range(len(self.parts))
                ]
            )
        finally:
            if step.pooled:
                self.pool.give_back()
        dx = outs[0][0] if len(outs) == 1 else np.sum([o[0] for o in outs], axis=0, dtype=np.float32)
        dw = outs[0][1] if len(outs) == 1 else np.sum([o[1] for o in outs], axis=0, dtype=np.float32)
        dl: tuple[torch.Tensor, ...] = ()
        if lora is not None:
            grads = dist_utils.gather_lora([o[2] for o in outs if o[2] is not None])
            dl = tuple(torch.from_numpy(a) for a in grads.arrays())
        return torch.from_numpy(dx).to(x.dtype), torch.from_numpy(dw).to(w.dtype), dl


class TorchExperts(ExpertsBase):
    """The same quantized weights, dequantized to fp32, in plain torch autograd (the reference)."""

    backend = "torch"

    def __init__(self, gate: QuantizedWeights, up: QuantizedWeights, down: QuantizedWeights, config: KTConfig) -> None:
        super().__init__(gate, up, down, config)
        for name, qw in zip(("w_gate", "w_up", "w_down"), (gate, up, down), strict=True):
            self.register_buffer(name, torch.from_numpy(dequantize(qw)), persistent=False)

    def run(self, x: torch.Tensor, ids: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        lora = self.lora_tensors()
        s = self.config.lora_scale
        xf = x.float()
        out = torch.zeros(xf.shape, dtype=torch.float32)
        for e in torch.unique(ids).tolist():
            tok, kpos = torch.where(ids == e)
            xe = xf[tok]
            g = xe @ self.w_gate[e].T
            u = xe @ self.w_up[e].T
            if lora:
                g = g + s * (xe @ lora[0][e].T) @ lora[1][e].T
                u = u + s * (xe @ lora[2][e].T) @ lora[3][e].T
            h = torch.nn.functional.silu(g) * u
            o = h @ self.w_down[e].T
            if lora:
                o = o + s * (h @ lora[4][e].T) @ lora[5][e].T
            out = out.index_add(0, tok, o * w[tok, kpos, None].float())
        return out.to(x.dtype)


BACKENDS: dict[str, type[ExpertsBase]] = {"kt": KTExperts, "torch": TorchExperts}
