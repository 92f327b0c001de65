"""`nox -s bench -- --only ab --against REV`: this tree's CPU MoE kernels against another revision's, in one
process, the two builds alternating call by call.

This is how a kernel change is measured here: the project's 2-CPU hosts move by up to half between runs of
the same code (`nox -s bench -- --only anchor` sets each timing beside a bandwidth probe for that reason),
while two builds timed call by call in one process agree within ~1% (an A/A run: `--against HEAD` on a
clean tree).

REV's kt-kernel is built from `git archive REV` (the sources alone: the build never reads .git) by that
revision's own kernel/tools/build_wheel.py, one CPU variant at a time, into build/bench-ab/<commit>/ and
reused while it is there; this tree's is the bench session's wheel (build/bench-kernel). Both variant
libraries are loaded into this process (kt_kernel._core.Variant) and every call of one layer (hidden 2048,
intermediate 768, 64 experts, top-8, as bench/kernel.py; weights from one seed; each call one of 16
routings) goes to one of them in turn, the order flipped every round. The two outputs of the first
routing are compared bit for bit: a change meant to move only time says so. Rows (variant, format,
threads, tokens, a_ms for REV, b_ms for this tree, ratio = b / a, identical) go to build/bench-ab.json.
"""

from __future__ import annotations

import argparse
import datetime
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path
from typing import Any, Literal

from base import paths
from base.paths import ROOT

from . import results
from .kernel import EXPERTS, HIDDEN, INTER, TOPK

ROUTINGS = 16
SEED = 0
TOKENS = (1, 2, 4, 8, 64, 256)
FORMATS = ("rawint4", "int8")


def say(msg: str) -> None:
    print(msg, flush=True)


