"""`nox -s verify_install`: python -m verify [--dist dist] [--profile NAME]... [--python 3.N]...
[--interpreter 3.N=PATH]... [--jobs N] [--index URL].

Every profile of the registry (verify/registry.py) on every Python it runs on, each Python on its own
interpreter (base.interpreters: given, PATH, pyenv, uv, a Debian root as the last resort). The venv
profiles: sft-cpu, lf-standard and lf-upgrade on the Python the CPU locks are made for; sft, serve and
lf-kt (the published install files) on every Python of the matrix (verify/sft.py, verify/serve.py,
verify/lf.py; verify/debian.py in a Debian root). Normal resolution (resolve) with each Python's own
interpreter (verify.resolution). Independent runs overlap (`--jobs`), the resolutions beside them.
Each result goes into that Python's evidence file as it comes (base.evidence: build/verify-cp3NN.json),
which the release verdict reads."""

from __future__ import annotations

import argparse
import functools
import os
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from base import distdir, evidence, interpreters, stagecache
from base.cli import dist_option, fresh_option
from base.errors import StageError, report
from base.interpreters import Found, Interpreter
from base.paths import VERIFY_PUBLISHED_JSON, VERIFY_WORK
from base.version import python_tag
from locks.previous import Unreachable

from . import cached, debian, lf, registry, resolution
from .serve import verify_serve
from .sft import verify_sft, verify_sft_cpu

RUN: dict[str, Callable[[Path, Path, Interpreter], dict[str, Any]]] = {
    "sft-cpu": verify_sft_cpu,
    "sft": verify_sft,  # the published sft install file (CUDA torch, run on the CPU)
    "serve": verify_serve,
    **lf.VERIFY,
}
OK, FAILED, NOT_VERIFIED = 0, 1, 2


def _jobs_default() -> int:
    """Runs at once: installs wait on the network and the disk, the checks on the CPU; two per core at
    most, and three at most (each run's peak is about 3 GiB; this bounds memory to about 10 GiB)."""
    return max(1, min(3, 2 * (os.cpu_count() or 1)))


def main(argv: list[str] | None = None) -> int:
    """The verify_install CLI: every run asked for (default: all), each run even when one before it failed;
    0 all proven, 1 one failed (the message says what), 2 one could not be checked here (NOT VERIFIED)."""
    p = argparse.ArgumentParser(
        prog="nox -s verify_install --",
        epilog="profiles: " + "; ".join(f"{x.name}: {x.what}" for x in registry.PROFILES),
    )
    dist_option(p)
    p.add_argument("--work", type=Path, default=VERIFY_WORK)
    p.add_argument("--profile", action="append", default=[], choices=list(registry.BY_NAME), help="default: all")
    p.add_argument("--python", action="append", default=[], metavar="3.N", help="only these Pythons of the matrix")
    p.add_argument(
        "--interpreter",
        action="append",
        default=[],
        metavar="3.N=PATH",
        help=f"the interpreter for CPython 3.N (also {interpreters.ENV}); default: found (PATH, pyenv, uv, Debian)",
    )
    p.add_argument("--jobs", type=int, default=_jobs_default(), help="runs at once (default: %(default)s)")
    p.add_argument(
        "--index",
        metavar="URL",
        help="resolve from the index the release was published to (and install its sft profile from there)",
    )
    p.add_argument(
        "--previous",
        metavar="SPEC",
        help="also verify the move from this previous release (an earlier dist/, a folder of wheels, or "
        "INDEX_URL::NAME==VERSION,...) to this one, per published profile on the first Python (verify/upgrade.py)",
    )
    p.add_argument("--evidence", type=Path, help=argparse.SUPPRESS)  # tests: where build/verify-cp3NN.json go
    fresh_option(p, "run every profile")
    args = p.parse_args(argv)
    chosen = args.profile or (["resolve"] if args.index else [x.name for x in registry.PROFILES])
    if args.index:
        if chosen != ["resolve"]:
            p.error("--index verifies the published release: it goes with --profile resolve only")
        extra = [f"--python={v}" for v in args.python] + [f"--interpreter={v}" for v in args.interpreter]
        argv_r = ["--dist", str(args.dist), "--json", str(VERIFY_PUBLISHED_JSON), "--index", args.index]
        return resolution.main(argv_r + extra)  # its own report, never the evidence the verdict reads
    if args.jobs < 1:
        p.error("--jobs must be at least 1")
    try:
        return Verification(args, chosen).run()
    except StageError as exc:
        return report(exc)


