"""Benchmark: the audit on the largest wheel we have (torch CPU, 183 MB) and on a 2 GiB zip bomb,
beside `auditwheel show` measured in the same run on the same files.

Each measurement runs in a fresh child process so its peak RSS (getrusage of the child) is
its own: python -m bench.audit [--wheel PATH] [--json FILE]."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any

from base import paths
from base.paths import ROOT
from locks import indexes

from . import results as bench_results

TORCH = "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"


def measure(cmd: list[str]) -> dict[str, Any]:
    """Wall time and peak RSS of one child process (the audit's exit code is data, not failure)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    _, rusage = os.wait4(proc.pid, 0)[1:]
    wall = time.perf_counter() - t0
    err = proc.stderr.read() if proc.stderr else ""
    return {"wall_s": round(wall, 2), "peak_rss_mib": round(rusage.ru_maxrss / 1024, 1), "stderr_tail": err[-300:]}


def zip_bomb(path: Path, gib: float = 2.0) -> Path:
    """A ~2 MB wheel whose one member inflates to `gib` GiB of zeros."""
    di = "bomb-1.0.dist-info"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr(f"{di}/METADATA", "Metadata-Version: 2.1\nName: bomb\nVersion: 1.0\n")
        zf.writestr(f"{di}/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        zf.writestr(f"{di}/RECORD", "")
        with zf.open("bomb/zeros.bin", "w", force_zip64=True) as fh:
            block = bytes(16 << 20)
            for _ in range(int(gib * 64)):
                fh.write(block)
    return path


def main(argv: list[str] | None = None) -> int:
    """Audit time and peak RSS on the torch wheel and a zip bomb, beside auditwheel show."""
    p = argparse.ArgumentParser(prog="python -m bench.audit")
    local = indexes.mirror()
    p.add_argument(
        "--wheel",
        type=Path,
        default=(local or paths.CACHE / "corpus") / TORCH,
        help="the wheel to measure (default: the torch CPU wheel from the local mirror or the corpus cache)",
    )
    p.add_argument("--json", type=Path, default=paths.BENCH_JSON["audit"])
    args = p.parse_args(argv)
    if not args.wheel.is_file():
        print(f"error: {args.wheel} not found; pass --wheel with a large wheel to measure", file=sys.stderr)
        return 2
    py = sys.executable
    results: dict[str, Any] = {"wheel": args.wheel.name, "wheel_mib": round(args.wheel.stat().st_size / 2**20, 1)}
    with tempfile.TemporaryDirectory(prefix="kt-bench-audit-") as tmp:
        print(f"[bench audit] {args.wheel.name}: python -m audits --policy third-party ...", flush=True)
        results["ours"] = measure(
            [py, "-m", "audits", "--policy", "third-party", "--json", f"{tmp}/r.json", str(args.wheel)]
        )
        print(f"[bench audit] {args.wheel.name}: auditwheel show ...", flush=True)
        results["auditwheel"] = measure([py, "-m", "auditwheel", "show", str(args.wheel)])
        print("[bench audit] writing a 2 GiB zip bomb ...", flush=True)
        bomb = zip_bomb(Path(tmp) / "bomb-1.0-py3-none-any.whl")
        results["bomb_mib"] = round(bomb.stat().st_size / 2**20, 2)
        results["bomb"] = measure([py, "-m", "audits", "--policy", "third-party", str(bomb)])
    ours, theirs = results["ours"], results["auditwheel"]
    results["time_ratio"] = round(ours["wall_s"] / theirs["wall_s"], 2)
    rows = [
        ("", "wall s", "peak RSS MiB"),
        (f"audit ({results['wheel_mib']} MiB wheel)", ours["wall_s"], ours["peak_rss_mib"]),
        ("auditwheel show (same wheel)", theirs["wall_s"], theirs["peak_rss_mib"]),
        (
            f"audit (zip bomb, {results['bomb_mib']} MiB -> 2 GiB)",
            results["bomb"]["wall_s"],
            results["bomb"]["peak_rss_mib"],
        ),
    ]
    for a, b, c in rows:
        print(f"  {a:<44} {b!s:>8} {c!s:>13}")
    print(
        f"  audit / auditwheel wall time: {results['time_ratio']}x (target <= 0.5x); peak RSS targets <= 256 MiB",
        flush=True,
    )
    bench_results.write(args.json, results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
