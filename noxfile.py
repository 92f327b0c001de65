# /// script
# dependencies = ["nox>=2025.2.9"]
# ///
"""kt-release front door. Sessions hold no logic: they install a lock and call the package named
after them (kernel/, carriers/, audits/, verify/, release/, bundle/, bench/, maint/ for the
maintainer's own actions). Arguments go after ``--``."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

import nox

# nox does not put the noxfile's directory on sys.path; the two layers imported here are stdlib only.
sys.path.insert(0, str(Path(__file__).resolve().parent))
from base import paths
from locks import indexes

nox.needs_version = ">=2025.2.9"
nox.options.default_venv_backend = "uv"
nox.options.error_on_external_run = True
nox.options.reuse_existing_virtualenvs = True
nox.options.stop_on_first_error = True
nox.options.sessions = ["release"]

PYTHON = "3.11"
ROOT = paths.ROOT


def _load(name: str, path: Path) -> ModuleType:
    """kernel/tools/build_wheel.py, a script of the kernel's own project (stdlib only)."""
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


TIMINGS = paths.TIMINGS  # each release stage's wall time, for release_report's table


@contextmanager
def _timed(name: str) -> Iterator[None]:
    t0 = time.time()
    yield
    TIMINGS.mkdir(parents=True, exist_ok=True)
    (TIMINGS / f"{name}.json").write_text(json.dumps({"start": t0, "seconds": round(time.time() - t0, 1)}) + "\n")


DIST = paths.DIST
KERNEL_OUT = paths.KERNEL_OUT
CPU_VARIANTS = tuple(
    v["name"] for v in json.loads((paths.KERNEL / "python/kt_kernel/cpu_variants.json").read_text())["variants"]
)


def _install_lock(session: nox.Session, name: str) -> None:
    """Install lockfiles/NAME.txt with every hash checked (the PyTorch CPU index it may name
    adapted to this machine by locks/indexes.py: KT_TORCH_INDEX, KT_FIND_LINKS)."""
    lock = indexes.for_install(paths.LOCKFILES / f"{name}.txt", paths.LOCKS_FOR_INSTALL / f"{name}.txt")
    session.install("--require-hashes", "-r", str(lock))


def _parser(name: str) -> argparse.ArgumentParser:
    return argparse.ArgumentParser(prog=f"nox -s {name} --")


@nox.session(python=PYTHON, tags=["build"])
def build_cpu(session: nox.Session) -> None:
    """Build and repair the kt-kernel wheel with the six CPU variants into build/kt-kernel/out/.

    dist/ belongs to build_all: it only ever holds a complete, consistent release."""
    p = _parser("build_cpu")
    p.add_argument("--variant", action="append", default=[], choices=CPU_VARIANTS, help="CI shard: only this variant")
    args = p.parse_args(session.posargs)
    _install_lock(session, "toolchain")
    out = [] if args.variant else ["--dist", str(KERNEL_OUT)]  # shards go to build/kt-kernel/shards/<tag>
    session.run("python", "kernel/tools/build_wheel.py", *out, *(f"--variant={v}" for v in args.variant))


@nox.session(python=PYTHON, tags=["build"])
def build_cuda(session: nox.Session) -> None:
    """Build the kt-kernel wheel with its CUDA archive (hermetic PyPI toolchain) into build/kt-kernel/out/."""
    p = _parser("build_cuda")
    archs = _load("kt_build_wheel", ROOT / "kernel" / "tools" / "build_wheel.py").policy_archs()  # its one owner
    p.add_argument("--arch", action="append", default=[], choices=archs, help="CI shard: only this SASS arch")
    args = p.parse_args(session.posargs)
    _install_lock(session, "toolchain")
    _install_lock(session, "cuda")
    out = [] if args.arch else ["--dist", str(KERNEL_OUT)]  # shards go to build/kt-kernel/shards/<tag>
    session.run("python", "kernel/tools/build_wheel.py", *out, "--cuda", *(f"--cuda-arch={a}" for a in args.arch))


