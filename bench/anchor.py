"""`nox -s bench -- --only anchor`: this release's CPU MoE kernels against KTransformers' own, the kt-kernel
0.7.2 its users run today, side by side in one run.

KTransformers' kt-kernel is installed by hash into a venv of its own (lockfiles/anchor.txt: kt-kernel
0.7.2 with the torch 2.9.1 it pins) and driven by bench/anchor_kt.py; ours runs in the bench session's
venv. Both build the same layer (hidden 2048, intermediate 768, 64 experts, top-8, as bench/kernel.py)
from the same fp32 weights (one seed: each worker draws them and the digests must agree), each in its
own formats:

- ``rawint4``: ours RAWINT4 group 32 against KTransformers' RAWINT4 group 32 (its runtime's backend for
  the variant: AMXInt4_KGroup_MOE, AVXVNNI256RawInt4_MOE or AVX2RawInt4_MOE), the same bytes per weight;
- ``int8``: ours INT8 per row against its AMXInt8_MOE where the variant has it, else its FP8 E4M3 with
  128x128 block scales (AVX2FP8_MOE): one byte per weight either way, the closest pair there is.

Per CPU variant both ship and this host runs, per thread count (1 .. the CPUs this process may use) and
per token count (decode 1, 2, 4, 8; prefill 64, 256): interleaved rounds (ours then theirs, then theirs
then ours), each timing with a read-bandwidth probe just before and after it, a different expert routing
every call (the same routings for both). Each side's output on one batch is checked against an fp32
reference on the unquantized weights first, so both time a layer that computes the MoE. Rows go to
build/bench/anchor.json (format, variant, tokens, threads, ours_ms, kt_ms, ratio = kt / ours,
bandwidth_fraction of ours) and to the release report's performance table.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import hashlib
import itertools
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from base import paths
from base.paths import ROOT
from locks import indexes

from . import anchor_kt, results
from .ab import counts
from .kernel import EXPERTS, HIDDEN, INTER, TOPK, ReadProbe
from .timing import median_seconds

DECODE = (1, 2, 4, 8)
PREFILL = (64, 256)
ROUTINGS = 16
SEED = 0
FORMATS = ("int8", "rawint4")
VENV = paths.BENCH_ANCHOR / "venv"
LOCK = paths.LOCKFILES / "anchor.txt"
KT_WORKER = ROOT / "bench" / "anchor_kt.py"
THEIRS_VERSION = "0.7.2"
THEIRS = f"kt-kernel {THEIRS_VERSION}"  # the anchor, as the report names it
LOCK_NAME = str(LOCK.relative_to(ROOT))


def say(msg: str) -> None:
    print(msg, flush=True)


def anchor_venv() -> Path:
    """KTransformers' kt-kernel 0.7.2 in its own venv, installed by hash from lockfiles/anchor.txt; reused
    while the lock's bytes are the ones it was made from (its stamp)."""
    stamp = VENV / ".kt-anchor-lock.sha256"
    digest = hashlib.sha256(LOCK.read_bytes()).hexdigest()
    python = VENV / "bin" / "python"
    if python.exists() and stamp.exists() and stamp.read_text().strip() == digest:
        say(f"anchor venv: reused {VENV} (lock sha256 {digest[:16]})")
        return python
    uv = shutil.which("uv")
    if uv is None:
        raise SystemExit("uv is not on PATH: run this through `nox -s bench -- --only anchor`")
    say(f"anchor venv: installing {LOCK.name} (kt-kernel 0.7.2, torch 2.9.1 and its NVIDIA wheels, ~3 GB) into {VENV}")
    shutil.rmtree(VENV, ignore_errors=True)
    subprocess.run([uv, "venv", "--quiet", "--python", sys.executable, str(VENV)], check=True)
    req = indexes.for_install(LOCK, VENV / "requirements.txt")
    subprocess.run(
        [uv, "pip", "install", "--python", str(python), "--require-hashes", *indexes.UV_ARGS, "-r", str(req)],
        check=True,
    )
    stamp.write_text(digest + "\n")
    return python


