"""kt-prepare-data benchmark (`nox -s bench -- --only data_prep`): examples per second serial
(--workers 1, the reference) against parallel (--workers = the cores) in the same run, on a
synthetic set of multi-turn conversations and the test's tiny Kimi-style tokenizer; the outputs
must be byte-identical. Wall time includes each run's start (imports, tokenizer load per worker).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from base import paths
from base.errors import StageError, report
from base.paths import ROOT

from . import results
from .errors import BenchError

MAKE_TOKENIZER = ROOT / "tests" / "integration" / "scripts" / "make_chat_tokenizer.py"
WORDS = (
    "wheel",
    "release",
    "kernel",
    "expert",
    "router",
    "token",
    "cache",
    "archive",
    "audit",
    "lock",
    "hash",
    "variant",
    "layer",
    "adapter",
    "rank",
    "gradient",
    "optimizer",
    "resume",
    "template",
    "assistant",
    "user",
    "system",
    "packing",
    "label",
    "mask",
    "split",
    "seed",
    "shard",
)


def dataset(path: Path, n: int) -> None:
    """`n` ShareGPT-style conversations of 1-4 exchanges, 8-60 words a turn (seeded, so the same file)."""
    rng = random.Random(0)  # noqa: S311  (test data, not secrets)
    with path.open("w", encoding="utf-8") as f:
        for _ in range(n):
            turns = []
            for _ in range(rng.randint(1, 4)):
                for who in ("human", "gpt"):
                    turns.append({"from": who, "value": " ".join(rng.choices(WORDS, k=rng.randint(8, 60))) + "."})
            f.write(json.dumps({"conversations": turns}) + "\n")


def run(args: list[str]) -> tuple[float, str]:
    """Seconds of one kt-prepare-data run and its summary line."""
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "kt_kernel.data_prep", *args], capture_output=True, text=True, check=False
    )
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        raise BenchError(f"kt-prepare-data {' '.join(args)} failed:\n{proc.stderr[-3000:]}")
    return seconds, proc.stdout.splitlines()[0]


def digest(out: Path) -> str:
    """sha256 over the three output files."""
    h = hashlib.sha256()
    for name in ("train.jsonl", "eval.jsonl", "manifest.json"):
        h.update((out / name).read_bytes())
    return h.hexdigest()


def _main(argv: list[str] | None) -> int:
    """Serial vs parallel preparation and verification; prints a table and writes --json."""
    p = argparse.ArgumentParser(prog="python -m bench.data_prep")
    p.add_argument("--examples", type=int, default=8000)
    p.add_argument("--json", type=Path, default=paths.BENCH_JSON["data_prep"])
    args = p.parse_args(argv)
    work = paths.BENCH_SCRATCH[1]
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    subprocess.run([sys.executable, str(MAKE_TOKENIZER), str(work / "tok")], check=True, capture_output=True)
    data = work / "chats.jsonl"
    dataset(data, args.examples)
    cores = len(os.sched_getaffinity(0))
    rows: list[dict[str, Any]] = []
    digests = set()
    print(f"data prep: {args.examples} conversations (1-4 exchanges), tiny BPE tokenizer, {cores} cores")
    for workers in sorted({1, cores}):
        out = work / f"out-{workers}"
        seconds, summary = run(
            [str(data), "--tokenizer", str(work / "tok"), "--out", str(out), "--workers", str(workers)]
        )
        vseconds, _ = run(
            [str(data), "--tokenizer", str(work / "tok"), "--verify", str(out), "--workers", str(workers)]
        )
        digests.add(digest(out))
        row = {
            "workers": workers,
            "seconds": seconds,
            "examples_per_s": args.examples / seconds,
            "verify_seconds": vseconds,
            "summary": summary,
        }
        rows.append(row)
        print(
            f"  --workers {workers}: {seconds:.1f} s ({row['examples_per_s']:.0f} ex/s), "
            f"--verify {vseconds:.1f} s | {summary}"
        )
    same = len(digests) == 1
    print(f"  outputs byte-identical across worker counts: {same}")
    if len(rows) > 1:
        print(f"  parallel / serial: {rows[0]['seconds'] / rows[-1]['seconds']:.2f}x")
    results.write(args.json, {"examples": args.examples, "cores": cores, "rows": rows, "same": same})
    return 0 if same else 1


def main(argv: list[str] | None = None) -> int:
    """The CLI: errors a user can fix are one `error:` line and exit 1, never a traceback."""
    try:
        return _main(argv)
    except StageError as exc:
        return report(exc)


if __name__ == "__main__":
    raise SystemExit(main())
