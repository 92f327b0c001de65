"""kt_kernel.sft benchmark (`nox -s bench`): forward + backward of one MoE layer with expert LoRA
(hidden 2048, intermediate 768, 64 experts, top-8, rank 8) at 256 and 1024 tokens, per CPU variant
this host runs, against torch bf16 autograd on the same (dequantized) layer in the same run; the
saved activations per token of both (torch's measured with saved_tensors_hooks); TP2 against TP1.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from base import paths
from base.paths import ROOT

from . import results
from .timing import median_seconds

HIDDEN, INTER, EXPERTS, TOPK, RANK = 2048, 768, 64, 8, 8
TOKENS = (256, 1024)


def _timeit(fn: Any, reps: int = 3) -> float:
    return median_seconds(fn, min_reps=reps)


def worker(fmt: str, tokens: int, tp: int) -> dict[str, Any]:
    """One format, token count and TP in this process: KT fwd+bwd, and (TP1) torch autograd beside it."""
    import kt_kernel
    import torch
    from kt_kernel.sft import KTConfig, KTExperts

    threads = len(os.sched_getaffinity(0))
    torch.set_num_threads(threads)
    g = torch.Generator().manual_seed(0)
    q = [
        kt_kernel.quantize(torch.randn(EXPERTS, r, c, generator=g) * 0.02, fmt, 64)  # type: ignore[arg-type]
        for r, c in ((INTER, HIDDEN), (INTER, HIDDEN), (HIDDEN, INTER))
    ]
    cfg = KTConfig(weight_format=fmt, lora_rank=RANK, lora_alpha=16.0, tp=tp, num_threads=threads)
    layer = KTExperts(q[0], q[1], q[2], cfg)
    lora = layer.adapter()
    with torch.no_grad():
        for p in lora.tensors():
            p.normal_(0, 0.02, generator=g)
    x = torch.randn(tokens, HIDDEN, generator=g).bfloat16().requires_grad_()
    ids = torch.stack([torch.randperm(EXPERTS, generator=g)[:TOPK] for _ in range(tokens)])
    w = torch.rand(tokens, TOPK, generator=g).requires_grad_()
    dy = torch.randn(tokens, HIDDEN, generator=g).bfloat16()

    def kt_step() -> None:
        layer(x, ids, w).backward(dy)

    out: dict[str, Any] = {"variant": kt_kernel.__cpu_variant__, "fmt": fmt, "tokens": tokens, "tp": tp}
    out["kt_s"] = _timeit(kt_step)
    out["kt_saved_bytes_per_token"] = layer.pool.nbytes / tokens
    if tp > 1:
        return out
    # torch autograd on the same layer: dequantized weights (frozen) and LoRA in bf16 (the goal's
    # reference) and, for scale, in fp32 (MKL; bf16 on a CPU without native bf16 is emulated)
    s = cfg.lora_scale

    def torch_step(dtype: torch.dtype, count: bool) -> tuple[float, int]:
        deq = [torch.from_numpy(kt_kernel.dequantize(qw)).to(dtype) for qw in q]
        lt = [p.detach().to(dtype).requires_grad_() for p in lora.tensors()]
        xt = x.detach().to(dtype).requires_grad_()
        frozen = {t.untyped_storage().data_ptr() for t in (*deq, *lt, xt, w, ids)}
        saved: dict[int, int] = {}

        def pack(t: torch.Tensor) -> torch.Tensor:
            ptr = t.untyped_storage().data_ptr()
            if count and ptr not in frozen:  # activations only: weights, LoRA and inputs exist anyway
                saved[ptr] = t.untyped_storage().nbytes()
            return t

        t0 = time.perf_counter()
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            y = torch.zeros(tokens, HIDDEN, dtype=dtype)
            for e in torch.unique(ids).tolist():
                tok, k = torch.where(ids == e)
                xe = xt[tok]
                gt = xe @ deq[0][e].T + s * (xe @ lt[0][e].T) @ lt[1][e].T
                ut = xe @ deq[1][e].T + s * (xe @ lt[2][e].T) @ lt[3][e].T
                h = torch.nn.functional.silu(gt) * ut
                o = h @ deq[2][e].T + s * (h @ lt[4][e].T) @ lt[5][e].T
                y = y.index_add(0, tok, o * w[tok, k, None].to(dtype))
        y.backward(dy.to(dtype))
        return time.perf_counter() - t0, sum(saved.values())

    # One timed step each (torch bf16 without native bf16 takes tens of seconds); fp32 after a warm-up.
    out["torch_bf16_s"], nbytes = torch_step(torch.bfloat16, True)
    out["torch_saved_bytes_per_token"] = nbytes / tokens
    torch_step(torch.float32, False)
    out["torch_fp32_s"], _ = torch_step(torch.float32, False)
    out["speedup"] = out["torch_bf16_s"] / out["kt_s"]
    return out


def line(variant: str, r: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    """One printed result row."""
    head = f"{variant:<12} {r['fmt']:<7} T={r['tokens']:<5}"
    if r["tp"] > 1:
        key = (r["variant"], r["fmt"], r["tokens"], 1)
        tp1 = next(x for x in rows if (x["variant"], x["fmt"], x["tokens"], x["tp"]) == key)
        return f"{head} TP{r['tp']} {r['kt_s'] * 1e3:8.1f} ms  (TP1/TP{r['tp']} x{tp1['kt_s'] / r['kt_s']:4.2f})"
    return (
        f"{head} kt {r['kt_s'] * 1e3:8.1f} ms  torch-bf16 {r['torch_bf16_s'] * 1e3:8.1f} ms  x{r['speedup']:4.2f}  "
        f"(torch-fp32 {r['torch_fp32_s'] * 1e3:7.1f} ms)  saved/token kt "
        f"{r['kt_saved_bytes_per_token'] / 1024:5.1f} KiB, torch {r['torch_saved_bytes_per_token'] / 1024:5.1f} KiB"
    )


def main(argv: list[str] | None = None) -> int:
    """`nox -s bench -- --only sft`: every usable variant in its own process."""
    p = argparse.ArgumentParser(prog="python -m bench.sft")
    p.add_argument("--json", type=Path, default=paths.BENCH_JSON["sft"])
    p.add_argument("--formats", nargs="+", default=["int8", "rawint4"])
    p.add_argument("--variant", action="append", default=[], help="only these CPU variants (default: every usable one)")
    p.add_argument("--worker", nargs=3, metavar=("FMT", "TOKENS", "TP"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args.worker[0], int(args.worker[1]), int(args.worker[2]))))
        return 0
    report_cmd = "import json, kt_kernel; print(json.dumps(kt_kernel.cpu_report().as_dict()))"
    report = json.loads(
        subprocess.run([sys.executable, "-c", report_cmd], check=True, capture_output=True, text=True).stdout
    )
    unknown = sorted(set(args.variant) - set(report["variants"]))
    if unknown:
        known = ", ".join(report["variants"])
        p.error(f"--variant {', '.join(unknown)}: not a CPU variant of kt-kernel (known: {known})")
    rows = []
    print(
        f"sft: one MoE layer (hidden {HIDDEN}, inter {INTER}, {EXPERTS} experts, top-{TOPK}, LoRA rank {RANK}), fwd+bwd"
    )
    for name, st in report["variants"].items():
        if args.variant and name not in args.variant:
            continue
        if not st["usable"]:
            print(f"{name}: skipped ({st['why']})")
            continue
        for fmt in args.formats:
            for tokens in TOKENS:
                for tp in (1, 2):
                    env = dict(os.environ, KT_KERNEL_CPU_VARIANT=name)
                    proc = subprocess.run(
                        [sys.executable, "-m", "bench.sft", "--worker", fmt, str(tokens), str(tp)],
                        env=env,
                        capture_output=True,
                        text=True,
                        cwd=ROOT,
                        check=False,
                    )
                    if proc.returncode != 0:
                        print(proc.stderr[-3000:], file=sys.stderr)
                        return 1
                    r = json.loads(proc.stdout.strip().splitlines()[-1])
                    rows.append(r)
                    print(line(name, r, rows))
    results.write(args.json, {"cpu": report["brand"], "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
