"""Benchmark: the audit on the largest wheel we have (torch CPU, 183 MB), on a 2 GiB zip bomb, and
on every wheel of the audit corpus (the integration tests' cache: real PyPI wheels of every libc and
architecture, auditwheel's own test wheels), beside `auditwheel show` measured in the same run on
the same files.

Each measurement runs in a fresh child process so its peak RSS (getrusage of the child) is
its own: python -m bench.audit [--wheel PATH] [--corpus DIR] [--json FILE]."""

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


# Both tools run as an installed tool does: from compiled bytecode (pip compiles it at install; a
# PYTHONDONTWRITEBYTECODE=1 shell would make every run compile its modules again, the larger tool more).
_ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def measure(cmd: list[str]) -> dict[str, Any]:
    """Wall time and peak RSS of one child process (the audit's exit code is data, not failure)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=_ENV)
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


def corpus(root: Path) -> dict[str, Any]:
    """Each corpus wheel under `root`, audited and shown by auditwheel one child process at a time:
    per-wheel time and RSS ratios (median, worst) and the totals."""
    import statistics

    py = sys.executable
    wheels = sorted(root.rglob("*.whl"))
    rows = []
    for warm in wheels[:1]:  # compile both tools' bytecode and fill the audit's schema-check memo once
        measure([py, "-m", "audits", "--policy", "third-party", str(warm)])
        measure([py, "-m", "auditwheel", "show", str(warm)])
    for i, w in enumerate(wheels, 1):
        print(f"[bench audit] corpus {i}/{len(wheels)}: {w.name}", flush=True)
        ours = measure([py, "-m", "audits", "--policy", "third-party", str(w)])
        theirs = measure([py, "-m", "auditwheel", "show", str(w)])
        rows.append((w.name, ours, theirs))
    if not rows:
        return {}
    time_ratios = [o["wall_s"] / max(t["wall_s"], 0.01) for _, o, t in rows]
    rss_ratios = [o["peak_rss_mib"] / max(t["peak_rss_mib"], 1) for _, o, t in rows]
    worst = max(range(len(rows)), key=lambda i: time_ratios[i])
    worst_rss = max(range(len(rows)), key=lambda i: rss_ratios[i])
    ours_total = sum(o["wall_s"] for _, o, _ in rows)
    theirs_total = sum(t["wall_s"] for _, _, t in rows)
    return {
        "wheels": len(rows),
        "ours_total_s": round(ours_total, 2),
        "auditwheel_total_s": round(theirs_total, 2),
        "total_ratio": round(ours_total / max(theirs_total, 0.01), 2),
        "time_ratio_median": round(statistics.median(time_ratios), 2),
        "time_ratio_worst": round(time_ratios[worst], 2),
        "time_ratio_worst_wheel": rows[worst][0],
        "rss_ratio_median": round(statistics.median(rss_ratios), 2),
        "rss_ratio_worst": round(rss_ratios[worst_rss], 2),
        "rss_ratio_worst_wheel": rows[worst_rss][0],
        "over_targets": [
            f"{n}: time {tr:.2f}x, RSS {rr:.2f}x"
            for (n, _, _), tr, rr in zip(rows, time_ratios, rss_ratios, strict=True)
            if tr > TIME_TARGET or rr > RSS_TARGET
        ],
        "per_wheel": {
            n: {"ours": o, "auditwheel": t, "time_ratio": round(tr, 2), "rss_ratio": round(rr, 2)}
            for (n, o, t), tr, rr in zip(rows, time_ratios, rss_ratios, strict=True)
        },
    }


TIME_TARGET, RSS_TARGET, TOTAL_TARGET = 3.0, 2.0, 1.0  # per wheel (time, peak RSS) and the corpus's total time


def table(c: dict[str, Any], top: int = 12) -> list[str]:
    """The wheels with the highest time ratio, each with its RSS ratio, beside auditwheel."""
    rows = sorted(c["per_wheel"].items(), key=lambda kv: -kv[1]["time_ratio"])[:top]
    out = [f"  {'wheel':<72} {'ours s':>7} {'aw s':>6} {'time':>6} {'ours MiB':>9} {'aw MiB':>7} {'RSS':>6}"]
    for name, r in rows:
        o, t = r["ours"], r["auditwheel"]
        out.append(
            f"  {name[:72]:<72} {o['wall_s']:>7} {t['wall_s']:>6} {r['time_ratio']:>5}x {o['peak_rss_mib']:>9} "
            f"{t['peak_rss_mib']:>7} {r['rss_ratio']:>5}x"
        )
    return out


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
    p.add_argument(
        "--corpus",
        type=Path,
        default=paths.CACHE / "corpus",
        help="a directory of wheels to measure one by one (default: the audit corpus cache; nox -s tests fills it)",
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
    if args.corpus.is_dir():
        results["corpus"] = c = corpus(args.corpus)
        if c:
            print(
                f"  corpus of {c['wheels']} wheels: audit {c['ours_total_s']} s, auditwheel "
                f"{c['auditwheel_total_s']} s: {c['total_ratio']}x (target <= {TOTAL_TARGET}x)",
                f"\n  per wheel time ratio median {c['time_ratio_median']}x, worst {c['time_ratio_worst']}x "
                f"({c['time_ratio_worst_wheel']}; target <= {TIME_TARGET}x)",
                f"\n  peak RSS ratio median {c['rss_ratio_median']}x, worst {c['rss_ratio_worst']}x "
                f"({c['rss_ratio_worst_wheel']}; target <= {RSS_TARGET}x)",
                flush=True,
            )
            print("\n".join(table(c)), flush=True)
            over = c["over_targets"]
            print(f"  over a per-wheel target: {len(over)}" + "".join(f"\n    {x}" for x in over), flush=True)
    else:
        print(f"  corpus: {args.corpus} is missing (nox -s tests downloads it); not measured", flush=True)
    bench_results.write(args.json, results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
