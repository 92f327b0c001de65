"""Generate and check the hash-locked requirement sets in lockfiles/ (a maintainer's action).

    python -m maint.lock            regenerate every lock (uv's resolver, network)
    python -m maint.lock --check    offline drift check: every lock matches its .in

Each ``lockfiles/NAME.txt`` is generated from ``lockfiles/NAME.in`` for
CPython 3.11 on x86_64 manylinux_2_28, with ``--hash`` on every pin and a header
naming the command that regenerates it. Locks hold no machine paths.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from pathlib import Path

from packaging.utils import canonicalize_name

from base.errors import StageError, report
from base.paths import DIST, LOCK_WORK, ROOT
from carriers.graph import closure
from carriers.model import load as load_carriers
from locks import indexes
from locks.read import (
    HEADER,
    INSTALL_DIRECTIVE,
    LOCKDIR,
    PLATFORM,
    PYLOCK_HEADER,
    PYTHON_VERSION,
    LockError,
    directive,
    install_profiles,
    names,
    parse_lock,
    pylock_path,
    read_in,
    read_pylock,
)


def check(name: str) -> list[str]:
    """Problems that make lockfiles/NAME.txt stale against NAME.in (empty: in sync)."""
    src, lock = LOCKDIR / f"{name}.in", LOCKDIR / f"{name}.txt"
    if not lock.exists():
        return [f"{lock} is missing; run `nox -s lock`"]
    problems = []
    text = lock.read_text()
    if not text.startswith(HEADER.format(name=name)):
        problems.append(f"{lock}: header does not name its generator; run `nox -s lock`")
    if "file://" in text or "/opt/" in text or "/home/" in text or "/root/" in text:
        problems.append(f"{lock}: holds a machine path; locks must be portable")
    if indexes.needs_torch_index(text) and indexes.INDEX_LINE not in text:
        problems.append(f"{lock}: pins a +cpu torch but does not name {indexes.PYTORCH_CPU_INDEX}; run `nox -s lock`")
    extras_pins = set(re.findall(r"^([A-Za-z0-9._-]+)\[[^\]]*\]==(\S+)", text, re.MULTILINE))
    plain_pins = set(re.findall(r"^([A-Za-z0-9._-]+)==(\S+)", text, re.MULTILINE))
    for project, version in sorted(extras_pins - plain_pins):
        problems.append(
            f"{lock}: {project}[...]=={version} has no plain {project}=={version} pin, so pip --require-hashes "
            "refuses a plain requirement on it; run `nox -s lock`"
        )
    pins = parse_lock(lock)
    for pin in pins.values():
        if not pin.hashes:
            problems.append(f"{lock}: {pin.name}=={pin.version} has no --hash")
    for req in read_in(src):
        locked = pins.get(canonicalize_name(req.name))
        if locked is None:
            problems.append(f"{lock}: {req.name} from {src.name} is not locked; run `nox -s lock`")
        elif not req.specifier.contains(locked.version, prereleases=True):
            problems.append(
                f"{lock}: {req.name}=={locked.version} does not satisfy {req} in {src.name}; run `nox -s lock`"
            )
    return problems


def with_plain_pins(body: str) -> str:
    """Each `name[extras]==V` block followed by a `name==V` block with the same hashes (unless the lock
    has one). pip's --require-hashes pins a project only through a line it reads: with the extras line
    alone, another package's plain `name>=X` is "not pinned with ==" and fails the install."""
    blocks = re.split(r"\n(?=[A-Za-z0-9])", body.strip("\n"))
    plain = {b.split("==", 1)[0] for b in blocks if re.match(r"[A-Za-z0-9._-]+==", b)}
    out = []
    for block in blocks:
        out.append(block)
        m = re.match(r"([A-Za-z0-9._-]+)\[[^\]]*\](==.*)", block, re.DOTALL)
        if m and m.group(1) not in plain:
            out.append(m.group(1) + m.group(2))
            plain.add(m.group(1))
    return "\n".join(out) + "\n"


def matrix() -> tuple[str, ...]:
    """The release's Python matrix (carriers.toml `pythons`, its one owner)."""
    return load_carriers().pythons


def check_pylocks(name: str) -> list[str]:
    """Problems of the per-Python PEP 751 locks of an install profile (empty: in sync)."""
    if name not in install_profiles():
        return []
    problems = []
    reqs = read_in(LOCKDIR / f"{name}.in")
    for python in matrix():
        path = pylock_path(name, python)
        if not path.exists():
            problems.append(f"{path} is missing (install profile {name}, CPython {python}); run `nox -s lock`")
            continue
        text = path.read_text()
        if not text.startswith(PYLOCK_HEADER.format(name=name, python=python)):
            problems.append(f"{path}: header does not name its generator; run `nox -s lock`")
        if "file://" in text or "/opt/" in text or "/home/" in text or "/root/" in text:
            problems.append(f"{path}: holds a machine path; locks must be portable")
        try:
            pylock = read_pylock(path)
        except LockError as exc:
            problems.append(str(exc))
            continue
        pins = {canonicalize_name(p.name): p for p in pylock.packages}
        for pkg in pylock.packages:  # sdist-only is allowed (built at install; the install file says so)
            if not pkg.wheels and pkg.sdist is None:
                problems.append(f"{path}: {pkg.name}=={pkg.version} has neither a wheel nor an sdist")
        for req in reqs:
            locked = pins.get(canonicalize_name(req.name))
            if locked is None:
                problems.append(f"{path}: {req.name} from {name}.in is not locked; run `nox -s lock`")
            elif locked.version is not None and not req.specifier.contains(locked.version, prereleases=True):
                problems.append(f"{path}: {req.name}=={locked.version} does not satisfy {req}; run `nox -s lock`")
    stale = sorted(set(LOCKDIR.glob(f"pylock.{name}-cp*.toml")) - {pylock_path(name, python) for python in matrix()})
    problems += [f"{p}: CPython {p.stem.rsplit('-cp', 1)[1]} is not in the release's matrix; delete it" for p in stale]
    return problems


