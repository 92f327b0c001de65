"""Which interpreter runs each CPython of the release's matrix: the one owner of finding them.

For CPython 3.N the sources are asked in order, and the first interpreter that proves itself is used:

1. ``given``: ``--interpreter 3.N=PATH`` on verify's command line, or ``KT_INTERPRETERS`` in the environment
   (``3.12=/opt/py/bin/python3.12:3.13=/usr/bin/python3.13``, entries separated like PATH's);
2. ``PATH``: every ``python3.N`` on PATH, in PATH's order (a pyenv shim that pyenv does not select here
   is passed over and said so: the pyenv source looks at its installed versions itself);
3. ``pyenv``: pyenv's installed versions (``$PYENV_ROOT``, ``pyenv root``, or ``~/.pyenv``), newest patch first;
4. ``uv``: a uv-managed Python (``uv python find --managed-python``; never a download);
5. ``debian``: python3.N in a Debian root of the running user's (``base.paths.DEBIAN_ROOTS``, never a shared
   cache; made by verify_install with debootstrap where the machine allows it and no other source found one),
   run with chroot only when the root and the path to its interpreter are the running user's alone; the last
   resort.

A candidate proves itself by running ``base/interpreter_probe.py``: CPython, exactly 3.N, not a
free-threaded build, able to make a venv. One that fails is kept with its problem and the fix (``tried``)
and the next is asked: never skipped silently. An interpreter given explicitly is the only one asked
for its Python: if it fails, that Python has none (a user's explicit choice is not overridden).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import shutil
import stat
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from . import paths
from .errors import StageError

SOURCES = ("given", "PATH", "pyenv", "uv", "debian")
ENV = "KT_INTERPRETERS"
PROBE = Path(__file__).resolve().parent / "interpreter_probe.py"
# The Debian suite whose python3 is CPython 3.N (a root made by debootstrap from the Debian mirror).
DEBIAN_SUITES = {"3.11": "bookworm", "3.13": "trixie"}
PROBE_TIMEOUT_S = 60.0


class InterpreterError(StageError):
    """An --interpreter value that cannot be read (exit 2: nothing ran)."""

    exit_code = 2


@dataclass(frozen=True)
class Interpreter:
    """A CPython that proved itself: `path` as it runs (inside `root` when it runs in a Debian root)."""

    python: str  # "3.12": the matrix entry it serves
    path: str
    version: str  # exact, as it reports itself: "3.12.1"
    source: str  # one of SOURCES
    how: str  # where the source found it, for people
    root: str = ""  # a Debian root it runs in with chroot; "" on this machine's own file system

    def command(self, *argv: str) -> list[str]:
        """`argv` (its first item a path as the interpreter sees it) run where the interpreter lives."""
        return ["chroot", self.root, *argv] if self.root else list(argv)

    @property
    def native(self) -> bool:
        return not self.root

    def host_path(self) -> Path:
        """The interpreter's file as this machine sees it."""
        return Path(self.root) / self.path.lstrip("/") if self.root else Path(self.path)

    def key(self) -> dict[str, str]:
        """What a result obtained with it depends on: where it is, what it says it is, its bytes."""
        try:
            digest = hashlib.sha256(self.host_path().resolve().read_bytes()).hexdigest()
        except OSError:
            digest = "unreadable"
        return {"path": self.path, "version": self.version, "source": self.source, "root": self.root, "sha256": digest}

    def as_dict(self) -> dict[str, str]:
        return asdict(self)


@dataclass(frozen=True)
class Attempt:
    """A candidate that did not prove itself: where it was found, what is wrong, the fix."""

    source: str
    path: str
    problem: str
    fix: str

    def line(self) -> str:
        return f"{self.source} {self.path}: {self.problem} (fix: {self.fix})"


