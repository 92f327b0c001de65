"""Normal resolution, verified: what a user gets from `pip install NAME==VERSION` against an index that
serves the release with the public index behind it, compared with the release's own install file.

pypiserver serves dist/ on 127.0.0.1 and redirects every project it does not hold to the public index
(its fallback), as a company mirror in front of PyPI does. pip resolves each profile's roots there
(`--dry-run --report`, so nothing is installed and only metadata is fetched), for this interpreter or,
for a Python without one here, by `--python-version`/`--platform`. The check: the release's carriers
come from dist/ (the very files), no upstream project a fork replaces is installed, and every version
equals dist/install/<profile>-cp3XX.txt's."""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name
from packaging.version import Version

from base import distdir, interpreters, paths, progress, stages, swap
from base.cli import dist_option, fresh_option
from base.errors import StageError, report
from base.interpreters import ENV, Interpreter
from base.version import python_tag
from locks.indexes import extra_indexes
from locks.read import LockError
from locks.simple import project_state
from locks.targets import MANYLINUX_2_34, target_args

from . import cached
from .venv import VerifyError

PUBLIC = "https://pypi.org/simple"
UPSTREAMS = ("transformers", "accelerate", "sglang", "sglang-kernel", "peft", "trl", "llamafactory")
HERE = f"{sys.version_info.major}.{sys.version_info.minor}"  # the CPython pip resolves for without --python-version
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)", re.MULTILINE)


class ResolutionError(VerifyError):
    """The check could not run (no index, pip failed); the message says why."""


@dataclass
class Result:
    """One profile's normal resolution on one Python, and what is wrong with it."""

    profile: str
    python: str
    roots: list[str]
    installed: dict[str, str] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    drift: list[str] = field(default_factory=list)  # newer third-party releases than the lock: re-lock to ship
    not_verified: str = ""  # why this profile cannot be resolved here (it is not a pass)
    seconds: float = 0.0
    interpreter: str = ""  # how the Python was resolved for (its own interpreter, or simulated)
    simulated: bool = False  # no interpreter of that Python: pip --python-version from this one

    def as_dict(self) -> dict[str, Any]:
        return {
            "profile": self.profile,
            "python": self.python,
            "roots": self.roots,
            "packages": len(self.installed),
            "problems": self.problems,
            "drift": self.drift,
            "not_verified": self.not_verified,
            "interpreter": self.interpreter,
            "simulated": self.simulated,
            "ok": not self.problems and not self.not_verified,
            "seconds": round(self.seconds, 1),
        }


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextmanager
def index(dist: Path, fallback: str = PUBLIC, timeout: float = 30.0) -> Iterator[str]:
    """pypiserver on 127.0.0.1 serving dist/ (sha256 in every link), other projects redirected to `fallback`."""
    port = _free_port()
    cmd = [sys.executable, "-m", "pypiserver", "run", "-i", "127.0.0.1", "-p", str(port), "--fallback-url", fallback]
    # It logs every request: a pipe nobody reads would fill and stall it, so the log goes to a file.
    with tempfile.TemporaryFile() as log:
        server = subprocess.Popen([*cmd, str(dist)], stdout=subprocess.DEVNULL, stderr=log)
        url = f"http://127.0.0.1:{port}/simple/"
        try:
            deadline = time.monotonic() + timeout
            while True:
                try:
                    with urllib.request.urlopen(url, timeout=2):
                        break
                except OSError:
                    if server.poll() is not None or time.monotonic() > deadline:
                        log.seek(0)
                        err = log.read().decode(errors="replace")[-2000:]
                        raise ResolutionError(f"pypiserver did not come up on {url}: {err or 'timed out'}") from None
                    time.sleep(0.2)
            yield url
        finally:
            server.terminate()
            server.wait(timeout=10)


def _pip_copy(work: Path) -> Path:
    """The locked pip (lockfiles/verify.txt, this session's) copied as a bare package folder under `work`:
    `INTERPRETER -I <copy>/pip` runs that pip with any CPython (pip is pure Python and its __main__ runs
    from a folder), so every Python resolves with one pip version and its own tags and markers."""
    import importlib.metadata
    import importlib.util

    spec = importlib.util.find_spec("pip")
    if spec is None or spec.origin is None:
        raise ResolutionError("pip is not installed beside verify; install lockfiles/verify.txt (nox does)")
    src = Path(spec.origin).resolve().parent
    version = importlib.metadata.version("pip")
    dest = work / f"pip-{version}"
    if not (dest / "pip" / "__main__.py").is_file():
        tmp = swap.part(dest)
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(src, tmp / "pip", ignore=shutil.ignore_patterns("__pycache__"))
        try:
            tmp.rename(dest)
        except OSError:  # another process copied it first
            shutil.rmtree(tmp, ignore_errors=True)
    return dest / "pip"