def generate(name: str) -> None:
    """Resolve lockfiles/NAME.in with uv into a hash-locked NAME.txt, keeping existing pins."""
    uv = shutil.which("uv")
    if uv is None:
        raise LockError("uv is not on PATH; install lockfiles/nox.txt (it pins uv)")
    out = LOCKDIR / f"{name}.txt"
    src = LOCKDIR / f"{name}.in"
    roots = directive(src, "carriers")
    if roots:
        # Resolve the carriers' third-party requirements, never the carriers by name.
        reqs = [line for line in src.read_text().splitlines() if line and not line.startswith("#")]
        for root in roots:
            reqs += closure(DIST, root)[1]
        tmp = LOCK_WORK / f"{name}.in"
        tmp.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text("\n".join(reqs) + "\n")
    # A `#:uv-args ...` line in the input adds resolver options (and may replace the platform).
    extra = directive(src, "uv-args")
    platform = [] if "--python-platform" in extra else ["--python-platform", PLATFORM]
    # A +cpu torch comes from the PyTorch CPU index (or this machine's stand-in for it), and the
    # lock says so in its own text; existing pins are kept (uv reads the previous output) unless
    # the input changed them.
    torch_index = indexes.needs_torch_index(src.read_text())
    sources = [w for line in indexes.source(src.read_text()) for w in line.split()] if torch_index else []
    prev = LOCK_WORK / f"{name}.prev.txt"
    prev.parent.mkdir(parents=True, exist_ok=True)
    prev.write_text(out.read_text() if out.exists() else "")
    cmd = [
        uv,
        "pip",
        "compile",
        "--quiet",
        "--generate-hashes",
        # A dependency required with an extra (`nvidia-cutlass-dsl[cu13]>=4.8`, by nvidia-cudnn-frontend)
        # must appear in the lock with that extra: pip's --require-hashes refuses it otherwise ("all
        # requirements must have their versions pinned with ==") and uv's default strips it.
        "--no-strip-extras",
        "--no-header",
        "--no-annotate",
        "--python-version",
        PYTHON_VERSION,
        *platform,
        *extra,
        *(indexes.UV_ARGS if sources else ()),
        "--index-url",
        "https://pypi.org/simple",
        *sources,
        "--output-file",
        str(prev),
        str(tmp if roots else src),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=ROOT)
    if proc.returncode != 0:
        raise LockError(f"locking {name} failed:\n{proc.stderr}")
    body = "\n".join(ln for ln in prev.read_text().splitlines() if not ln.startswith("--")) + "\n"
    body = with_plain_pins(body)
    out.write_text(HEADER.format(name=name) + (indexes.INDEX_LINE + "\n" if torch_index else "") + body)
    print(f"locked {out.relative_to(ROOT)} ({len(parse_lock(out))} pins)")
    if INSTALL_DIRECTIVE in src.read_text().splitlines():
        for python in matrix():
            _pylock(name, python, cmd, prev, out)


def _pylock(name: str, python: str, cmd: list[str], prev: Path, txt: Path) -> None:
    """The install profile's PEP 751 lock for one Python. For the matrix's first Python, NAME.txt's versions
    are its constraints (the install file is what verify_install installed); every other Python is
    resolved for itself, as pip resolves there (numpy 2.5 needs 3.12, so 3.11 cannot have it); existing
    pins are kept."""
    target = pylock_path(name, python)
    work = LOCK_WORK / target.name
    if target.exists():  # uv keeps the pins of an existing output file
        work.write_text(target.read_text().split("\n", 1)[1])
    else:
        work.unlink(missing_ok=True)
    constraints = LOCK_WORK / f"{name}.constraints.txt"
    constraints.write_text("".join(f"{p.name}=={p.version}\n" for p in parse_lock(txt).values()))
    base = list(cmd)
    i = base.index("--python-version")
    base[i + 1] = python
    j = base.index("--output-file")
    base[j + 1] = str(work)
    attempts = (["--constraint", str(constraints)], []) if python == matrix()[0] else ([],)
    for extra in attempts:
        proc = subprocess.run([*base[:-1], *extra, base[-1]], capture_output=True, text=True, check=False, cwd=ROOT)
        if proc.returncode == 0:
            break
    else:
        raise LockError(f"locking {name} for CPython {python} failed:\n{proc.stderr}")
    target.write_text(PYLOCK_HEADER.format(name=name, python=python) + work.read_text())
    kept = f"the versions of {txt.name}" if extra else "resolved for this Python"
    print(f"locked {target.relative_to(ROOT)} ({len(read_pylock(target).packages)} packages, {kept})")


def main(argv: list[str] | None = None) -> int:
    """The lock CLI: regenerate or --check."""
    p = argparse.ArgumentParser(prog="nox -s lock --")
    p.add_argument("--check", action="store_true", help="offline drift check only")
    p.add_argument("names", nargs="*", help=f"locks to generate (default: all of {names()})")
    args = p.parse_args(argv)
    todo = args.names or names()
    try:
        if args.check:
            problems = [msg for n in todo for msg in [*check(n), *check_pylocks(n)]]
            for msg in problems:
                print(f"error: {msg}", file=sys.stderr)
            return 1 if problems else 0
        for n in todo:
            generate(n)
    except StageError as exc:  # LockError, and the carriers' root (no dist/ to take the closure from)
        return report(exc)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
