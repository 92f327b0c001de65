"""The release engineer's loop, timed: `nox -s bench -- --only release`.

In a clone of HEAD (build/bench-release/tree; the upstream downloads are shared with this tree's
build/cache/inputs, so "cold" means a cold build, not a cold network), in one run:

- ``cold``: `nox -s release` in the new clone (kernel, assembly, audit, every profile);
- ``no-op``: `nox -s build_all`, then `nox -s release`, nothing changed;
- ``reference``: `nox -s release -- --fresh`, nothing changed: what every release cost before stages
  were keyed by content (each stage re-run; the wheel memo and the kernel stamp bypassed);
- ``kernel line``: one line added to a kernel source, then `nox -s release`: which stages ran and which
  were reused (only what installs the new kt-kernel should run).

Each row: scenario, command, seconds, and the stages that ran and were reused (from the stage records'
own lines). `--scenario` picks some; `--no-verify` times build_all and audit only (minutes, not the
profiles' fresh venvs). Writes build/bench-release.json.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from base import paths
from base.errors import StageError, report

from . import results
from .errors import BenchError

SCENARIOS = ("cold", "no-op", "reference", "kernel line")
KERNEL_LINE = Path("kernel/src/cpu/moe.cpp")  # a source every CPU variant compiles
_RAN = re.compile(r"\[cache [\d:]+\] (\S+): running")
_REUSED = re.compile(r"\[cache [\d:]+\] (\S+): reused")
_KERNEL_REUSED = re.compile(r"^kt-kernel: .* reused, not rebuilt", re.MULTILINE)  # build_wheel.py's own line


def _say(msg: str) -> None:
    print(f"[bench-release] {msg}", flush=True)


def outcomes(out: str, *, builds_kernel: bool) -> tuple[list[str], list[str]]:
    """(the stages that ran, those reused) from a session's output: base.stagecache's own lines, and for
    a session that builds the kernel, build_wheel.py's line when its stamp held."""
    ran, reused = _RAN.findall(out), _REUSED.findall(out)
    if builds_kernel:
        (reused if _KERNEL_REUSED.search(out) else ran).insert(0, "kt-kernel")
    return ran, reused


def _clone(tree: Path) -> None:
    if tree.exists():
        shutil.rmtree(tree)
    tree.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["git", "clone", "-q", "--local", str(paths.ROOT), str(tree)], check=True)
    _say(f"cloned HEAD into {tree}; installing nox there (not timed)")
    subprocess.run([sys.executable, "-m", "venv", str(tree / ".venv")], check=True)
    pip = [str(tree / ".venv/bin/pip"), "install", "-q", "--require-hashes", "-r", str(tree / "lockfiles/nox.txt")]
    subprocess.run(pip, check=True)


def _nox(tree: Path, session: str, *args: str) -> dict[str, Any]:
    """One timed nox session in the clone; its output is kept in build/bench-release/<n>.log."""
    env = {k: v for k, v in os.environ.items() if k not in ("KT_FRESH",)}
    env["KT_RELEASE_CACHE"] = str(paths.CACHE / "inputs")  # the upstream downloads, shared
    cmd = [str(tree / ".venv/bin/nox"), "-s", session, *(["--", *args] if args else [])]
    _say(f"{' '.join(cmd[1:])} ...")
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - t0
    log = tree.parent / f"{session}-{int(time.time())}.log"
    log.write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        raise BenchError(f"nox -s {session} {' '.join(args)} failed in {tree} (exit {proc.returncode}); see {log}")
    ran, reused = outcomes(proc.stdout + proc.stderr, builds_kernel=session in ("build_all", "release"))
    _say(f"  {seconds:.1f} s; ran: {', '.join(ran) or 'nothing'}; reused: {', '.join(reused) or 'nothing'}")
    command = f"nox -s {session} {' '.join(args)}".strip()
    return {"command": command, "seconds": round(seconds, 1), "ran": ran, "reused": reused}


def run(scenarios: list[str], tree: Path, verify: bool) -> list[dict[str, Any]]:
    """The scenarios in order, in one clone."""
    target = "release" if verify else "build_all"
    rows: list[dict[str, Any]] = []

    def row(scenario: str, session: str, *args: str) -> None:
        rows.append({"scenario": scenario, **_nox(tree, session, *args)})
        if not verify and session == "build_all":
            rows.append({"scenario": scenario, **_nox(tree, "audit", *args)})

    _clone(tree)
    if "cold" in scenarios:
        row("cold", target)
    elif any(s in scenarios for s in ("no-op", "reference", "kernel line")):
        _say("no cold scenario asked for; building once first (not reported)")
        _nox(tree, target)
        if not verify:  # the audit too: a no-op audit row must find its last run's record
            _nox(tree, "audit")
    if "no-op" in scenarios:
        row("no-op", "build_all")
        if verify:
            row("no-op", "release")
    if "reference" in scenarios:
        row("reference", target, "--fresh")
    if "kernel line" in scenarios:
        source = tree / KERNEL_LINE
        # a line of code, not a comment: a comment compiles to the same library, and so the same wheel
        source.write_text(source.read_text() + "static volatile int kt_bench_one_line = 1;\n")
        row("kernel line", target)
    return rows


def main(argv: list[str] | None = None) -> int:
    """0 measured (the rows on stdout and in --json), 1 a session failed (the log named)."""
    p = argparse.ArgumentParser(prog="nox -s bench -- --only release")
    p.add_argument("--scenario", action="append", choices=SCENARIOS, help="default: all, in this order")
    p.add_argument("--no-verify", action="store_true", help="time build_all and audit only, not verify_install")
    p.add_argument("--tree", type=Path, default=paths.BENCH_RELEASE)
    p.add_argument("--json", type=Path, default=paths.BENCH_JSON["release"])
    args = p.parse_args(argv)
    try:
        rows = run(list(args.scenario or SCENARIOS), args.tree / "tree", not args.no_verify)
    except (StageError, OSError, subprocess.CalledProcessError) as exc:
        return report(exc)
    width = max(len(r["command"]) for r in rows)
    print(f"\n{'scenario':<12} {'command':<{width}} {'seconds':>8}  ran / reused")
    for r in rows:
        print(
            f"{r['scenario']:<12} {r['command']:<{width}} {r['seconds']:8.1f}  "
            f"{', '.join(r['ran']) or '-'} / {', '.join(r['reused']) or '-'}"
        )
    results.write(args.json, {"rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