def how(python: str, interpreter: Interpreter | None) -> str:
    """How a Python is resolved for here (part of the result and of its key)."""
    if interpreter is not None:
        where = f" in {Path(interpreter.root).name}" if interpreter.root else ""
        return f"CPython {interpreter.version}{where} ({interpreter.source}: {interpreter.path})"
    return f"simulated: pip --python-version {python} on CPython {HERE} (environment markers are {HERE}'s)"


def host_ca() -> Path | None:
    """The CA bundle this machine's pip trusts (PIP_CERT, REQUESTS_CA_BUNDLE, SSL_CERT_FILE, OpenSSL's
    default): a site behind a TLS-inspecting proxy trusts its CA there, and a bare root does not."""
    import ssl

    for candidate in (
        os.environ.get("PIP_CERT"),
        os.environ.get("REQUESTS_CA_BUNDLE"),
        os.environ.get("SSL_CERT_FILE"),
        ssl.get_default_verify_paths().cafile,
    ):
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    return None


def _pip_command(interpreter: Interpreter | None, work: Path) -> tuple[list[str], Path, str, dict[str, str] | None]:
    """(the pip command, where its report lands here, the report path as pip sees it, its environment) for
    resolving with `interpreter` (None: simulated with this one)."""
    report = work / "report.json"
    if interpreter is None:
        return [sys.executable, "-m", "pip"], report, str(report), None
    if interpreter.native:
        return [interpreter.path, "-I", str(_pip_copy(work))], report, str(report), None
    # A Debian root: the pip copy and the report inside it; trust the CAs this machine's pip trusts (pip
    # verifies through truststore there, the system's store: OpenSSL's, which SSL_CERT_FILE sets)
    box = Path(interpreter.root) / "kt-resolve"
    shutil.rmtree(box, ignore_errors=True)
    box.mkdir(parents=True)
    shutil.copytree(_pip_copy(work), box / "pip")
    env = None
    ca = host_ca()
    if ca is not None:
        shutil.copyfile(ca, box / "ca.pem")
        env = {**os.environ, "SSL_CERT_FILE": "/kt-resolve/ca.pem"}
    return (
        interpreter.command(interpreter.path, "-I", "/kt-resolve/pip"),
        box / "report.json",
        "/kt-resolve/report.json",
        env,
    )


def resolve(
    index_url: str,
    requirements: list[str],
    python: str,
    interpreter: Interpreter | None,
    behind: tuple[str, ...] = (),
    work: Path | None = None,
) -> dict[str, tuple[str, str]]:
    """name -> (version, file URL) pip would install for `requirements` on CPython `python` (x86_64 Linux)
    from `index_url` alone: the locked pip run by that Python's own `interpreter` (here or in its Debian
    root), or, with none, simulated from this one (pip's --python-version: tags and Requires-Python are
    3.N's, environment markers this interpreter's)."""
    with tempfile.TemporaryDirectory(dir=work) as tmp:
        pip_cmd, report, report_arg, env = _pip_command(interpreter, Path(tmp))
        target = target_args(python, MANYLINUX_2_34) if interpreter is None else []
        cmd = [*pip_cmd, "install", "--isolated", "--disable-pip-version-check", "--dry-run", "--quiet"]
        cmd += ["--ignore-installed", "--report", report_arg, "--index-url", index_url, *extra_indexes(behind)]
        got = progress.run_quiet([*cmd, *target, *requirements], f"resolve: CPython {python}", env=env)
        if got.returncode != 0:
            raise ResolutionError(
                f"pip could not resolve {' '.join(requirements)} for CPython {python} "
                f"({how(python, interpreter)}):\n{got.stderr[-3000:]}"
            )
        data = json.loads(report.read_text())
        if interpreter is not None and not interpreter.native:
            shutil.rmtree(report.parent, ignore_errors=True)
    return {
        canonicalize_name(i["metadata"]["name"]): (i["metadata"]["version"], i["download_info"]["url"])
        for i in data["install"]
    }