@dataclass(frozen=True)
class Found:
    """The outcome of the search for one Python: the interpreter (or None), every candidate that
    failed, and what each source looked at."""

    python: str
    interpreter: Interpreter | None
    tried: tuple[Attempt, ...] = ()
    searched: tuple[str, ...] = field(default=())

    def why_none(self) -> str:
        """NOT VERIFIED's reason when there is no interpreter: the sources tried and how to provide one."""
        parts = [*self.searched, *(a.line() for a in self.tried)]
        return (
            f"no CPython {self.python} interpreter ({'; '.join(parts)}); provide one: pyenv install {self.python}, "
            f"uv python install {self.python}, your distribution's python{self.python} package, or name it with "
            f"--interpreter {self.python}=/path/to/python{self.python} ({ENV})"
        )

    def as_dict(self) -> dict[str, object]:
        return {
            "python": self.python,
            "interpreter": self.interpreter.as_dict() if self.interpreter else None,
            "tried": [asdict(a) for a in self.tried],
            "searched": list(self.searched),
        }


def current() -> Interpreter:
    """The interpreter running this process, as an Interpreter (tests; the Python nox itself runs on)."""
    import sys

    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    return Interpreter(python, sys.executable, platform.python_version(), "this process", "the running interpreter")


def parse_given(values: Iterable[str], environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """`3.N=PATH` values (the command line's, then KT_INTERPRETERS's; the command line wins) as
    {"3.N": PATH}; InterpreterError naming a malformed one."""
    environ = os.environ if environ is None else environ
    out: dict[str, str] = {}
    from_env = [v for v in environ.get(ENV, "").split(os.pathsep) if v.strip()]
    for origin, items in ((ENV, from_env), ("--interpreter", list(values))):
        for value in items:
            python, sep, path = value.partition("=")
            if not sep or not re.fullmatch(r"3\.\d+", python.strip()) or not path.strip():
                raise InterpreterError(
                    f"{origin} {value!r}: give the CPython version and the interpreter's path, "
                    "e.g. --interpreter 3.12=/usr/bin/python3.12"
                )
            given = path.strip()
            # a relative path is made absolute here, once: venvs and links are made from other directories
            out[python.strip()] = given if "/" not in given else os.path.abspath(given)  # noqa: PTH100 (no link followed)
    return out


def _probe(command: list[str]) -> tuple[dict[str, object] | None, str]:
    """What base/interpreter_probe.py says of itself run by `command`, or (None, the failure)."""
    try:
        ran = subprocess.run(command, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S, check=False)
    except OSError as exc:
        return None, f"does not run ({exc.strerror or exc})"
    except subprocess.TimeoutExpired:
        return None, f"did not answer within {PROBE_TIMEOUT_S:.0f} s"
    if ran.returncode != 0:
        tail = " ".join((ran.stderr or ran.stdout).split())[:300]
        return None, f"exits {ran.returncode}: {tail}"
    try:
        data = json.loads(ran.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return None, f"printed no answer to the probe: {ran.stdout[-200:]!r}"
    return (data, "") if isinstance(data, dict) else (None, "printed no answer to the probe")


def _judge(python: str, data: dict[str, object]) -> tuple[str, str]:
    """(problem, fix) of a probed candidate for CPython `python`; ("", "") when it serves."""
    if data.get("implementation") != "cpython":
        return f"is {data.get('implementation')} {data.get('version')}, not CPython", "name a CPython interpreter"
    if data.get("major_minor") != python:
        return f"reports Python {data.get('version')}, not {python}", f"name a CPython {python} interpreter"
    if data.get("free_threaded"):
        return "is a free-threaded build (cp3Nt), another ABI than the release's", "name the default (GIL) build"
    if data.get("machine") not in ("x86_64", "AMD64"):
        return f"runs on {data.get('machine')}, the release is x86_64", "name an x86_64 interpreter"
    if not data.get("venv"):
        return (
            "cannot make a venv (no venv/ensurepip module)",
            f"install its venv support (Debian/Ubuntu: apt-get install python{python}-venv)",
        )
    return "", ""


def _candidate(python: str, source: str, path: str, how: str, root: str = "") -> Interpreter | Attempt:
    """Probe one candidate: the Interpreter, or the Attempt that says why not."""
    if root:
        from .cachedir import CacheError, owned

        inside = Path(root) / "kt-probe" / PROBE.name
        try:
            owned(inside.parent, "probe folder")  # a symlink planted as kt-probe would have root write elsewhere
            _copy_nofollow(PROBE, inside)
        except (OSError, CacheError) as exc:
            return Attempt(source, path, f"the probe cannot be copied into {root}: {exc}", "check the root")
        data, failure = _probe(["chroot", root, path, f"/kt-probe/{PROBE.name}"])
    else:
        data, failure = _probe([path, str(PROBE)])
    if data is None:
        return Attempt(
            source, path, failure, f"repair or remove it, or name a working one: --interpreter {python}=PATH"
        )
    problem, fix = _judge(python, data)
    if problem:
        return Attempt(source, path, problem, fix)
    return Interpreter(python, path, str(data["version"]), source, how, root)


def _copy_nofollow(src: Path, dest: Path) -> None:
    """`src` copied to `dest`, replacing it, never through a symbolic link at `dest` (O_NOFOLLOW)."""
    if dest.is_symlink():
        dest.unlink()
    fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "wb") as out:
        out.write(src.read_bytes())


def _pyenv_root(environ: Mapping[str, str]) -> Path | None:
    if environ.get("PYENV_ROOT"):
        return Path(environ["PYENV_ROOT"])
    pyenv = shutil.which("pyenv", path=environ.get("PATH"))
    if pyenv:
        try:
            got = subprocess.run([pyenv, "root"], capture_output=True, text=True, timeout=30, check=False)
        except (OSError, subprocess.TimeoutExpired):
            got = None
        if got is not None and got.returncode == 0 and got.stdout.strip():
            return Path(got.stdout.strip())
    home = Path(environ.get("HOME", str(Path.home()))) / ".pyenv"
    return home if home.is_dir() else None


def _path_candidates(python: str, environ: Mapping[str, str], pyenv: Path | None) -> tuple[list[str], list[str]]:
    """(every python3.N on PATH, in order, without repeats; the pyenv shims passed over)."""
    found: list[str] = []
    shims: list[str] = []
    seen: set[str] = set()
    for d in environ.get("PATH", "").split(os.pathsep):
        # absolute before use: a relative PATH entry ("", "bin") names another file from another directory
        exe = Path(os.path.abspath(Path(d or ".") / f"python{python}"))  # noqa: PTH100 (a shim is judged by its link)
        if not (exe.is_file() and os.access(exe, os.X_OK)):
            continue
        real = str(exe.resolve())
        if real in seen:
            continue
        seen.add(real)
        if pyenv is not None and exe.parent == pyenv / "shims":
            shims.append(str(exe))
        else:
            found.append(str(exe))
    return found, shims


def _pyenv_candidates(python: str, pyenv: Path | None) -> list[tuple[str, str]]:
    """(path, version dir) of pyenv's installed CPython 3.N builds, newest final release first."""
    if pyenv is None or not (pyenv / "versions").is_dir():
        return []
    versions = []
    for d in (pyenv / "versions").iterdir():
        m = re.fullmatch(rf"{re.escape(python)}\.(\d+)", d.name)  # final releases: no 3.13.0t, no rc
        exe = d / "bin" / f"python{python}"
        if m and exe.is_file():
            versions.append((int(m.group(1)), str(exe), d.name))
    return [(exe, name) for _, exe, name in sorted(versions, reverse=True)]


def _uv_candidate(python: str, environ: Mapping[str, str]) -> tuple[str | None, str]:
    """(a uv-managed CPython 3.N's path, or None; what uv said)."""
    uv = shutil.which("uv", path=environ.get("PATH"))
    if uv is None:
        return None, "uv is not on PATH"
    cmd = [uv, "python", "find", "--managed-python", "--no-python-downloads", "--no-project", "--no-config", python]
    try:
        got = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False, env={**environ})
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"uv python find failed ({exc})"
    if got.returncode != 0 or not got.stdout.strip():
        return None, "no uv-managed CPython " + python
    return got.stdout.strip().splitlines()[-1], ""


