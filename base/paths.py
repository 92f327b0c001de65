"""The build tree's one owner: every folder and report a release stage writes under ``build/``.

``nox -s clean`` iterates ``LEFTOVERS`` (and ``EVERYTHING`` with ``--all``); a stage that writes
somewhere new adds its path here, so nothing is left behind that ``clean`` does not know about.
"""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / "build"
DIST = ROOT / "dist"
LOCKFILES = ROOT / "lockfiles"
KERNEL = ROOT / "kernel"
VERSION_FILE = KERNEL / "python" / "kt_kernel" / "_version.py"

# Downloads checked by sha256 (carrier inputs, the audit corpus), the wheel memo and the payload's frames,
# every entry named by its content; debootstrap roots: kept by `clean`. KT_CACHE_DIR puts it elsewhere,
# e.g. one folder shared by every checkout on a machine (`nox -s tests` does, as ccache is shared).
CACHE_ENV = "KT_CACHE_DIR"
CACHE = Path(os.environ.get(CACHE_ENV) or BUILD / "cache")
# Debian roots (verify's last-resort interpreters, run as root with chroot) never live in a cache that may be
# shared: they are the running user's, under XDG_DATA_HOME (KT_DEBIAN_ROOTS puts them elsewhere); kept by clean.
DEBIAN_ROOTS = Path(
    os.environ.get("KT_DEBIAN_ROOTS")
    or Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share") / "kt-release" / "debian"
)
INPUTS_CACHE = CACHE / "inputs"  # the carriers' downloaded inputs (KT_RELEASE_CACHE puts them elsewhere)
WHEEL_MEMO = "wheel-memo"  # the wheel memo's folder, inside the inputs cache folder (whichever is named)
PAYLOAD_FRAMES = "payload"  # the payload's frames and archives, inside the inputs cache folder likewise
# every name the assembly writes in PAYLOAD_FRAMES (what may be pruned or removed there; nothing else is)
PAYLOAD_ARCHIVE_NAME = r"archive-[0-9a-f]{64}\.tar\.zst"
PAYLOAD_NAMES = rf"frame-[0-9a-f]{{64}}\.(zst|json)|{PAYLOAD_ARCHIVE_NAME}"
KERNEL_BUILD = BUILD / "kt-kernel"  # kernel/tools/build_wheel.py's tree (it names the same folder)
KERNEL_OUT = KERNEL_BUILD / "out"  # the release's kernel input: only build_cpu/build_cuda write it
KERNEL_SCRATCH = tuple(KERNEL_BUILD / n for n in ("raw", "repaired", "shards"))
LOCKS_FOR_INSTALL = BUILD / "locks"  # locks adapted to this machine (locks.indexes.for_install)
LOCK_WORK = BUILD / "lock"  # nox -s lock's scratch
TIMINGS = BUILD / "timings"  # each release stage's wall time, for the report's table
STAGE_CACHE = BUILD / "stage-cache"  # each stage's content key and last result (base.stagecache)
AUDIT_REPORTS = BUILD / "audit"  # `nox -s audit -- PATH...` (dist/ keeps the release's own)
VERIFY_WORK = BUILD / "verify"  # verify_install's venvs
# each Python's verification evidence: BUILD / "verify-cp3NN.json" (base.evidence, its one owner)
VERIFY_PUBLISHED_JSON = BUILD / "verify-published.json"  # resolved from where the release was published
EMULATED = BUILD / "emulated"  # the tests' emulated-CPU builds
CI_LOCAL = BUILD / "ci-local"  # nox -s ci_local's clones, artifacts and index
WHEELHOUSE = BUILD / "wheelhouse"  # cibuildwheel's output (nox -s build_wheels)
BENCH_SCRATCH = (BUILD / "bench-build", BUILD / "bench-data-prep")  # the benchmarks' work folders
BENCH_KERNEL = BUILD / "bench-kernel"  # nox -s bench's CPU-only kt-kernel: never the release's KERNEL_OUT
BENCH_RELEASE = BUILD / "bench-release"  # nox -s bench -- --only release: its clone and the sessions' logs
BENCH_ANCHOR = BUILD / "bench"  # nox -s bench -- --only anchor: KTransformers' kt-kernel venv and the numbers
BENCH_AB = BUILD / "bench-ab"  # nox -s bench -- --only ab: other revisions' sources and kernel builds
BENCH_JSON = {
    "kernel": BUILD / "bench.json",
    "sft": BUILD / "bench-sft.json",
    "data_prep": BUILD / "bench-data-prep.json",
    "payload": BUILD / "bench-payload.json",
    "audit": BUILD / "bench-audit.json",
    "release": BUILD / "bench-release.json",
    "anchor": BENCH_ANCHOR / "anchor.json",
    "ab": BUILD / "bench-ab.json",
}
MUTANTS_JSON = BUILD / "mutants.json"
# nox -s audit's link scopes: each published profile's third-party closure (uv pip install --target, hard links
# from uv's cache), what the release's ELF files are resolved against (release/links.py)
LINK_WORK = BUILD / "link"
PUBLISH_WORK = BUILD / "publish"  # nox -s publish's snapshot of dist/ (swept by name when a run was killed)
# Folders outside the build tree a stage stages into (a bundle's --out): one absolute path a line, so the sweep
# and `nox -s clean` find a killed run's staging tree wherever --out pointed (base.swap.remember).
STAGING_PLACES = BUILD / "staging-places.txt"

# What `nox -s clean` removes (downloads in CACHE and dist/ stay), and with `--all`.
LEFTOVERS = (
    VERIFY_WORK,
    CI_LOCAL,
    EMULATED,
    LOCKS_FOR_INSTALL,
    LOCK_WORK,
    AUDIT_REPORTS,
    PUBLISH_WORK,
    LINK_WORK,
    *BENCH_SCRATCH,
    BENCH_KERNEL,
    BENCH_RELEASE,
    BENCH_AB,
    *KERNEL_SCRATCH,
    KERNEL / "build",
    BUILD / "lib",  # setuptools' (pip install . of the audit)
    BUILD / "bdist.linux-x86_64",
)
EVERYTHING = (BUILD, DIST, ROOT / ".nox")