def check(
    dist: Path,
    profile: str,
    python: str,
    roots: list[str],
    index_url: str,
    interpreter: Interpreter | None,
    behind: tuple[str, ...] = (),
    work: Path | None = None,
) -> Result:
    """Resolve the profile's roots at the release's versions with `interpreter`'s own markers (None:
    simulated) and compare with its install file. A simulated resolution can fail, never pass: what it
    does not find wrong is NOT VERIFIED (its environment markers are another Python's)."""
    t0 = time.perf_counter()
    release = distdir.open_release(dist)
    versions = release.manifest.versions()
    files = {w.filename for w in release.manifest.wheels}
    reqs = [f"{r}=={versions[canonicalize_name(r.split('[')[0])]}" for r in roots]
    result = Result(profile, python, reqs, interpreter=how(python, interpreter), simulated=interpreter is None)
    install, _ = release.install_file(profile, python)
    sdists = re.findall(r"^--no-binary (\S+)", install.read_text(), re.MULTILINE)
    if sdists and interpreter is None:
        result.not_verified = (
            f"{', '.join(sdists)} has only an sdist for CPython {python}; pip resolves for a Python it does not run "
            f"only from wheels, so this needs a CPython {python} interpreter"
        )
        return result
    try:
        got = resolve(index_url, reqs, python, interpreter, behind, work)
    except ResolutionError as exc:
        result.problems.append(str(exc))
        return result
    result.installed = {n: v for n, (v, _) in got.items()}
    result.problems, result.drift = judge(got, install.read_text(), install.name, versions, files)
    if interpreter is None and not result.problems:
        result.not_verified = (
            f"simulated (no CPython {python} interpreter here): pip --python-version evaluates environment markers "
            f"as CPython {HERE}; it found nothing wrong, which proves nothing for {python}"
        )
    result.seconds = time.perf_counter() - t0
    return result


def judge(
    got: dict[str, tuple[str, str]], install_text: str, install_name: str, versions: dict[str, str], files: set[str]
) -> tuple[list[str], list[str]]:
    """(problems, drift) of a resolution (`got`: name -> (version, URL)) against the release. Problems: an
    upstream a fork replaces, a carrier from anywhere but the release's files, a version other than the
    install file's (older, or a carrier's), a package of the install file left out or one it lacks.
    Drift: a third-party package resolving newer than the install file pins (released since the lock;
    `nox -s lock` brings it in)."""
    pinned: dict[str, str] = {canonicalize_name(m.group(1)): m.group(2) for m in _PIN.finditer(install_text)}
    drift: list[str] = []
    problems = [
        f"installs upstream {n} {got[n][0]} beside (or instead of) its KT fork"
        for n in sorted(set(got) & set(UPSTREAMS))
    ]
    for name, (version, url) in sorted(got.items()):
        if name in versions and url.rsplit("/", 1)[-1].split("#")[0] not in files:
            problems.append(f"{name} {version} comes from {url}, not from the release's own files")
        pin = pinned.get(name)
        if pin == version:
            continue
        message = f"{name}: resolves to {version}, {install_name} pins {pin or 'nothing'}"
        newer = pin is not None and name not in versions and Version(version) > Version(pin)
        (drift if newer else problems).append(message)
    problems += [
        f"{n}=={pinned[n]} is in {install_name} but normal resolution does not install it"
        for n in sorted(set(pinned) - set(got))
    ]
    return problems, drift


