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
import hashlib
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
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name
from packaging.version import Version

from base import distdir, paths, progress, stages
from base.cli import dist_option, fresh_option
from base.errors import StageError, report
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


def interpreter_root(python: str) -> Path | None:
    """The Debian root whose CPython `python` pip can run in (verify_install --profile cp313 makes it), if
    there is one and this process may chroot into it: resolving there evaluates environment markers as that
    Python does (pip's --python-version changes tags and Requires-Python, not markers)."""
    from .interpreters import SUITES

    suite = SUITES.get(python)
    if suite is None or os.geteuid() != 0 or shutil.which("chroot") is None:
        return None
    root = paths.CACHE / f"debian-{suite}"
    return root if (root / "usr" / "bin" / f"python{python}").exists() else None


def how(python: str) -> str:
    """How a Python is resolved for here (part of the result and of its key)."""
    if python == HERE:
        return f"CPython {python}, this interpreter"
    root = interpreter_root(python)
    if root is not None:
        from .interpreters import package_list

        packages = hashlib.sha256(package_list(python, paths.CACHE).encode()).hexdigest()[:16]
        return f"CPython {python} in {root.name} (packages {packages})"
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


def _resolve_in(
    root: Path, python: str, index_url: str, requirements: list[str], behind: tuple[str, ...] = ()
) -> dict[str, Any]:
    """pip's --dry-run --report with the root's own CPython (a venv made there), trusting the CAs this
    machine's pip trusts (the index behind the release's is reached over TLS); the report's JSON."""
    work = root / "kt-resolve"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    ca = host_ca()
    if ca is not None:
        shutil.copyfile(ca, work / "ca.pem")
    try:
        made = subprocess.run(
            ["chroot", str(root), f"python{python}", "-m", "venv", "/kt-resolve/venv"],
            capture_output=True,
            text=True,
            check=False,
        )
        if made.returncode != 0:
            raise ResolutionError(f"a venv of CPython {python} in {root} failed: {made.stderr[-1500:]}")
        cmd = ["chroot", str(root), "/kt-resolve/venv/bin/python", "-m", "pip", "install", "--isolated", "--dry-run"]
        cmd += ["--quiet", "--ignore-installed", "--report", "/kt-resolve/report.json", "--index-url", index_url]
        cmd += extra_indexes(behind)
        # pip 25 verifies through truststore (the system's store: OpenSSL's, which SSL_CERT_FILE sets), not --cert
        env = {**os.environ, "SSL_CERT_FILE": "/kt-resolve/ca.pem"} if ca is not None else None
        got = progress.run_quiet([*cmd, *requirements], f"resolve: CPython {python} ({root.name})", env=env)
        if got.returncode != 0:
            raise ResolutionError(
                f"pip could not resolve {' '.join(requirements)} on CPython {python} ({root}):\n{got.stderr[-3000:]}"
            )
        data: dict[str, Any] = json.loads((work / "report.json").read_text())
        return data
    finally:
        shutil.rmtree(work, ignore_errors=True)


def resolve(
    index_url: str, requirements: list[str], python: str, behind: tuple[str, ...] = ()
) -> dict[str, tuple[str, str]]:
    """name -> (version, file URL) pip would install for `requirements` on CPython `python` (x86_64
    Linux), from `index_url` alone: with that Python itself where this machine has it (here, or in its
    Debian root), else simulated from this one (pip's --python-version)."""
    root = None if python == HERE else interpreter_root(python)
    if root is not None:
        data = _resolve_in(root, python, index_url, requirements, behind)
        return {
            canonicalize_name(i["metadata"]["name"]): (i["metadata"]["version"], i["download_info"]["url"])
            for i in data["install"]
        }
    target = [] if python == HERE else target_args(python, MANYLINUX_2_34)
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--isolated",
            "--dry-run",
            "--quiet",
            "--ignore-installed",
            "--report",
            str(report),
            "--index-url",
            index_url,
            *extra_indexes(behind),
            *target,
            *requirements,
        ]
        got = progress.run_quiet(cmd, f"resolve: CPython {python}")
        if got.returncode != 0:
            raise ResolutionError(
                f"pip could not resolve {' '.join(requirements)} for CPython {python}:\n{got.stderr[-3000:]}"
            )
        data = json.loads(report.read_text())
    return {
        canonicalize_name(i["metadata"]["name"]): (i["metadata"]["version"], i["download_info"]["url"])
        for i in data["install"]
    }