class Verification:
    """One verify_install run: the interpreters found, then every run, overlapped."""

    def __init__(self, args: argparse.Namespace, chosen: list[str]) -> None:
        self.args = args
        self.dist: Path = args.dist
        self.key = cached.dist_key(args.dist)  # dist/ opened and re-hashed once: an incomplete build fails here
        matrix = list(distdir.open_release(args.dist).manifest.pythons)
        wrong = [v for v in args.python if v not in matrix]
        if wrong:
            raise interpreters.InterpreterError(
                f"--python {', '.join(wrong)}: not a Python of this release ({', '.join(matrix)}; "
                "carriers.toml `pythons`)"
            )
        self.pythons = args.python or matrix
        self.venv_runs = registry.venv_runs(self.pythons, [c for c in chosen if c in registry.VENV])
        self.resolutions = [(ip, v) for v in self.pythons for ip in _install_profiles()] if "resolve" in chosen else []
        self.given = interpreters.parse_given(args.interpreter)
        self.codes: list[int] = []
        self.lock = threading.Lock()

    def _evidence(self, python: str, **kwargs: Any) -> None:
        evidence.update(python, build=self.args.evidence, **kwargs)

    def run(self) -> int:
        t0 = time.perf_counter()
        needed = sorted({v for _, v in self.venv_runs} | {v for _, v in self.resolutions}, key=self.pythons.index)
        found = {v: self.locate(v) for v in needed}
        jobs = self.args.jobs
        if jobs > 1 and "OMP_NUM_THREADS" not in os.environ:  # runs side by side: torch's threads share the CPUs
            os.environ["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // min(jobs, len(self.venv_runs) or 1)))
        print(
            f"[verify] {len(self.venv_runs)} venv runs, {len(self.resolutions)} resolutions, {jobs} at once", flush=True
        )
        if self.args.previous:  # every upgrade first: each installs two releases' closures, one at a time
            for profile in [p for p in registry.PUBLISHED if (p, self.pythons[0]) in self.venv_runs]:
                self.upgrade(profile, found[self.pythons[0]])
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            side = pool.submit(self.resolve, found) if self.resolutions else None
            # the longest runs first (published profiles install several GB), so the short ones fill in
            order = sorted(self.venv_runs, key=lambda r: (r[0] not in registry.PUBLISHED, self.pythons.index(r[1])))
            done = [pool.submit(self.one, profile, python, found[python]) for profile, python in order]
            for future in [*done, *([side] if side else [])]:
                future.result()
        failed = self.codes.count(FAILED)
        unchecked = self.codes.count(NOT_VERIFIED)
        print(
            f"[verify] {len(self.codes) - failed - unchecked} proven, {failed} failed, {unchecked} not verified "
            f"({time.perf_counter() - t0:.0f} s)",
            flush=True,
        )
        return FAILED if failed else NOT_VERIFIED if unchecked else OK

    def locate(self, python: str) -> Found:
        """The interpreter for `python` (base.interpreters), a Debian root made as the last resort; recorded
        in its evidence and said."""
        found = interpreters.find(python, self.given)
        if found.interpreter is None and python not in self.given and interpreters.debian_root(python) is not None:
            try:
                debian.make_root(python)
            except StageError as exc:  # Unavailable (not root, no debootstrap) or a failed debootstrap
                found = Found(python, None, found.tried, (*found.searched, f"debian: {exc}"))
            else:
                found = interpreters.find(python, self.given)
        tag = f"[{python_tag(python)}]"
        for attempt in found.tried:
            print(f"{tag} warning: passed over {attempt.line()}", flush=True)
        i = found.interpreter
        if i is None:
            print(f"{tag} CPython {python}: NOT VERIFIED: {found.why_none()}", flush=True)
        else:
            print(f"{tag} CPython {i.version} from {i.source}: {i.path} ({i.how})", flush=True)
        self._evidence(python, interpreter={**found.as_dict(), "dist_sha256": self.key})  # for this build only
        return found

    def _record(self, python: str, section: str, name: str, result: dict[str, Any], code: int) -> None:
        self._evidence(python, section=section, name=name, result=result)
        with self.lock:
            self.codes.append(code)

    def one(self, profile: str, python: str, found: Found) -> None:
        """One venv run: reused when proven on exactly these inputs, else run; its result (or why it failed,
        or why it could not run here) into the Python's evidence."""
        name = registry.run_name(profile, python)
        stamp = {"dist_sha256": self.key, "outcome": "ran", "produced": stagecache.Stage.now()}
        interpreter = found.interpreter
        if interpreter is None:
            self._record(python, "profiles", profile, {"not_verified": found.why_none(), **stamp}, NOT_VERIFIED)
            return
        if interpreter.native:
            work = functools.partial(_timed, RUN[profile], self.dist, self.args.work / name, interpreter)
        elif profile in registry.PUBLISHED:
            work = functools.partial(_timed, _in_root(profile), self.dist, self.args.work, interpreter)
        else:
            why = f"{profile} runs on a native interpreter only; CPython {python} was found only in {interpreter.root}"
            self._record(python, "profiles", profile, {"not_verified": why, **stamp}, NOT_VERIFIED)
            return
        extra: dict[str, object] = {"interpreter": interpreter.key()}
        if interpreter.root:
            extra["debian root"] = debian.package_list(Path(interpreter.root))
        try:
            free = profile in registry.UPSTREAM_ONLY
            result, got = cached.run(
                name, self.dist, self.key, work, extra=extra, fresh=self.args.fresh, dist_free=free
            )
        except StageError as exc:  # VerifyError, and the carriers', locks' and base's roots below it
            print(f"error: {name}: {exc}", file=sys.stderr, flush=True)
            self._record(python, "profiles", profile, {"error": str(exc), **stamp}, FAILED)
            return
        result = {**result, **got, "interpreter": interpreter.as_dict()}
        self._record(python, "profiles", profile, result, OK)
        print(f"{name}: ok ({got['outcome']}, {result['elapsed_s']}s when produced)", flush=True)

    def upgrade(self, profile: str, found: Found) -> None:
        """The published profile moved from the predecessor (--previous) by pip and uv, on the first Python of
        the matrix (two closures installed per move: the other Pythons add hours for the same check); its
        result into that Python's evidence (`upgrade`), the verdict's `upgrade:PROFILE-cp3NN` item."""
        from . import upgrade

        python = found.python
        stamp = {"dist_sha256": self.key, "outcome": "ran", "produced": stagecache.Stage.now()}
        if found.interpreter is None or not found.interpreter.native:
            why = f"no native CPython {python} interpreter for the upgrade check ({found.why_none()})"
            self._record(python, "upgrade", profile, {"not_verified": why, **stamp}, NOT_VERIFIED)
            return
        name = f"upgrade:{registry.run_name(profile, python)}"
        print(f"[verify] {name}: from {self.args.previous} ...", flush=True)
        try:
            got = upgrade.upgrade_profile(
                self.dist, self.args.work / name.replace(":", "-"), found.interpreter, self.args.previous, profile
            )
        except Unreachable as exc:  # its index did not hand it over: NOT CHECKED, with how to provide it
            print(f"{name}: NOT VERIFIED: {exc}", flush=True)
            self._record(python, "upgrade", profile, {"not_verified": str(exc), **stamp}, NOT_VERIFIED)
            return
        except StageError as exc:  # the predecessor cannot be read or installed: named, with the reason
            print(f"error: {name}: {exc}", file=sys.stderr, flush=True)
            self._record(python, "upgrade", profile, {"error": str(exc), **stamp}, FAILED)
            return
        code = FAILED if got["problems"] else OK
        self._record(python, "upgrade", profile, {**got, **stamp}, code)
        print(f"{name}: {'FAILED' if code else 'ok'} ({got['seconds']} s)", flush=True)

    def resolve(self, found: dict[str, Found]) -> None:
        """Every (install profile, Python) resolved with that Python's interpreter; into the evidence."""

        def record(r: dict[str, Any]) -> None:
            code = FAILED if r["problems"] else NOT_VERIFIED if r["not_verified"] else OK
            self._record(r["python"], "resolution", r["profile"], r, code)

        try:
            resolution.run(
                self.dist,
                self.resolutions,
                {v: found[v].interpreter for v in self.pythons if v in found},
                fresh=self.args.fresh,
                work=self.args.work,
                on_result=record,
            )
        except (StageError, OSError) as exc:
            print(f"error: resolve: {exc}", file=sys.stderr, flush=True)
            with self.lock:
                self.codes.append(FAILED)


def _install_profiles() -> list[str]:
    from locks.read import install_profiles

    return install_profiles()


def _in_root(profile: str) -> Callable[[Path, Path, Interpreter], dict[str, Any]]:
    def run(dist: Path, work: Path, interpreter: Interpreter) -> dict[str, Any]:
        del work  # the root holds its own work folder
        return debian.exercise_published(dist, interpreter, profile)

    return run


def _timed(
    fn: Callable[[Path, Path, Interpreter], dict[str, Any]], dist: Path, work: Path, interpreter: Interpreter
) -> dict[str, Any]:
    t0 = time.perf_counter()
    work.mkdir(parents=True, exist_ok=True)
    result = fn(dist, work, interpreter)
    result["elapsed_s"] = round(time.perf_counter() - t0, 1)
    return result


if __name__ == "__main__":
    raise SystemExit(main())
