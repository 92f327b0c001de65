"""`nox -s bench`: python -m bench [--only PART] [options]; the session installs the test lock and passes
its arguments here.

A plain run measures, each beside its reference in the same run: the audit (beside auditwheel), the
CUDA payload on dist/ (beside gzip, and beside KTransformers 0.7.2's own five carriers from PyPI,
both installed into fresh venvs), kernel throughput per CPU variant (beside torch bf16 and the
bandwidth roofline), kt_kernel.sft forward+backward (beside torch autograd) and kt-prepare-data (serial
beside parallel). The kernel parts run on a CPU-only kt-kernel of their own (build/bench-kernel):
build/kt-kernel/out holds the release's input, which a bench run must not replace.

Parts a plain run leaves out: `--only release` (the release loop in a clone: cold, no-op, --fresh, one
kernel line changed), `--only anchor` (KTransformers' own kt-kernel, ~3 GB of wheels) and `--only ab
--against REV` (this tree's CPU kernels against REV's, call by call in one process).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from base import paths
from base.cli import dist_option
from base.errors import StageError, report
from locks import indexes

from .errors import BenchError

PARTS = ("audit", "payload", "kernel", "sft", "data_prep", "release", "anchor", "ab")
PLAIN = ("audit", "payload", "kernel", "sft", "data_prep")  # what a run without --only measures, in this order
KERNEL_PARTS = ("kernel", "sft", "data_prep", "anchor", "ab")  # on the bench's own CPU-only kt-kernel
CPU_VARIANTS = tuple(
    v["name"] for v in json.loads((paths.KERNEL / "python/kt_kernel/cpu_variants.json").read_text())["variants"]
)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="nox -s bench --", description=__doc__.split("\n\n")[1])
    dist_option(p, "the release the payload part measures")
    p.add_argument("--only", choices=PARTS, help="run one part only")
    p.add_argument("--no-build-times", action="store_true", help="kernel: skip the cold/incremental build timing")
    p.add_argument("--json", help="kernel: where its results go (default: build/bench-kernel.json)")
    p.add_argument("--assembly", action="store_true", help="payload: also time a cold and a warm assembly")
    p.add_argument(
        "--rounds", type=int, default=3, help="payload: interleaved rounds beside KTransformers 0.7.2 (default: 3)"
    )
    p.add_argument("--scenario", action="append", default=[], help="release: cold, no-op, reference, kernel line")
    p.add_argument("--no-verify", action="store_true", help="release: build_all and audit only")
    p.add_argument(
        "--variant", action="append", default=[], choices=CPU_VARIANTS, help="anchor, sft, ab: only these CPU variants"
    )
    p.add_argument("--against", help="ab: the revision whose CPU kernels this tree's are timed against")
    p.add_argument("--format", action="append", default=[], choices=["int8", "rawint4"], help="ab: only these formats")
    p.add_argument(
        "--threads",
        help="ab, anchor: thread counts, comma-separated (default: 1 and every CPU; anchor: half the CPUs too)",
    )
    p.add_argument("--tokens", help="ab: token counts, comma-separated (default: 1,2,4,8,64,256)")
    return p


def commands(args: argparse.Namespace) -> list[list[str]]:
    """The `python -m ...` runs of the parts asked for, in order (the kernel build and install between
    are run() 's, before the first kernel part)."""
    py = sys.executable
    parts = [args.only] if args.only else list(PLAIN)
    out: list[list[str]] = []
    for part in parts:
        if part == "audit":
            out.append([py, "-m", "bench.audit", "--json", str(paths.BENCH_JSON["audit"])])
        elif part == "payload":
            cmd = [py, "-m", "bench.payload", "--dist", str(args.dist), "--kernel", str(paths.KERNEL_OUT)]
            out.append(cmd + [f"--rounds={args.rounds}"] + (["--assembly"] if args.assembly else []))
        elif part == "kernel":
            cmd = [py, "-m", "bench.kernel", "--json", args.json or str(paths.BENCH_JSON["kernel"])]
            out.append(cmd + (["--no-build-times"] if args.no_build_times else []))
        elif part == "sft":
            only = [f"--variant={v}" for v in args.variant]
            out.append([py, "-m", "bench.sft", "--json", str(paths.BENCH_JSON["sft"]), *only])
        elif part == "data_prep":
            out.append([py, "-m", "bench.data_prep", "--json", str(paths.BENCH_JSON["data_prep"])])
        elif part == "release":
            extra = [f"--scenario={s}" for s in args.scenario] + (["--no-verify"] if args.no_verify else [])
            out.append([py, "-m", "bench.release", *extra])
        elif part == "anchor":
            extra = [f"--variant={v}" for v in args.variant] + ([f"--threads={args.threads}"] if args.threads else [])
            out.append([py, "-m", "bench.anchor", *extra])
        elif part == "ab":
            extra = [f"--variant={v}" for v in args.variant] + [f"--format={f}" for f in args.format]
            extra += [f"--{k}={getattr(args, k)}" for k in ("threads", "tokens") if getattr(args, k)]
            out.append([py, "-m", "bench.ab", f"--against={args.against}", *extra])
    return out


def kernel_build() -> list[str]:
    """The bench's own CPU-only kt-kernel, into build/bench-kernel (never the release's input)."""
    return [sys.executable, "kernel/tools/build_wheel.py", "--dist", str(paths.BENCH_KERNEL), "--if-stale"]


def _run(cmd: list[str]) -> None:
    print(f"bench > {' '.join(cmd[1:] if cmd[0] == sys.executable else cmd)}", flush=True)
    done = subprocess.run(cmd, cwd=paths.ROOT, check=False)
    if done.returncode != 0:
        raise BenchError(f"{' '.join(cmd[1:4])} failed (exit {done.returncode}); its output is above")


def _install(*args: str) -> None:
    """Into this venv, as nox installs a session's packages: uv where the venv has it, else pip."""
    uv = Path(sys.executable).with_name("uv")
    pip = (
        [str(uv), "pip", "install", "--python", sys.executable]
        if uv.exists()
        else [sys.executable, "-m", "pip", "install"]
    )
    _run([*pip, "--quiet", *args])


def _install_lock(name: str) -> None:
    """lockfiles/NAME.txt into this venv, every hash checked (as nox installs a session's lock)."""
    lock = indexes.for_install(paths.LOCKFILES / f"{name}.txt", paths.LOCKS_FOR_INSTALL / f"{name}.txt")
    _install("--require-hashes", "-r", str(lock))


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    if (args.only == "ab") != (args.against is not None):
        p.error("--only ab and --against REV go together: nox -s bench -- --only ab --against REV")
    try:
        kernel_ready = False
        for cmd in commands(args):
            part = cmd[2].removeprefix("bench.")
            if part in KERNEL_PARTS and not kernel_ready:
                _run(kernel_build())
                wheels = sorted(paths.BENCH_KERNEL.glob("kt_kernel-*.whl"))
                if not wheels:
                    raise BenchError(f"no kt_kernel wheel in {paths.BENCH_KERNEL} after its build")
                _install("--no-deps", "--force-reinstall", str(wheels[-1]))
                kernel_ready = True
            if part == "data_prep":
                _install_lock("sft-test")  # transformers and tokenizers, the pins the tests use
            _run(cmd)
    except StageError as exc:
        return report(exc)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