def commit_of(rev: str) -> str:
    """The commit REV names in this repository, or a usage error naming REV."""
    proc = subprocess.run(
        ["git", "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise SystemExit(f"--against {rev}: not a commit of this repository (git rev-parse found none); name a commit")
    return proc.stdout.strip()


def library_in(wheel: Path, variant: str, into: Path) -> Path:
    """A kt-kernel wheel's library of `variant`, the wheel unpacked into `into` unless it already is there
    (the wheel's build manifest says where the library lies)."""
    if not into.is_dir():  # unpacked beside it, then renamed: an interrupted run leaves no half-unpacked wheel
        partial = into.with_name(into.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        with zipfile.ZipFile(wheel) as zf:
            zf.extractall(partial)  # noqa: S202 - a wheel this module built from a commit of this repository
        partial.rename(into)
    manifest = json.loads((into / "kt_kernel" / "_build.json").read_text())
    entry = manifest["variants"].get(variant)
    if entry is None:
        raise SystemExit(f"{wheel}: holds no {variant} variant (it has {', '.join(manifest['variants'])})")
    return into / str(entry["file"])


def revision_library(commit: str, variant: str) -> Path:
    """REV's library of `variant`, built once per commit and variant into build/bench-ab/<commit>/."""
    root = paths.BENCH_AB / commit[:12]
    out = root / variant
    unpacked = out / "unpacked"
    wheels = sorted(out.glob("kt_kernel-*.whl"))
    if wheels:
        say(f"{commit[:12]} {variant}: reusing {wheels[-1].name}")
        return library_in(wheels[-1], variant, unpacked)
    src = root / "src"
    if not (src / "kernel" / "tools" / "build_wheel.py").exists():
        say(f"{commit[:12]}: unpacking its sources (git archive) into {src}")
        archive = subprocess.run(["git", "archive", "--format=tar", commit], cwd=ROOT, capture_output=True, check=True)
        src.mkdir(parents=True, exist_ok=True)
        with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tf:
            tf.extractall(src, filter="data")
    say(f"{commit[:12]} {variant}: building its kt-kernel (this variant only) into {out}")
    log = root / f"build-{variant}.log"
    with log.open("w") as fh:
        build = src / "kernel" / "tools" / "build_wheel.py"
        cmd = [sys.executable, str(build), "--dist", str(out), "--variant", variant]
        proc = subprocess.run(cmd, cwd=src, stdout=fh, stderr=subprocess.STDOUT, check=False)
    wheels = sorted(out.glob("kt_kernel-*.whl"))
    if proc.returncode != 0 or not wheels:
        raise SystemExit(f"building {commit[:12]}'s {variant} failed (exit {proc.returncode}); its log: {log}")
    return library_in(wheels[-1], variant, unpacked)


def this_library(variant: str) -> Path:
    """This tree's library of `variant`: the installed kt-kernel's (the bench session installs its own build)."""
    import kt_kernel

    entry = kt_kernel.build_manifest()["variants"][variant]
    return Path(kt_kernel.__file__).resolve().parent.parent / str(entry["file"])


def load(path: Path, what: str) -> Any:
    from kt_kernel import _core

    try:
        return _core.Variant(str(path))
    except RuntimeError as exc:  # another CPU ABI, or not a variant library
        raise SystemExit(f"{what}: {exc}; compare revisions whose kernels share this tree's CPU ABI") from None


def build_layers(formats: list[str]) -> dict[str, Any]:
    """Format -> the layer both builds run, on the anchor's weights (bench/anchor_kt.py, one seed)."""
    import kt_kernel

    from .anchor_kt import weights

    ws = weights(SEED, EXPERTS, HIDDEN, INTER)
    layers = {}
    for fmt in formats:
        f: Literal["int8", "rawint4"] = "rawint4" if fmt == "rawint4" else "int8"
        layers[fmt] = kt_kernel.MoE(*(kt_kernel.quantize(w, f, 32 if f == "rawint4" else 64) for w in ws))
    return layers


def compare(
    builds: tuple[Any, Any], layer: Any, threads: int, tokens: int, calls: int
) -> tuple[list[float], list[float], bool]:
    """Seconds per call of each build, alternating call by call, and whether their outputs are identical."""
    import kt_kernel
    import numpy as np

    rng = np.random.default_rng(SEED + tokens)
    x = rng.standard_normal((tokens, HIDDEN), dtype=np.float32)
    w = rng.random((tokens, TOPK), dtype=np.float32)
    routes = [np.stack([rng.permutation(EXPERTS)[:TOPK] for _ in range(tokens)]) for _ in range(ROUTINGS)]
    outs = []
    for b in builds:
        kt_kernel._VARIANT = b  # the process's variant, as the layer looks it up on every call
        outs.append(np.asarray(layer(x, routes[0], w, num_threads=threads)))
    identical = bool(np.array_equal(outs[0], outs[1]))
    times: tuple[list[float], list[float]] = ([], [])
    for i in range(calls + 2):  # the first round of each is a warm-up
        for j in (0, 1) if i % 2 == 0 else (1, 0):
            kt_kernel._VARIANT = builds[j]
            t0 = time.perf_counter()
            layer(x, routes[i % ROUTINGS], w, num_threads=threads)
            if i >= 2:
                times[j].append(time.perf_counter() - t0)
    return times[0], times[1], identical


def counts(text: str) -> list[int]:
    """A comma-separated list of whole numbers of at least 1 (--tokens, --threads)."""
    try:
        values = [int(t) for t in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give comma-separated whole numbers, e.g. 1,8,64") from None
    if any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"{text!r}: every count must be at least 1")
    return values


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="nox -s bench -- --only ab --against REV")
    p.add_argument("--against", required=True, help="the revision to compare this tree with (a commit, tag, branch)")
    p.add_argument("--variant", action="append", default=[], help="CPU variants (default: the one this host selects)")
    p.add_argument("--format", action="append", default=[], choices=FORMATS, help="weight formats (default: both)")
    p.add_argument("--threads", type=counts, help="thread counts, comma-separated (default: 1 and every CPU)")
    p.add_argument("--tokens", type=counts, default=list(TOKENS), help="token counts, comma-separated")
    p.add_argument("--calls", type=int, default=100, help="calls of each build at 8 tokens (more below, fewer above)")
    p.add_argument("--json", type=Path, default=paths.BENCH_JSON["ab"])
    args = p.parse_args(argv)
    import kt_kernel

    report = kt_kernel.cpu_report().as_dict()
    variants = args.variant or [report["selected"]]
    unknown = sorted(set(variants) - set(report["variants"]))
    if unknown:
        known = ", ".join(report["variants"])
        p.error(f"--variant {', '.join(unknown)}: not a CPU variant of kt-kernel (known: {known})")
    tokens: list[int] = args.tokens
    threads: list[int] = args.threads or sorted({1, len(os.sched_getaffinity(0))})
    commit = commit_of(args.against)
    formats = args.format or list(FORMATS)
    rows: list[dict[str, Any]] = []
    skipped = {v: report["variants"][v]["why"] for v in variants if not report["variants"][v]["usable"]}
    for v, why in skipped.items():
        say(f"{v}: skipped ({why})")
    runnable = [v for v in variants if v not in skipped]
    if runnable:
        say(f"layer: hidden {HIDDEN}, intermediate {INTER}, {EXPERTS} experts, top-{TOPK}; quantizing {formats}")
        layers = build_layers(formats)
    for v in runnable:
        builds = (load(revision_library(commit, v), f"{args.against} {v}"), load(this_library(v), f"this tree's {v}"))
        for fmt in formats:
            for n in threads:
                for t in tokens:
                    calls = max(10, round(args.calls * (8 / t) ** 0.5))
                    a, b, same = compare(builds, layers[fmt], n, t, calls)
                    row = {
                        "variant": v,
                        "format": fmt,
                        "threads": n,
                        "tokens": t,
                        "a_ms": statistics.median(a) * 1e3,
                        "b_ms": statistics.median(b) * 1e3,
                        "identical": same,
                    }
                    row["ratio"] = row["b_ms"] / row["a_ms"]
                    rows.append(row)
                    say(
                        f"{v:<12} x{n} {fmt:<7} T={t:<4} {args.against} {row['a_ms']:8.3f} ms  this tree "
                        f"{row['b_ms']:8.3f} ms  x{row['ratio']:.3f}  outputs {'identical' if same else 'DIFFER'}"
                    )
    result = {
        "produced": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "cpu": report["brand"],
        "against": {"rev": args.against, "commit": commit},
        "layer": {"hidden": HIDDEN, "intermediate": INTER, "experts": EXPERTS, "topk": TOPK},
        "skipped": skipped,
        "rows": rows,
    }
    results.write(args.json, result)
    say(f"wrote {args.json} (ratio = this tree's ms / {args.against}'s; below 1 is faster)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