def run(
    dist: Path,
    pairs: Sequence[tuple[str, str]],
    found: Mapping[str, Interpreter | None],
    *,
    fallback: str = PUBLIC,
    fresh: bool = False,
    max_age_h: float = stages.RESOLUTION_MAX_AGE_H,
    work: Path | None = None,
    on_result: Callable[[dict[str, Any]], None] = lambda _: None,
) -> list[dict[str, Any]]:
    """Normal resolution of each (install profile, Python) in `pairs` from a local index serving `dist`,
    each with the interpreter `found` for its Python (None: simulated); each result (reused or run) given
    to `on_result` as it comes, and all of them returned in `pairs`' order."""
    from locks.read import directive

    key = cached.dist_key(dist)
    # One record per profile and Python: a resolution that cannot be verified here (NOT VERIFIED) runs
    # again each time, without taking the proven ones with it.
    todo: list[tuple[str, str, cached.Lookup]] = []
    results: dict[tuple[str, str], dict[str, Any]] = {}
    # the records' locks are taken in one global order (their names'), whatever order `pairs` is in
    for profile, python in sorted(pairs, key=lambda pair: f"resolve-{pair[0]}-{python_tag(pair[1])}"):
        interpreter = found.get(python)
        extra = {
            "profile": profile,
            "python": python,
            "fallback": fallback,
            "interpreter": interpreter.key() if interpreter else how(python, None),
        }
        name = f"resolve-{profile}-{python_tag(python)}"
        lookup = cached.Lookup(name, dist, key, extra=extra, fresh=fresh, max_age_s=max_age_h * 3600)
        if lookup.hit is not None:
            results[(profile, python)] = {**lookup.hit[0], **lookup.hit[1]}
            _say(results[(profile, python)])
            on_result(results[(profile, python)])
        else:
            todo.append((profile, python, lookup))
    if todo:
        todo.sort(key=lambda t: pairs.index((t[0], t[1])))
        with index(dist, fallback) as url:
            for profile, python, lookup in todo:
                roots = directive(paths.LOCKFILES / f"{profile}.in", "carriers")
                print(
                    f"[resolve] {profile} on CPython {python}: pip install {' '.join(roots)} from {url} ...", flush=True
                )
                r = check(dist, profile, python, roots, url, found.get(python), work=work).as_dict()
                results[(profile, python)] = {**r, **lookup.record(r, _proved([r]))}
                _say(r)
                on_result(results[(profile, python)])
    return [results[pair] for pair in pairs]


def main(argv: list[str] | None = None) -> int:
    """python -m verify.resolution --dist dist --profile sft --python 3.11 [--interpreter 3.N=PATH] [--json F]."""
    from carriers import load as load_carriers
    from locks.read import install_profiles

    p = argparse.ArgumentParser(prog="python -m verify.resolution")
    dist_option(p)
    p.add_argument("--profile", action="append", default=[], help="install profile(s) (default: every one)")
    p.add_argument("--python", action="append", default=[], metavar="3.N", help="default: the release's matrix")
    p.add_argument(
        "--interpreter", action="append", default=[], metavar="3.N=PATH", help=f"CPython 3.N's interpreter ({ENV})"
    )
    p.add_argument("--fallback", default=PUBLIC, help="the public index behind the release's")
    p.add_argument(
        "--index",
        metavar="URL",
        help="resolve from this index (where the release was published; the public index behind it unless it is "
        "that one) instead of a local one serving --dist; never reused",
    )
    p.add_argument(
        "--no-install",
        action="store_true",
        help="with --index: resolve only (no real install of the sft profile from the index)",
    )
    p.add_argument("--json", type=Path)
    fresh_option(p, "resolve")
    p.add_argument(
        "--max-age",
        type=float,
        default=_max_age_default(),
        metavar="HOURS",
        help="a resolution against the live index is redone after this long "
        f"(default {stages.RESOLUTION_MAX_AGE_H:g}; KT_RESOLVE_MAX_AGE_H)",
    )
    args = p.parse_args(argv)
    args.profile = args.profile or install_profiles()
    args.python = args.python or list(load_carriers().pythons)
    try:
        distdir.open_release(args.dist)
        given = interpreters.parse_given(args.interpreter)
    except StageError as exc:
        return report(exc)
    found = {v: interpreters.find(v, given).interpreter for v in args.python}
    if args.index:
        return _from_published(args, found)
    pairs = [(profile, python) for profile in args.profile for python in args.python]
    try:
        results = run(args.dist, pairs, found, fallback=args.fallback, fresh=args.fresh, max_age_h=args.max_age)
    except (StageError, OSError, KeyError, ValueError) as exc:  # ValueError: a corrupt manifest.json
        return report(exc)
    if args.json:
        key = cached.dist_key(args.dist)
        outcome = "ran" if any(r.get("outcome") == "ran" for r in results) else "reused"
        args.json.write_text(json.dumps({"dist_sha256": key, "outcome": outcome, "results": results}, indent=2) + "\n")
    return 1 if any(r["problems"] for r in results) else 0