@nox.session(python=PYTHON, tags=["build"])
def build_wheels(session: nox.Session) -> None:
    """CI: the kt-kernel wheels with cibuildwheel in a manylinux_2_28 image ([tool.cibuildwheel] in kernel/)."""
    p = _parser("build_wheels")
    p.add_argument("--python", default="cp311", help="cibuildwheel identifier prefix, e.g. cp312")
    args = p.parse_args(session.posargs)
    _install_lock(session, "cibuildwheel")
    build_wheel = _load("kt_build_wheel", ROOT / "kernel" / "tools" / "build_wheel.py")
    env = {
        "CIBW_BUILD": f"{args.python}-manylinux_x86_64",
        "KT_CUDA_ARCHS": ";".join(build_wheel.policy_archs()),
        "SOURCE_DATE_EPOCH": build_wheel.source_date_epoch(),
        "CIBW_ENVIRONMENT_PASS_LINUX": "KT_CUDA_ARCHS SOURCE_DATE_EPOCH",
    }  # the policy's matrix, the release date
    session.run("cibuildwheel", "kernel", "--output-dir", str(paths.WHEELHOUSE), env=env)


@nox.session(python=PYTHON, tags=["build"])
def assemble(session: nox.Session) -> None:
    """Carriers and repacks around an already built kt-kernel wheel (build/kt-kernel/out) into dist/,
    for every Python of the release's matrix (`-- --partial 3.11`: a labelled development release)."""
    _install_lock(session, "toolchain")
    _install_lock(session, "audit")  # the payload packer reads the policy and runs cuobjdump
    session.run("python", "-m", "carriers", "assemble", *session.posargs)


@nox.session(python=PYTHON, tags=["build"])
def build_all(session: nox.Session) -> None:
    """Build the release into dist/: kt-kernel (CPU variants + CUDA archive), then every carrier for every
    Python of the matrix, atomically (`-- --partial 3.11`: a labelled development release; `-- --fresh`)."""
    fresh = "--fresh" in session.posargs or os.environ.get("KT_FRESH", "") not in ("", "0")
    with _timed("build_all"):
        _install_lock(session, "toolchain")
        _install_lock(session, "cuda")
        _install_lock(session, "audit")  # the payload packer reads the policy and runs cuobjdump
        reuse = [] if fresh else ["--if-stale"]  # the kernel's own key: its stamp
        session.run("python", "kernel/tools/build_wheel.py", "--dist", str(KERNEL_OUT), "--cuda", *reuse)
        session.run("python", "-m", "carriers", "assemble", *session.posargs)