def debian_root(python: str, where: Path | None = None) -> Path | None:
    """Where the Debian root holding CPython `python` lives (made or not), in `where` (default: the running
    user's paths.DEBIAN_ROOTS, never a shared cache); None: no suite ships it."""
    suite = DEBIAN_SUITES.get(python)
    return None if suite is None else (where or paths.DEBIAN_ROOTS) / suite


def root_problem(root: Path, python: str) -> str:
    """Why the Debian root may not be run as the running user ("" when it may): the folder that holds it, the
    root, the folders down to the interpreter and the interpreter itself must each be the running user's (root's,
    for root) and writable by nobody else, none of them a symbolic link. A root someone else could write would
    have root run their program."""
    from .cachedir import problem

    exe = root / "usr" / "bin" / f"python{python}"
    for p in (root.parent, root, root / "usr", root / "usr" / "bin"):
        if wrong := problem(p):
            return f"{p} {wrong}"
    try:
        st = os.lstat(exe)
    except OSError as exc:
        return f"{exe} cannot be read ({exc.strerror or exc})"
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"{exe} is not a file of the running user's that only it can write (mode {stat.filemode(st.st_mode)})"
    return ""


def find(
    python: str,
    given: Mapping[str, str] | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    roots: Path | None = None,
    sources: Sequence[str] = SOURCES,
) -> Found:
    """The interpreter for CPython `python`, asking `sources` in order (module docstring)."""
    environ = os.environ if environ is None else environ
    given = given or {}
    tried: list[Attempt] = []
    searched: list[str] = []

    def outcome(got: Interpreter | Attempt) -> Interpreter | None:
        if isinstance(got, Interpreter):
            return got
        tried.append(got)
        return None

    if "given" in sources and python in given:
        named = given[python]
        if "/" not in named:  # a bare name: the file PATH gives it, by its absolute path
            named = shutil.which(named, path=environ.get("PATH")) or named
        got = outcome(_candidate(python, "given", named, "named explicitly"))
        return Found(python, got, tuple(tried), ("given: the interpreter named for it is the only one asked",))
    searched.append("given: none named")
    pyenv = _pyenv_root(environ)
    if "PATH" in sources:
        on_path, shims = _path_candidates(python, environ, pyenv)
        searched.append(
            f"PATH: {len(on_path)} python{python}" + (f", {len(shims)} pyenv shim passed over" * bool(shims))
        )
        for exe in on_path:
            if got := outcome(_candidate(python, "PATH", exe, f"python{python} on PATH")):
                return Found(python, got, tuple(tried), tuple(searched))
    if "pyenv" in sources:
        candidates = _pyenv_candidates(python, pyenv)
        where = f"{pyenv}/versions" if pyenv else "no pyenv root (PYENV_ROOT, pyenv root, ~/.pyenv)"
        searched.append(f"pyenv: {len(candidates)} CPython {python} in {where}")
        for exe, version_dir in candidates:
            if got := outcome(_candidate(python, "pyenv", exe, f"pyenv {pyenv}, version {version_dir}")):
                return Found(python, got, tuple(tried), tuple(searched))
    if "uv" in sources:
        exe_uv, said = _uv_candidate(python, environ)
        searched.append(f"uv: {said or exe_uv}")
        if exe_uv and (got := outcome(_candidate(python, "uv", exe_uv, "uv python find --managed-python"))):
            return Found(python, got, tuple(tried), tuple(searched))
    if "debian" in sources:
        root = debian_root(python, roots)
        if root is None:
            searched.append(f"debian: no Debian suite known for CPython {python} (known: {sorted(DEBIAN_SUITES)})")
        elif not (root / "usr" / "bin" / f"python{python}").exists():
            searched.append(f"debian: no root made at {root}")
        elif os.geteuid() != 0 or shutil.which("chroot") is None:
            searched.append(f"debian: {root} needs root and chroot to run")
        elif wrong := root_problem(root, python):
            tried.append(
                Attempt(
                    "debian",
                    str(root),
                    f"not run: {wrong}",
                    f"remove {root} (verify_install makes it again), or make it yours alone (chown -R, chmod go-w)",
                )
            )
        else:
            searched.append(f"debian: {root}")
            how = f"Debian {DEBIAN_SUITES[python]} root {root}"
            if got := outcome(_candidate(python, "debian", f"/usr/bin/python{python}", how, str(root))):
                return Found(python, got, tuple(tried), tuple(searched))
    return Found(python, None, tuple(tried), tuple(searched))