def check(
    dist: Path, profile: str, python: str, roots: list[str], index_url: str, behind: tuple[str, ...] = ()
) -> Result:
    """Resolve the profile's roots at the release's versions and compare with its install file."""
    t0 = time.perf_counter()
    release = distdir.open_release(dist)
    versions = release.manifest.versions()
    files = {w.filename for w in release.manifest.wheels}
    reqs = [f"{r}=={versions[canonicalize_name(r.split('[')[0])]}" for r in roots]
    result = Result(profile, python, reqs, interpreter=how(python))
    install, _ = release.install_file(profile, python)
    sdists = re.findall(r"^--no-binary (\S+)", install.read_text(), re.MULTILINE)
    if sdists and python != HERE:
        result.not_verified = (
            f"{', '.join(sdists)} has only an sdist for CPython {python}; pip resolves for a Python it does not run "
            f"only from wheels, so this needs a CPython {python} interpreter"
        )
        return result
    try:
        got = resolve(index_url, reqs, python, behind)
    except ResolutionError as exc:
        result.problems.append(str(exc))
        return result
    result.installed = {n: v for n, (v, _) in got.items()}
    result.problems, result.drift = judge(got, install.read_text(), install.name, versions, files)
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


def main(argv: list[str] | None = None) -> int:
    """python -m verify.resolution --dist dist --profile sft --python 3.11 [--roots ...] [--json F]."""
    from carriers import load as load_carriers
    from locks.read import directive, install_profiles

    p = argparse.ArgumentParser(prog="python -m verify.resolution")
    dist_option(p)
    p.add_argument("--profile", action="append", default=[], help="install profile(s) (default: every one)")
    p.add_argument("--python", action="append", default=[], metavar="3.N", help="default: the release's matrix")
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
    root = paths.ROOT
    try:
        distdir.open_release(args.dist)
    except distdir.DistError as exc:
        return report(exc)

    if args.index:
        return _from_published(args, root)
    try:
        key = cached.dist_key(args.dist)
        # One record per profile and Python: a resolution that cannot be verified here (NOT VERIFIED)
        # runs again each time, without taking the proven ones with it.
        todo: list[tuple[str, str, cached.Lookup]] = []
        results: list[dict[str, Any]] = []
        for profile in args.profile:
            for python in args.python:
                extra = {"profile": profile, "python": python, "fallback": args.fallback, "interpreter": how(python)}
                name = f"resolve-{profile}-{python_tag(python)}"
                found = cached.Lookup(
                    name, args.dist, key, extra=extra, fresh=args.fresh, max_age_s=args.max_age * 3600
                )
                if found.hit is not None:
                    results.append({**found.hit[0], **found.hit[1]})
                    _say(results[-1])
                else:
                    todo.append((profile, python, found))
        if todo:
            with index(args.dist, args.fallback) as url:
                for profile, python, found in todo:
                    roots = directive(root / "lockfiles" / f"{profile}.in", "carriers")
                    print(
                        f"[resolve] {profile} on CPython {python}: pip install {' '.join(roots)} from {url} ...",
                        flush=True,
                    )
                    r = check(args.dist, profile, python, roots, url).as_dict()
                    results.append({**r, **found.record(r, _proved([r]))})
                    _say(r)
    except (StageError, OSError, KeyError, ValueError) as exc:  # ValueError: a corrupt manifest.json
        return report(exc)
    order = {(p, v): i for i, (p, v) in enumerate((p, v) for p in args.profile for v in args.python)}
    results.sort(key=lambda r: order[(r["profile"], r["python"])])
    if args.json:
        stamp = {"dist_sha256": key, "outcome": "reused" if not todo else "ran"}
        args.json.write_text(json.dumps({**stamp, "results": results}, indent=2) + "\n")
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


def _from_published(args: argparse.Namespace, root: Path) -> int:
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
                roots = directive(root / "lockfiles" / f"{profile}.in", "carriers")
                print(f"[resolve] {profile} on CPython {python} from {args.index} ...", flush=True)
                r = check(args.dist, profile, python, roots, args.index, behind).as_dict()
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