@nox.session(python=PYTHON)
def tests(session: nox.Session) -> None:
    """Build the kt-kernel wheel (into build/kt-kernel/out), then run every test against it.

    `-- ARGS` go to pytest unchanged (`-- -k sft -x`, `-- tests/unit`); `-- --no-build` tests the wheel
    already in build/kt-kernel/out."""
    # `--no-build` is ours; everything else goes to pytest as written (`-- -k sft -x`, `-- tests/unit`).
    no_build = "--no-build" in session.posargs
    pytest_args = [a for a in session.posargs if a != "--no-build"]
    _install_lock(session, "test")
    if not no_build:  # rebuilt only if its inputs changed since the last build (nox -s release made one)
        session.run("python", "kernel/tools/build_wheel.py", "--dist", str(KERNEL_OUT), "--cuda", "--if-stale")
    # pytest-xdist: one worker per CPU, each test file whole on one worker (its module fixtures, a release
    # assembled once, are built once); `-- -n 0` runs in one process. With a worker per CPU, torch's OpenMP
    # threads (busy-waiting) in one worker's subprocesses would starve the other's: one each, unless set.
    env = {"KT_DIST": str(KERNEL_OUT)}
    # The tests' downloads (by sha256), wheel memo and payload frames, each entry named by its content, are
    # kept per machine as ccache's objects are, so a fresh clone does not download and compress them again
    # (two first assemblies, one per worker, took 107 and 103 s in a fresh clone, 20 s each after); a
    # changed input still misses. KT_CACHE_DIR set by the caller wins.
    if not os.environ.get("KT_CACHE_DIR"):
        env["KT_CACHE_DIR"] = str(Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kt-release")
    pairs = zip(pytest_args, [*pytest_args[1:], ""], strict=False)  # [] and [""] when no args
    one_process = any(a in ("-n0", "-n=0") or (a == "-n" and b == "0") for a, b in pairs)
    if "OMP_NUM_THREADS" not in os.environ and not one_process:
        env["OMP_NUM_THREADS"] = "1"
    session.run("pytest", "-n", "auto", "--dist", "loadfile", *pytest_args, env=env)


@nox.session(python=PYTHON, default=False)
def tests_gpu(session: nox.Session) -> None:
    """On a machine with an NVIDIA GPU: the built kt-kernel wheel beside CUDA torch (lockfiles/gpu.txt),
    then tests/gpu, where a skip is a failure. Offline GPU machines: maint/gpu_check.sh."""
    import shutil

    if shutil.which("nvidia-smi") is None:
        session.error("no NVIDIA GPU here (nvidia-smi not found); nox -s tests runs everything else")
    wheels = sorted(KERNEL_OUT.glob("kt_kernel-*.whl"))
    if len(wheels) != 1:
        session.error(f"expected one kt-kernel wheel in {KERNEL_OUT}; run nox -s build_cuda first")
    _install_lock(session, "gpu")
    session.install("--no-deps", str(wheels[0]))
    session.run("pytest", "-p", "no:cacheprovider", "-m", "gpu", "-rs", "tests/gpu", env={"KT_REQUIRE_GPU": "1"})


@nox.session(python=PYTHON, default=False)
def mutants(session: nox.Session) -> None:
    """Delete each audit rule in turn; the tests that name it must fail (build/mutants.json; survivors fail)."""
    _install_lock(session, "test")
    session.run("python", "-m", "maint.mutants", *session.posargs, env={"KT_DIST": str(KERNEL_OUT)})


@nox.session(python=PYTHON, tags=["audit"])
def audit(session: nox.Session) -> None:
    """Run every audit over dist/: dist/audit-report.json and .md, and the known vulnerabilities of what the
    install files pin; fails on any error finding. The audit of exactly these wheels with this policy and code
    is reused (`--fresh` audits anyway). `-- PATH...` audits anyone's wheels instead (reports: build/audit/)."""
    _install_lock(session, "audit")
    _install_lock(session, "vulns")  # pip-audit: the known vulnerabilities of what the install files pin
    _install_lock(session, "links")  # uv: each install profile's closure, for the link rules (release/links.py)
    with _timed("audit"):
        session.run("python", "-m", "release.audit", *session.posargs)


@nox.session(python=PYTHON, tags=["verify"])
def verify_install(session: nox.Session) -> None:
    """Install dist/ into fresh venvs by hash and exercise it (sft-cpu, sft, serve, the LlamaFactory profiles), on
    the other interpreters (cp313), and resolve it normally (resolve); `-- --help` lists the profiles."""
    with _timed("verify_install"):
        _install_lock(session, "verify")
        session.run("python", "-m", "verify", *session.posargs)


@nox.session(venv_backend="none", default=False)
def clean(session: nox.Session) -> None:
    """Remove build leftovers: install-verification venvs, local CI runs, CMake trees, shards, reports.
    Downloads stay cached (build/cache) and dist/ stays; `-- --all` removes those and .nox/ too."""
    import shutil

    p = _parser("clean")
    p.add_argument("--all", action="store_true", help="also build/cache, dist/ and the nox venvs")
    args = p.parse_args(session.posargs)
    from base import swap

    swap.sweep()  # every leftover of a killed run (hidden staging trees, parked releases, partial downloads)
    targets = [*paths.LEFTOVERS, *(paths.EVERYTHING if args.all else ())]
    for t in targets:
        if t.exists():
            size = sum(f.stat().st_size for f in t.rglob("*") if f.is_file() and not f.is_symlink())
            session.log(f"removing {t.relative_to(ROOT)} ({size / 2**30:.2f} GiB)")
            shutil.rmtree(t)


@nox.session(python=PYTHON, tags=["ci"])
def ci_local(session: nox.Session) -> None:
    """Run .github/workflows/release.yml here: jobs in dependency order, each in a fresh clone of HEAD, artifacts
    handed on as declared, `if:` evaluated for the event, publish to a 127.0.0.1 index (build/ci-local/).
    `-- --event push --ref refs/tags/v0.6.1`, `-- --event workflow_dispatch --input target=testpypi`, `-- --plan`."""
    _install_lock(session, "ci")
    session.run("python", "-m", "maint.ci_local", *session.posargs)


@nox.session(venv_backend="none", tags=["release"])
def release(session: nox.Session) -> None:
    """The whole candidate: build_all, audit, verify_install, then a one-screen summary and report. A stage
    whose inputs are exactly those of its last success is reused, saying so (`-- --fresh` runs them all)."""
    p = _parser("release")
    p.add_argument("--fresh", action="store_true", help="run every stage, even those built from exactly these inputs")
    p.add_argument(
        "--accept",
        action="append",
        default=[],
        metavar="ITEM=REASON",
        help="accept a missing check (NOT VERIFIED, NOT CHECKED) by name or glob, with a reason",
    )
    p.add_argument("--advisories", help="OSV advisory data on disk for the vulnerability check (air-gapped sites)")
    p.add_argument(
        "--previous",
        metavar="SPEC",
        help="the previous release, for the release diff and the upgrade checks: an earlier dist/, a folder of "
        "wheels, or URL::NAME==V,...",
    )
    args = p.parse_args(session.posargs)
    TIMINGS.mkdir(parents=True, exist_ok=True)
    (TIMINGS / ".release-start").write_text(f"{time.time()}\n")  # release_report prints this run's stages
    fresh = ["--fresh"] if args.fresh else []
    # the diff against the newest older release on PyPI by default; the upgrade checks only against one named
    previous = [f"--previous={args.previous}"] if args.previous else []
    session.notify("build_all", fresh)
    session.notify("audit", fresh + (["--advisories", args.advisories] if args.advisories else []))
    session.notify("verify_install", fresh + previous)
    session.notify("release_report", [f"--accept={a}" for a in args.accept] + (previous or ["--previous=auto"]))


@nox.session(python=PYTHON, default=False)
def release_report(session: nox.Session) -> None:
    """Summarise dist/ into dist/release-report.{md,html} and the release verdict (PASSED, FAILED, INCOMPLETE)
    into manifest.json; exits non-zero unless publishable (`-- --accept ITEM=REASON` accepts a missing check)."""
    _install_lock(session, "verify")
    session.run("python", "-m", "release.report", "--dist", str(DIST), *session.posargs)


@nox.session(python=PYTHON, default=False)
def bundle(session: nox.Session) -> None:
    """An offline bundle of one install profile for one Python: `-- --profile sft --python 3.12 --out DIR`
    (every wheel of dist/install/<profile>-cp3XX.txt, hash-checked, that file and a README; the bundle is
    installed with `pip install --no-index --find-links DIR --require-hashes -r DIR/<profile>-cp3XX.txt`)."""
    if not session.posargs:
        session.error("usage: nox -s bundle -- --profile NAME --python 3.N --out DIR")
    _install_lock(session, "verify")
    session.run("python", "-m", "bundle", "--dist", str(DIST), *session.posargs)


@nox.session(python=PYTHON, default=False, tags=["publish"])
def publish(session: nox.Session) -> None:
    """Check the plan against the index, upload what SHA256SUMS lists in dependency order (hash-verified),
    then resolve the release from that index."""
    if not session.posargs:
        session.error(
            "usage: nox -s publish -- --repository-url URL [--index-url URL] [--plan] [--add-to-existing] "
            "[--no-verify] [--attestations]"
        )
    _install_lock(session, "publish")
    session.run("python", "-m", "release.publish", "--dist", str(DIST), *session.posargs)


@nox.session(python=PYTHON, tags=["lint"])
def preflight(session: nox.Session) -> None:
    """Policy and carrier definitions load and validate; the carrier set is internally consistent; locks in sync."""
    _install_lock(session, "audit")
    _install_lock(session, "publish")
    session.run("python", "-c", "import audits; audits.load_policy(); print('audit policy: ok')")
    session.run("python", "-m", "carriers", "check")
    session.run("python", "-m", "maint.lock", "--check")


@nox.session(python=PYTHON, tags=["lint"])
def lint(session: nox.Session) -> None:
    """ruff (lint + format check), mypy --strict, the import layers (lint-imports) and the offline lock drift check."""
    _install_lock(session, "lint")
    workflows = [str(p) for p in sorted((ROOT / ".github" / "workflows").glob("*.yml"))]
    session.run("zizmor", "--offline", *workflows)
    session.run("check-jsonschema", "--builtin-schema", "vendor.github-workflows", *workflows)
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    session.run("mypy")
    session.run("lint-imports", "--no-cache")  # the import layers ([tool.importlinter] in pyproject.toml)
    session.run("python", "-m", "maint.lock", "--check")


@nox.session(python=PYTHON, default=False)
def lock(session: nox.Session) -> None:
    """Regenerate lockfiles/*.txt with uv (network); `-- --check` only checks drift."""
    _install_lock(session, "nox")
    session.install("--require-hashes", "-r", "lockfiles/lint.txt")
    session.run("python", "-m", "maint.lock", *session.posargs)


@nox.session(python=PYTHON, default=False)
def bench(session: nox.Session) -> None:
    """Every measurement beside its reference in the same run: the audit beside auditwheel, the CUDA payload beside
    gzip, kernel throughput beside torch bf16, SFT beside torch autograd, data preparation serial beside parallel.
    `-- --only release|anchor|ab ...`: the parts a plain run leaves out; `-- --help` lists them (bench/__main__.py)."""
    _install_lock(session, "test")
    session.run("python", "-m", "bench", *session.posargs)