class Worker:
    """One side in one process: JSON lines in (`load`, `output`, `time`), JSON lines out."""

    def __init__(self, name: str, cmd: list[str], env: dict[str, str]) -> None:
        self.name = name
        self.proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env, cwd=ROOT
        )

    def ask(self, **cmd: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None
        assert self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit(f"{self.name}: the worker exited (code {self.proc.wait()}) on {cmd['op']}")
        reply: dict[str, Any] = json.loads(line)
        if "error" in reply:
            raise SystemExit(f"{self.name}: {reply['error']}")
        return reply

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def ours_worker(threads: int) -> int:
    """Our side of the protocol (this venv's kt_kernel), mirroring bench/anchor_kt.py."""
    import kt_kernel

    layers: dict[str, Any] = {}
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "load":
            ws = anchor_kt.weights(cmd["seed"], cmd["experts"], cmd["hidden"], cmd["inter"])
            reply: dict[str, Any] = {"digest": anchor_kt.digest(ws), "variant": kt_kernel.__cpu_variant__}
            reply["formats"] = {}
            for fmt in cmd["formats"]:
                group = 32 if fmt == "rawint4" else 0
                layers[fmt] = kt_kernel.MoE(*(kt_kernel.quantize(w, fmt, group or 64) for w in ws))
                reply["formats"][fmt] = "RAWINT4 group 32" if group else "INT8 per row"
            del ws
        elif cmd["op"] in ("time", "output"):
            layer = layers[cmd["fmt"]]
            x, routes, w = anchor_kt.inputs(cmd["seed"], cmd["tokens"], cmd["experts"], HIDDEN, TOPK, cmd["routings"])
            if cmd["op"] == "output":
                y = layer(x, routes[0], w, num_threads=threads)
                reply = {"y": y.float().numpy().ravel().tolist()}
            else:
                turn = itertools.cycle(routes)

                def call(layer: Any = layer, x: Any = x, turn: Any = turn, w: Any = w) -> None:
                    layer(x, next(turn), w, num_threads=threads)

                reply = {"s": median_seconds(call, min_reps=5, min_time=cmd["min_time"])}
        else:
            reply = {"error": f"unknown op {cmd['op']!r}"}
        print(json.dumps(reply), flush=True)
    return 0


@functools.cache
def reference_weights() -> list[Any]:
    """The unquantized fp32 weights, drawn once a run (1.2 GB; each check used to draw them again)."""
    return anchor_kt.weights(SEED, EXPERTS, HIDDEN, INTER)


def reference(fmt_outputs: dict[str, list[float]], tokens: int) -> dict[str, float]:
    """Relative error of each output against the fp32 MoE on the unquantized weights."""
    import numpy as np

    gate, up, down = reference_weights()
    x, routes, w = anchor_kt.inputs(SEED + 1, tokens, EXPERTS, HIDDEN, TOPK, ROUTINGS)
    xs, ids, ws = x.float().numpy(), routes[0].numpy(), w.numpy()
    ref = np.zeros_like(xs)
    for t in range(tokens):
        for k in range(TOPK):
            e = ids[t, k]
            h = xs[t] @ gate[e].T
            h = h / (1 + np.exp(-h)) * (xs[t] @ up[e].T)
            ref[t] += ws[t, k] * (h @ down[e].T)
    norm = float(np.linalg.norm(ref))
    return {k: float(np.linalg.norm(np.array(v).reshape(ref.shape) - ref)) / norm for k, v in fmt_outputs.items()}


@functools.cache
def touched_bytes(fmt: str, tokens: int) -> float:
    """Weight bytes one call reads on average (distinct experts of the routings x bytes per expert, ours)."""
    import numpy as np

    _, routes, _ = anchor_kt.inputs(SEED + 2 + tokens, tokens, EXPERTS, HIDDEN, TOPK, ROUTINGS)
    distinct = statistics.mean(len(np.unique(r.numpy())) for r in routes)
    per_weight = 1.0 + 4 / HIDDEN if fmt == "int8" else 0.5 + 4 / 32
    return distinct * 3 * HIDDEN * INTER * per_weight


def common_variants() -> tuple[list[str], dict[str, str]]:
    """The variants both kernels ship and this host runs (ours says why it skips the others)."""
    import kt_kernel

    report = kt_kernel.cpu_report().as_dict()
    usable = [name for name, st in report["variants"].items() if st["usable"]]
    skipped = {name: st["why"] for name, st in report["variants"].items() if not st["usable"]}
    theirs = ["amx", "avx512_bf16", "avx512_vbmi", "avx512_vnni", "avx512_base", "avx2"]  # its _cpu_detect's names
    out = [v for v in usable if v in theirs]
    skipped.update({v: "KTransformers' kt-kernel 0.7.2 ships no such variant" for v in usable if v not in theirs})
    return out, skipped


def check_theirs(reply: dict[str, Any], kt_python: Path) -> None:
    """KT's worker must have imported the anchor's own version (an interpreter given by --kt-python may
    hold another, or a kt_kernel without its metadata, which reports 0.6.1)."""
    if reply.get("version") != THEIRS_VERSION:
        raise SystemExit(
            f"{kt_python} imports kt-kernel {reply.get('version')}, not {THEIRS_VERSION}: the anchor is "
            f"{THEIRS} ({LOCK_NAME}); give --kt-python an interpreter that has it"
        )


def run(
    variants: list[str], threads_list: list[int], rounds: int, min_time: float, kt_python: Path | None = None
) -> dict[str, Any]:
    """kt_python: an interpreter that imports KTransformers' kt-kernel 0.7.2 already (a machine where the
    lock cannot be installed); by default the lock's own venv, made or reused here."""
    import kt_kernel

    source = f"imported by {kt_python}" if kt_python else LOCK_NAME
    kt_python = kt_python or anchor_venv()
    host = kt_kernel.cpu_report().as_dict()
    common, skipped = common_variants()
    chosen = [v for v in common if not variants or v in variants]
    for name, why in skipped.items():
        say(f"{name}: skipped ({why})")
    probes = {n: ReadProbe(n) for n in threads_list}  # each timing beside a probe with its own thread count
    rows: list[dict[str, Any]] = []
    checks: list[dict[str, Any]] = []
    formats: dict[str, dict[str, str]] = {}
    load = {
        "op": "load",
        "seed": SEED,
        "experts": EXPERTS,
        "hidden": HIDDEN,
        "inter": INTER,
        "topk": TOPK,
        "max_len": max(PREFILL),
        "formats": list(FORMATS),
    }
    for variant in chosen:
        for threads in threads_list:
            probe = probes[threads]
            env = {k: v for k, v in os.environ.items() if not k.startswith("KT_KERNEL_")}
            env.update(KT_KERNEL_CPU_VARIANT=variant, OMP_NUM_THREADS=str(threads))
            t0 = time.perf_counter()
            ours = Worker("ours", [sys.executable, "-m", "bench.anchor", "--worker", str(threads)], env)
            kt = Worker(THEIRS, [str(kt_python), str(KT_WORKER), str(threads)], env)
            loaded = {w.name: w.ask(**load) for w in (ours, kt)}
            if loaded["ours"]["digest"] != loaded[THEIRS]["digest"]:
                raise SystemExit("the two workers drew different weights from one seed (numpy streams differ)")
            check_theirs(loaded[THEIRS], kt_python)
            for side, reply in loaded.items():
                if reply["variant"] != variant:
                    raise SystemExit(f"{side} loaded variant {reply['variant']}, not {variant}")
            formats[variant] = {
                fmt: f"ours {loaded['ours']['formats'][fmt]} / KT {loaded[THEIRS]['formats'][fmt]}" for fmt in FORMATS
            }
            say(f"{variant} x{threads}: both layers built in {time.perf_counter() - t0:.0f}s")
            for fmt in FORMATS:
                outs = {
                    w.name: w.ask(op="output", fmt=fmt, tokens=4, seed=SEED + 1, experts=EXPERTS, routings=ROUTINGS)[
                        "y"
                    ]
                    for w in (ours, kt)
                }
                err = reference(outs, 4)
                checks.append({"variant": variant, "threads": threads, "format": fmt, "relative_error": err})
                say(f"{variant} x{threads} {fmt}: error against fp32 ours {err['ours']:.3f}, KT {err[THEIRS]:.3f}")
            for fmt, tokens in itertools.product(FORMATS, (*DECODE, *PREFILL)):
                times: dict[str, list[float]] = {"ours": [], THEIRS: []}
                fractions = []
                reads = []
                for r in range(rounds):
                    order = (ours, kt) if r % 2 == 0 else (kt, ours)
                    for w in order:
                        before = probe()
                        s = w.ask(
                            op="time",
                            fmt=fmt,
                            tokens=tokens,
                            seed=SEED + 2 + tokens,
                            experts=EXPERTS,
                            routings=ROUTINGS,
                            min_time=min_time,
                        )["s"]
                        after = probe()
                        times[w.name].append(s)
                        reads.append((before + after) / 2)
                        if w is ours:
                            fractions.append(touched_bytes(fmt, tokens) / s / 1e9 / ((before + after) / 2))
                o, k = statistics.median(times["ours"]), statistics.median(times[THEIRS])
                row = {
                    "format": fmt,
                    "variant": variant,
                    "tokens": tokens,
                    "threads": threads,
                    "ours_ms": o * 1e3,
                    "kt_ms": k * 1e3,
                    "ratio": k / o,
                    "bandwidth_fraction": statistics.median(fractions),
                    "read_gb_per_s": statistics.median(reads),
                }
                rows.append(row)
                say(
                    f"{variant:<12} x{threads} {fmt:<7} T={tokens:<4} ours {o * 1e3:8.2f} ms  KT {k * 1e3:8.2f} ms  "
                    f"x{k / o:5.2f}  ours at {row['bandwidth_fraction']:4.0%} of {row['read_gb_per_s']:.1f} GB/s"
                )
            for w in (ours, kt):
                w.close()
    return {
        "produced": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "cpu": host["brand"],
        "threads": threads_list,
        "rounds": rounds,
        "layer": {"hidden": HIDDEN, "intermediate": INTER, "experts": EXPERTS, "topk": TOPK},
        "anchor": f"{THEIRS} ({source})",
        "formats": formats,
        "skipped": skipped,
        "checks": checks,
        "rows": rows,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="nox -s bench -- --only anchor")
    p.add_argument("--json", type=Path, default=paths.BENCH_JSON["anchor"])
    p.add_argument("--variant", action="append", default=[], help="only these CPU variants (default: every common one)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--min-time", type=float, default=0.3, help="seconds of calls per timing")
    p.add_argument(
        "--threads", type=counts, help="thread counts, comma-separated (default: 1, half the CPUs and every CPU)"
    )
    p.add_argument(
        "--kt-python",
        type=Path,
        help=f"a Python that imports KTransformers' {THEIRS} already, instead of the lock's venv "
        f"(for a machine that cannot install {LOCK_NAME}, e.g. one offline)",
    )
    p.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        return ours_worker(args.worker)
    if args.kt_python is not None and shutil.which(str(args.kt_python)) is None:
        p.error(f"--kt-python {args.kt_python}: no such executable")
    import kt_kernel

    known = list(kt_kernel.cpu_report().as_dict()["variants"])
    unknown = sorted(set(args.variant) - set(known))
    if unknown:
        p.error(f"--variant {', '.join(unknown)}: not a CPU variant of kt-kernel (known: {', '.join(known)})")
    cpus = len(os.sched_getaffinity(0))
    # Half the CPUs too: at every CPU, KT's pool (a spinning thread per worker beside the submitting
    # thread) oversubscribes the machine, and its times sit at multiples of 8 ms.
    threads = sorted(set(args.threads or {1, max(1, cpus // 2), cpus}))
    result = run(args.variant, threads, args.rounds, args.min_time, args.kt_python)
    results.write(args.json, result)
    say(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
