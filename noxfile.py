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


def _partial_args(session: nox.Session, name: str) -> list[str]:
    """`-- --partial 3.11 [--partial 3.12]`: a partial development release for only those Pythons of the
    matrix (carriers.toml's `pythons`), labelled so in manifest.json and the report. `--fresh`: run even
    what the stage cache would reuse (base/stagecache.py; KT_FRESH=1 does the same)."""
    p = _parser(name)
    p.add_argument("--partial", action="append", default=[], metavar="3.N", help="only this Python (development)")
    p.add_argument("--fresh", action="store_true", help="rebuild even what was built from exactly these inputs")
    args = p.parse_args(session.posargs)
    return [f"--partial={v}" for v in args.partial] + (["--fresh"] if _fresh(args.fresh) else [])


def _fresh(flag: bool) -> bool:
    """--fresh, or KT_FRESH=1 (CI and ci_local set it: they never reuse a stage)."""
    return flag or os.environ.get("KT_FRESH", "") not in ("", "0")


@nox.session(python=PYTHON, tags=["build"])
def assemble(session: nox.Session) -> None:
    """Carriers and repacks around an already built kt-kernel wheel (build/kt-kernel/out) into dist/,
    for every Python of the release's matrix (`-- --partial 3.11`: a labelled development release)."""
    partial = _partial_args(session, "assemble")
    _install_lock(session, "toolchain")
    _install_lock(session, "audit")  # the payload packer reads the policy and runs cuobjdump
    session.run("python", "-m", "carriers", "assemble", "--kernel", str(KERNEL_OUT), "--dist", str(DIST), *partial)


@nox.session(python=PYTHON, tags=["build"])
def build_all(session: nox.Session) -> None:
    """Build the release into dist/: kt-kernel (CPU variants + CUDA archive), then every carrier for every
    Python of the matrix, atomically (`-- --partial 3.11`: a labelled development release)."""
    partial = _partial_args(session, "build_all")
    reuse = [] if "--fresh" in partial else ["--if-stale"]  # the kernel's own key: its stamp
    with _timed("build_all"):
        _install_lock(session, "toolchain")
        _install_lock(session, "cuda")
        _install_lock(session, "audit")  # the payload packer reads the policy and runs cuobjdump
        session.run("python", "kernel/tools/build_wheel.py", "--dist", str(KERNEL_OUT), "--cuda", *reuse)
        session.run("python", "-m", "carriers", "assemble", "--kernel", str(KERNEL_OUT), "--dist", str(DIST), *partial)


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
    """Run every audit over dist/: dist/audit-report.json and .md; fails on any error finding. The audit of
    exactly these wheels with this policy and code is reused (`--fresh` audits anyway).

    `-- PATH...` audits those wheels or directories instead; their reports go to build/audit/, since
    dist/ holds only the release build_all made."""
    p = _parser("audit")
    p.add_argument("--baseline", help="a previous audit-report.json, for size growth")
    p.add_argument("--fresh", action="store_true", help="audit even if these wheels passed this audit before")
    p.add_argument("--no-vulnerabilities", action="store_true", help="skip pip-audit (offline): NOT CHECKED")
    p.add_argument("--advisories", help="OSV advisory data on disk (PyPI's all.zip) instead of the index")
    p.add_argument("paths", nargs="*")
    args = p.parse_args(session.posargs)
    if not args.paths and not DIST.is_dir():
        session.error(f"{DIST} does not exist: run `nox -s build_all` first, or name wheels: `nox -s audit -- PATH...`")
    _install_lock(session, "audit")
    extra = ["--baseline", args.baseline] if args.baseline else []
    summary = os.environ.get("GITHUB_STEP_SUMMARY")  # CI: the Markdown report goes into the job summary
    extra += ["--summary", summary] if summary else []
    if args.paths:  # anyone's wheels: audited as they are, no stage cache
        paths.AUDIT_REPORTS.mkdir(parents=True, exist_ok=True)
        reports = [f"--json={paths.AUDIT_REPORTS / 'audit-report.json'}"]
        reports += [f"--markdown={paths.AUDIT_REPORTS / 'audit-report.md'}"]
        session.run("python", "-m", "audits", *args.paths, *reports, *extra)
        return
    _install_lock(session, "vulns")  # pip-audit: the known vulnerabilities of what the install files pin
    with _timed("audit"):
        fresh = ["--fresh"] if _fresh(args.fresh) else []
        offline = ["--no-vulnerabilities"] if args.no_vulnerabilities else []
        offline += ["--advisories", args.advisories] if args.advisories else []
        session.run("python", "-m", "release.audit", "--dist", str(DIST), *extra, *fresh, *offline)


