"""Benchmarks behind the numbers in closing notes (`nox -s bench`).

Per CPU variant this host can run: decode (1-8 tokens) and prefill (256 tokens)
for a realistic MoE layer (hidden 2048, intermediate 768, 64 experts, top-8),
against torch bf16 on the same dequantized weights, the cost of one call through the abi3
``_core`` binding beside a one-token decode, and (decode) as a fraction of
this machine's read bandwidth, probed just before and after each timing (median
of five rounds: a shared host's bandwidth drifts). Then the cold build time of
the kernel and the incremental rebuild after touching one variant source.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Literal, cast

from base import paths
from base.paths import ROOT

from . import results
from .timing import median_seconds

HIDDEN, INTER, EXPERTS, TOPK = 2048, 768, 64, 8
DECODE_TOKENS = (1, 2, 4, 8)
PREFILL_TOKENS = 256
ROUTINGS = 16


def _timeit(fn: Any, min_time: float = 0.6, min_reps: int = 5) -> float:
    return median_seconds(fn, min_reps=min_reps, min_time=min_time)


class ReadProbe:
    """GB/s of a streaming read (int8 max) over `gib` GiB split across threads, on demand: a shared
    host's bandwidth drifts by a third within minutes, so each kernel timing is set beside a probe
    taken just before and just after it."""

    def __init__(self, threads: int, gib: float = 0.5) -> None:
        import numpy as np

        self.a = np.ones(int(gib * (1 << 30)), dtype=np.int8)
        self.parts = np.array_split(self.a, threads)

    def __call__(self, min_time: float = 0.3) -> float:
        def run() -> None:
            ts = [threading.Thread(target=p.max) for p in self.parts]  # numpy releases the GIL here
            for t in ts:
                t.start()
            for t in ts:
                t.join()

        return float(self.a.nbytes / _timeit(run, min_time=min_time) / 1e9)


def read_bandwidth(threads: int, gib: float = 1.0) -> float:
    """GB/s of a streaming read (int8 max) over `gib` GiB split across threads."""
    return ReadProbe(threads, gib)(min_time=1.0)


ROOFLINE_REPEATS = 5


def roofline(probe: ReadProbe, call: Any, touched_bytes: float) -> tuple[float, float, float]:
    """(median seconds per call, median fraction of the read roofline, median GB/s of the probes) over
    ROOFLINE_REPEATS rounds of probe, time the call, probe; each round's fraction is against the mean
    of its own two probes."""
    times, fractions, probes = [], [], []
    for _ in range(ROOFLINE_REPEATS):
        before = probe()
        t = _timeit(call, min_time=0.3)
        after = probe()
        times.append(t)
        probes += [before, after]
        fractions.append(touched_bytes / t / 1e9 / ((before + after) / 2))
    return statistics.median(times), statistics.median(fractions), statistics.median(probes)


def worker(variant: str, fmt: Literal["int8", "rawint4"], group: int) -> dict[str, Any]:
    """One variant and format in this process: decode and prefill timings beside torch bf16."""
    import kt_kernel
    import numpy as np
    import torch

    threads = len(os.sched_getaffinity(0))
    torch.set_num_threads(threads)
    rng = np.random.default_rng(0)
    q, deq = [], []
    for nrows, ncols in ((INTER, HIDDEN), (INTER, HIDDEN), (HIDDEN, INTER)):
        w = rng.standard_normal((EXPERTS, nrows, ncols), dtype=np.float32) * 0.02
        qw = kt_kernel.quantize(w, fmt, group)
        q.append(qw)
        deq.append(torch.from_numpy(kt_kernel.dequantize(qw)).bfloat16())
        del w
    layer = kt_kernel.MoE(*q)
    per_expert_bytes = sum(x.nbytes for x in q) / EXPERTS
    gate, up, down = deq

    def torch_moe(x: torch.Tensor, ids: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        y = torch.zeros_like(x)
        for e in torch.unique(ids).tolist():
            tok, k = (ids == e).nonzero(as_tuple=True)
            xe = x[tok]
            h = torch.nn.functional.silu(xe @ gate[e].T) * (xe @ up[e].T)
            y.index_add_(0, tok, (h @ down[e].T) * w[tok, k, None].to(x.dtype))
        return y

    rows: list[dict[str, float]] = []
    probe = ReadProbe(threads)
    for tokens in (*DECODE_TOKENS, PREFILL_TOKENS):
        xt = torch.from_numpy(rng.standard_normal((tokens, HIDDEN), dtype=np.float32)).bfloat16()
        wt = torch.from_numpy(rng.random((tokens, TOPK), dtype=np.float32))
        # A different routing every call, as consecutive decode steps (and layers) have: with
        # one fixed routing the touched experts stay in the last-level cache and the
        # "bandwidth" measured is the cache's.
        routes = [
            torch.from_numpy(np.stack([rng.permutation(EXPERTS)[:TOPK] for _ in range(tokens)]))
            for _ in range(ROUTINGS)
        ]
        turn = itertools.cycle(routes)

        def kt_call(xt: Any = xt, wt: Any = wt, turn: Any = turn) -> None:
            layer(xt, next(turn), wt)

        def ref_call(xt: Any = xt, wt: Any = wt, turn: Any = turn) -> None:
            torch_moe(xt, next(turn), wt)

        touched = sum(len(torch.unique(r)) for r in routes) / ROUTINGS * per_expert_bytes
        if tokens in DECODE_TOKENS:
            t_kt, roof, read = roofline(probe, kt_call, touched)
        else:
            t_kt, roof, read = _timeit(kt_call), float("nan"), float("nan")
        with torch.inference_mode():
            t_ref = _timeit(ref_call)
        rows.append(
            {
                "tokens": tokens,
                "kt_ms": t_kt * 1e3,
                "torch_bf16_ms": t_ref * 1e3,
                "speedup": t_ref / t_kt,
                "tokens_per_s": tokens / t_kt,
                "weight_gb_per_s": touched / t_kt / 1e9,
                "read_gb_per_s": read,
                "roofline_fraction": roof,
            }
        )
    call = core_call_cost()["core_call_s"]
    decode = next(r["kt_ms"] for r in rows if r["tokens"] == 1) / 1e3
    return {
        "variant": kt_kernel.__cpu_variant__,
        "fmt": fmt,
        "group": group,
        "threads": threads,
        "rows": rows,
        # The binding's share of a one-token decode (the abi3 _core must keep it under 1%).
        "core_call_us": call * 1e6,
        "core_call_fraction_of_decode": call / decode,
    }


def core_call_cost() -> dict[str, float]:
    """Seconds per call through ``_core`` alone: the smallest MoE the kernel takes (one token, one
    expert, 32x32, one thread), called with prepared buffers, so what is timed is the binding (argument
    parsing, buffer requests, the GIL release) plus a few hundred multiply-adds."""
    import kt_kernel
    import numpy as np
    from kt_kernel import _VARIANT

    rng = np.random.default_rng(1)
    qs = [kt_kernel.quantize(rng.standard_normal((1, 64, 64), dtype=np.float32), "int8") for _ in range(3)]
    x = rng.standard_normal((1, 64), dtype=np.float32)
    ids = np.zeros((1, 1), np.int64)
    w = np.ones((1, 1), np.float32)
    y = np.empty_like(x)
    args = (x, ids, w, qs[0].q, qs[0].scale, qs[1].q, qs[1].scale, qs[2].q, qs[2].scale, y, 1, 64, 64, 1, 1, 0, 0, 0, 1)

    def call() -> None:
        _VARIANT.moe_forward(*args)

    return {"core_call_s": _timeit(call, min_time=0.5, min_reps=2000)}


def build_times() -> dict[str, Any]:
    """Cold build (no ccache, empty build dir) and rebuild after touching one variant source."""
    env = dict(os.environ, CCACHE_DISABLE="1")
    work = paths.BENCH_SCRATCH[0]
    build_dir = ROOT / "kernel" / "build"
    cold_dir = list(build_dir.glob("*-all")) if build_dir.exists() else []
    for d in cold_dir:
        shutil.rmtree(d)
    t0 = time.perf_counter()
    subprocess.run(
        [sys.executable, str(ROOT / "kernel/tools/build_wheel.py"), "--dist", str(work / "dist"), "--work", str(work)],
        env=env,
        check=True,
        capture_output=True,
    )
    cold = time.perf_counter() - t0
    (cmake_dir,) = build_dir.glob("*-all")
    src = ROOT / "kernel/src/cpu/amx.cpp"
    src.touch()
    t0 = time.perf_counter()
    out = subprocess.run(
        ["cmake", "--build", str(cmake_dir), "--verbose"], env=env, check=True, capture_output=True, text=True
    ).stdout
    rebuild = time.perf_counter() - t0
    compiled = sorted(
        line.split(" -o ", 1)[1].split()[0] for line in out.splitlines() if " -c " in line and " -o " in line
    )
    return {"cold_build_s": cold, "touched": "kernel/src/cpu/amx.cpp", "rebuild_s": rebuild, "recompiled": compiled}


def main(argv: list[str] | None = None) -> int:
    """`nox -s bench` (kernel part): every usable variant in its own process, then build times."""
    p = argparse.ArgumentParser(prog="nox -s bench --")
    p.add_argument("--json", type=Path, default=paths.BENCH_JSON["kernel"])
    p.add_argument("--no-build-times", action="store_true")
    p.add_argument("--worker", nargs=3, metavar=("VARIANT", "FMT", "GROUP"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        fmt = cast(Literal["int8", "rawint4"], args.worker[1])
        print(json.dumps(worker(args.worker[0], fmt, int(args.worker[2]))))
        return 0

    report_cmd = "import json, kt_kernel; print(json.dumps(kt_kernel.cpu_report().as_dict()))"
    report = json.loads(
        subprocess.run([sys.executable, "-c", report_cmd], check=True, capture_output=True, text=True).stdout
    )
    threads = len(os.sched_getaffinity(0))
    result: dict[str, Any] = {"cpu": report["brand"], "threads": threads, "read_gb_per_s": read_bandwidth(threads)}
    print(f"CPU {report['brand']}, {threads} threads, read bandwidth {result['read_gb_per_s']:.1f} GB/s")
    result["variants"] = []
    for name, st in report["variants"].items():
        if not st["usable"]:
            print(f"{name}: skipped ({st['why']})")
            continue
        for fmt, group in (("int8", 0), ("rawint4", 64)):
            env = dict(os.environ, KT_KERNEL_CPU_VARIANT=name)
            out = subprocess.run(
                [sys.executable, "-m", "bench.kernel", "--worker", name, fmt, str(group or 64)],
                env=env,
                check=True,
                capture_output=True,
                text=True,
                cwd=ROOT,
            ).stdout
            r = json.loads(out.strip().splitlines()[-1])
            result["variants"].append(r)
            print(
                f"{name:<12} {fmt:<7} _core call {r['core_call_us']:.2f} us = "
                f"{r['core_call_fraction_of_decode']:.3%} of a one-token decode"
            )
            for row in r["rows"]:
                roof, read = row["roofline_fraction"], row["read_gb_per_s"]
                where = "" if math.isnan(roof) else f" ({roof:4.0%} of the read roofline, {read:.1f} GB/s)"
                print(
                    f"{name:<12} {fmt:<7} T={row['tokens']:<4} kt {row['kt_ms']:8.2f} ms  "
                    f"torch-bf16 {row['torch_bf16_ms']:8.2f} ms  x{row['speedup']:5.2f}  "
                    f"{row['tokens_per_s']:9.1f} tok/s  {row['weight_gb_per_s']:6.1f} GB/s{where}"
                )
    if not args.no_build_times:
        result["build"] = build_times()
        b = result["build"]
        print(
            f"cold build_cpu {b['cold_build_s']:.1f}s; after touching {b['touched']}: {b['rebuild_s']:.1f}s, "
            f"{len(b['recompiled'])} objects recompiled: {', '.join(b['recompiled'])}"
        )
    results.write(args.json, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