def _falls_back(index_url: str, public: str) -> bool:
    """Whether the index is the public one, or serves the public index's projects itself (pypiserver's
    --fallback-url, a mirror): then users point pip at it alone. Told by pip's own project page: the
    public index's newest pip file is on the index's page too. Else (TestPyPI, a private index) users add
    the public index with --extra-index-url, which merges both: a project on both offers both's files."""
    if index_url.rstrip("/") == public.rstrip("/"):
        return True
    try:
        newest = sorted(project_state(public, "pip", sizes=False).versions(), key=Version)[-1:]
        ours = project_state(index_url, "pip", sizes=False, as_pip_sees_it=True).versions()
    except LockError:
        return False
    return bool(newest) and newest[0] in ours


def _from_published(args: argparse.Namespace, found: Mapping[str, Interpreter | None]) -> int:
    """Every profile on every Python resolved from the index the release went to, the public index behind
    it: the same judgement as before publishing, from where users will get it."""
    from locks.read import directive

    behind: tuple[str, ...] = () if _falls_back(args.index, args.fallback) else (args.fallback,)
    how_behind = f"with {args.fallback} behind it" if behind else "which serves the public index's projects itself"
    print(f"[resolve] from {args.index}, {how_behind}", flush=True)
    results = []
    try:
        for profile in args.profile:
            for python in args.python:
                roots = directive(paths.LOCKFILES / f"{profile}.in", "carriers")
                print(f"[resolve] {profile} on CPython {python} from {args.index} ...", flush=True)
                r = check(args.dist, profile, python, roots, args.index, found.get(python), behind).as_dict()
                results.append(r)
                _say(r)
        sft: dict[str, Any] = {}
        if not args.no_install:
            from .sft import verify_sft

            sft = verify_sft(args.dist, paths.BUILD / "verify" / "published", index_url=args.index, behind=behind)
            print(f"[resolve] sft installed from {args.index} and exercised: {sft['installed']} packages", flush=True)
    except (StageError, OSError, KeyError, ValueError) as exc:
        return report(exc)
    if args.json:
        args.json.write_text(json.dumps({"index": args.index, "results": results, "sft": sft}, indent=2) + "\n")
    return _published_status(results)


def _published_status(results: list[dict[str, Any]]) -> int:
    """1 if a resolution from the index went wrong; 2 if one could not be checked here (NOT VERIFIED: the
    check did not run, which is no pass), named; 0 only when every one was checked and agrees."""
    if any(r["problems"] for r in results):
        return 1
    unchecked = [f"{r['profile']} on CPython {r['python']}" for r in results if r["not_verified"]]
    if unchecked:
        print(f"INCOMPLETE: not verified from the index: {', '.join(unchecked)}", file=sys.stderr, flush=True)
        return 2
    return 0


def _max_age_default() -> float:
    """KT_RESOLVE_MAX_AGE_H, else base.stages' default; a value that is not a number is said and ignored."""
    raw = os.environ.get("KT_RESOLVE_MAX_AGE_H", "")
    try:
        return float(raw) if raw else stages.RESOLUTION_MAX_AGE_H
    except ValueError:
        print(f"warning: KT_RESOLVE_MAX_AGE_H={raw!r} is not a number of hours; using {stages.RESOLUTION_MAX_AGE_H:g}")
        return stages.RESOLUTION_MAX_AGE_H


def _proved(results: list[dict[str, Any]]) -> bool:
    """Every profile resolved on every Python with no problem (a NOT VERIFIED one is run again)."""
    return all(not r["problems"] and not r["not_verified"] for r in results)


def _say(r: dict[str, Any]) -> None:
    """One resolution's verdict line, its problems and its drift."""
    verdict = (
        f"NOT VERIFIED: {r['not_verified']}"
        if r["not_verified"]
        else "ok"
        if not r["problems"]
        else f"{len(r['problems'])} problems"
    )
    print(
        f"[resolve] {r['profile']} {python_tag(r['python'])}: {r['packages']} packages, {verdict} ({r['seconds']:.0f}s)"
    )
    for problem in r["problems"]:
        print(f"  error: {problem}", file=sys.stderr)
    for note in r["drift"]:
        print(f"  warning: {note} (newer since the lock; `nox -s lock` ships it)", file=sys.stderr)


if __name__ == "__main__":
    raise SystemExit(main())