@nox.session(python=PYTHON, tags=["verify"])
def verify_install(session: nox.Session) -> None:
    """Install dist/ into fresh venvs by hash (sft-cpu, serve, the LlamaFactory profiles); owners, training, resume."""
    p = _parser("verify_install")
    p.add_argument(
        "--profile",
        action="append",
        default=[],
        help="sft-cpu, sft, serve, lf-standard, lf-kt, lf-upgrade, resolve, cp313",
    )
    p.add_argument("--python", action="append", default=[], metavar="3.N", help="resolve: only these Pythons")
    p.add_argument(
        "--index",
        metavar="URL",
        help="resolve: from the index the release was published to (and install its sft profile from there)",
    )
    p.add_argument("--fresh", action="store_true", help="run even the profiles proven on exactly these inputs")
    args = p.parse_args(session.posargs)
    report = str(paths.VERIFY_JSON)
    venvs = [x for x in args.profile if x not in ("resolve", "cp313")]
    fresh = ["--fresh"] if _fresh(args.fresh) else []
    pythons = [f"--python={v}" for v in args.python] + fresh
    with _timed("verify_install"):
        _install_lock(session, "verify")
        if venvs or not args.profile:
            profiles = (f"--profile={x}" for x in venvs)
            session.run("python", "-m", "verify", "--dist", str(DIST), "--json", report, *profiles, *fresh)
        if "cp313" in args.profile or not args.profile:
            # The release on Debian trixie's CPython 3.13 (a debootstrap'ed root; no 3.12 interpreter exists here),
            # first: normal resolution for 3.13 then runs in that root, with 3.13's own environment markers.
            exercised = str(paths.VERIFY_INTERPRETERS_JSON)
            session.run("python", "-m", "verify.interpreters", "--dist", str(DIST), "--json", exercised, *fresh)
        if "resolve" in args.profile or not args.profile:
            # Normal resolution from an index serving dist/ (PyPI behind it), every install profile and Python.
            # From where it was published: its own report, never the evidence the release verdict reads.
            resolved = str(paths.VERIFY_PUBLISHED_JSON if args.index else paths.VERIFY_RESOLUTION_JSON)
            index = ["--index", args.index] if args.index else []
            session.run("python", "-m", "verify.resolution", "--dist", str(DIST), "--json", resolved, *pythons, *index)


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
    args = p.parse_args(session.posargs)
    TIMINGS.mkdir(parents=True, exist_ok=True)
    (TIMINGS / ".release-start").write_text(f"{time.time()}\n")  # release_report prints this run's stages
    fresh = ["--fresh"] if args.fresh else []
    session.notify("build_all", fresh)
    session.notify("audit", fresh + (["--advisories", args.advisories] if args.advisories else []))
    session.notify("verify_install", fresh)
    session.notify("release_report", [f"--accept={a}" for a in args.accept])


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
    """Kernel throughput per variant vs torch bf16 and the bandwidth roofline; kt_kernel.sft forward+backward vs
    torch autograd (bench/sft.py); kt-prepare-data serial vs parallel (bench/data_prep.py);
    build times; the CUDA payload
    (size, cold/warm materialization, disk, audit, assembly) beside the gzip reference, on dist/; the audit's
    time and peak RSS on the torch wheel and a 2 GiB zip bomb beside auditwheel show. `-- --only release`:
    the release loop (cold, no-op, --fresh, one kernel line changed) in a clone (bench/release.py). `-- --only ab
    --against REV`: this tree's CPU kernels against REV's, call by call in one process (bench/ab.py)."""
    p = _parser("bench")
    p.add_argument("--no-build-times", action="store_true", help="skip the cold/incremental build timing")
    p.add_argument("--json", default=str(paths.BENCH_JSON["kernel"]))
    p.add_argument(
        "--only",
        choices=["kernel", "sft", "data_prep", "payload", "audit", "release", "anchor", "ab"],
        help="run one part only",
    )
    p.add_argument("--assembly", action="store_true", help="payload: also time a cold and a warm assembly")
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
    args = p.parse_args(session.posargs)
    if (args.only == "ab") != (args.against is not None):
        session.error("--only ab and --against REV go together: nox -s bench -- --only ab --against REV")
    _install_lock(session, "test")
    if args.only == "release":  # not part of a plain `nox -s bench`: it builds and verifies a release, several times
        extra = [f"--scenario={s}" for s in args.scenario] + (["--no-verify"] if args.no_verify else [])
        session.run("python", "-m", "bench.release", *extra)
        return
    if args.only in (None, "audit"):
        session.run("python", "-m", "bench.audit", "--json", str(paths.BENCH_JSON["audit"]))
    if args.only == "audit":
        return
    if args.only not in ("kernel", "sft", "data_prep", "anchor", "ab"):
        session.run(
            "python",
            "-m",
            "bench.payload",
            "--dist",
            str(DIST),
            "--kernel",
            str(KERNEL_OUT),
            *(["--assembly"] if args.assembly else []),
        )
    if args.only == "payload":
        return
    # A CPU-only kt-kernel of its own: build/kt-kernel/out holds the release's input (CUDA included),
    # which a bench run must not replace (a later assemble would refuse it as a partial build).
    session.run("python", "kernel/tools/build_wheel.py", "--dist", str(paths.BENCH_KERNEL), "--if-stale")
    wheels = sorted(paths.BENCH_KERNEL.glob("kt_kernel-*.whl"))
    if not wheels:  # only under --install-only, which skips the build above: the venv is ready, nothing to time
        session.log(f"no kt_kernel wheel in {paths.BENCH_KERNEL} (its build did not run); stopping after the install")
        return
    wheel = wheels[-1]
    session.install("--no-deps", "--force-reinstall", str(wheel))
    if args.only in (None, "kernel"):
        session.run(
            "python", "-m", "bench.kernel", "--json", args.json, *(["--no-build-times"] if args.no_build_times else [])
        )
    if args.only == "ab":  # this tree's CPU kernels against another revision's, call by call in one process
        extra = [f"--variant={v}" for v in args.variant] + [f"--format={f}" for f in args.format]
        extra += [f"--{k}={getattr(args, k)}" for k in ("threads", "tokens") if getattr(args, k)]
        session.run("python", "-m", "bench.ab", f"--against={args.against}", *extra)
        return
    if args.only == "anchor":  # not part of a plain `nox -s bench`: KTransformers' kt-kernel needs ~3 GB of wheels
        extra = [f"--variant={v}" for v in args.variant] + ([f"--threads={args.threads}"] if args.threads else [])
        session.run("python", "-m", "bench.anchor", *extra)
        return
    if args.only in (None, "sft"):
        only = [f"--variant={v}" for v in args.variant]
        session.run("python", "-m", "bench.sft", "--json", str(paths.BENCH_JSON["sft"]), *only)
    if args.only in (None, "data_prep"):
        _install_lock(session, "sft-test")  # transformers and tokenizers, the pins the tests use
        session.run("python", "-m", "bench.data_prep", "--json", str(paths.BENCH_JSON["data_prep"]))
