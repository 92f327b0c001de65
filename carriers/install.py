"""The release's install files: `dist/install/<profile>-cp3XX.txt` (pip --require-hashes) and
`dist/install/pylock.<profile>-cp3XX.toml` (PEP 751), one pair per install profile (lockfiles/*.in
marked `#:install`: serve, sft, lf-kt) and per Python of the matrix (carriers.toml `pythons`).

Each holds every package of the profile for that Python with every hash: the third-party pins of
its lock (lockfiles/pylock.<profile>-cp3XX.toml) and the carriers the profile's roots reach, with
the sha256 of the very wheels assembled beside them. The assembly writes them into its staging
directory, so they land in dist/ (and SHA256SUMS) with the wheels, or not at all."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import tomllib
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename

from base import distdir
from locks import indexes
from locks import read as locks

from .errors import ConsistencyError
from .graph import closure
from .model import CarrierSet

PLATFORM = "manylinux_2_34_x86_64"  # the install profiles' locks resolve for x86_64 manylinux_2_34


def _environment(python: str) -> dict[str, str]:
    """Marker values of CPython `python` on x86_64 Linux (for the lock's and the carriers' markers)."""
    env: dict[str, str] = {k: str(v) for k, v in default_environment().items()}
    env.update(
        python_version=python,
        python_full_version=f"{python}.0",
        implementation_name="cpython",
        platform_python_implementation="CPython",
        sys_platform="linux",
        platform_system="Linux",
        platform_machine="x86_64",
        os_name="posix",
    )
    return env


def roots(profile: str) -> list[str]:
    """The carrier roots of an install profile (its input's `#:carriers` lines)."""
    return locks.directive(locks.LOCKDIR / f"{profile}.in", "carriers")


def _carrier_wheel(staging: Path, name: str, python: str) -> Path:
    from locks.targets import serves

    found = [
        w for w in sorted(staging.glob(f"{canonicalize_name(name).replace('-', '_')}-*.whl")) if serves(w.name, python)
    ]
    found = [w for w in found if canonicalize_name(parse_wheel_filename(w.name)[0]) == name]
    if not found:
        raise ConsistencyError(f"install files: no {name} wheel for CPython {python} was assembled")
    return found[0]


def _closure(profile: str, staging: Path) -> tuple[list[str], list[tuple[str, str]]]:
    """(carrier names, (root, third-party requirement) pairs) the profile's roots reach in the staged
    wheels' metadata: the same for every Python (markers are evaluated per Python by _third_party)."""
    carriers: list[str] = []
    third: list[tuple[str, str]] = []
    for root in roots(profile):
        reached, lines = closure(staging, root)
        carriers += reached
        third += [(root, line) for line in lines]
    return sorted(set(carriers)), third


def _third_party(
    profile: str, python: str, cs: CarrierSet, reached: tuple[list[str], list[tuple[str, str]]]
) -> tuple[Any, list[str]]:
    """(the profile's PEP 751 lock for `python`, the closure's carrier names); the lock must pin every
    third-party requirement the carriers declare for that Python, and no upstream a fork replaces."""
    path = locks.pylock_path(profile, python)
    if not path.exists():
        raise ConsistencyError(
            f"{path.name} is missing: install profile {profile} has no lock for CPython {python}; run `nox -s lock`"
        )
    try:
        pylock = locks.read_pylock(path)
    except locks.LockError as exc:
        raise ConsistencyError(str(exc)) from None
    env = _environment(python)
    pins = {canonicalize_name(p.name): p for p in pylock.packages}
    carriers, third = reached
    problems = []
    for root, line in third:
        req = Requirement(line)
        if req.marker is not None and not req.marker.evaluate(env):
            continue
        pin = pins.get(canonicalize_name(req.name))
        if pin is None or (pin.version is not None and not req.specifier.contains(pin.version, prereleases=True)):
            got = f"{pin.name}=={pin.version}" if pin else "nothing"
            problems.append(f"{root} requires {req} on CPython {python}; {path.name} pins {got}")
    replaced = cs.by_upstream()
    problems += [
        f"{path.name} pins upstream {p.name}, which {replaced[canonicalize_name(p.name)]} replaces"
        for p in pylock.packages
        if canonicalize_name(p.name) in replaced
    ]
    if problems:
        raise ConsistencyError(
            f"install profile {profile} for CPython {python}: its lock is stale against the carriers:\n  "
            + "\n  ".join(problems)
            + "\nrun `nox -s lock` (it resolves the carriers' own requirements); dist/ was not touched"
        )
    return pylock, carriers


def _hash_lines(hashes: Sequence[str]) -> str:
    return "".join(f" \\\n    --hash=sha256:{h}" for h in hashes)


def _requirements(profile: str, python: str, pylock: Any, carriers: list[tuple[str, str, Path, str]]) -> str:
    """The pip --require-hashes text: a header saying what it is and how to run it, the index lines it
    needs, then every pin with every hash of its wheels for this Python."""
    torch_index = any(
        w.url and w.url.startswith(indexes.PYTORCH_CPU_INDEX) for p in pylock.packages for w in p.wheels or []
    )
    lines = [
        f"# KT release install file: profile {profile} ({', '.join(roots(profile))}) for CPython {python}, "
        f"x86_64 Linux ({PLATFORM}).",
        f"#   pip install --require-hashes -r {Path(distdir.install_name(profile, python)).name}",
        "# The carriers' hashes are the release's own wheels (SHA256SUMS); nothing else may install.",
        "--only-binary :all:",
    ]
    for p in sdist_only(pylock):
        lines += [
            f"# {p.name} {p.version} has no wheel for CPython {python}: pip builds it from its sdist (hash-locked",
            "# below); that needs its build toolchain on this machine.",
            f"--no-binary {canonicalize_name(p.name)}",
        ]
    if torch_index:
        lines.append(indexes.INDEX_LINE)
    body = []
    for name, version, _, sha in carriers:
        body.append(f"{name}=={version}{_hash_lines([sha])}")
    for p in sorted(pylock.packages, key=lambda p: canonicalize_name(p.name)):
        files = [*(p.wheels or []), *([p.sdist] if not p.wheels and p.sdist is not None else [])]
        hashes = sorted(h for f in files for alg, h in f.hashes.items() if alg == "sha256")
        body.append(f"{canonicalize_name(p.name)}=={p.version}{_hash_lines(hashes)}")
    return "\n".join(lines) + "\n" + "\n".join(body) + "\n"


def sdist_only(pylock: Any) -> list[Any]:
    """The lock's packages that have no wheel for its Python, only an sdist."""
    return [p for p in pylock.packages if not p.wheels and p.sdist is not None]


def _toml_str(value: str) -> str:
    return json.dumps(value)  # a TOML basic string is JSON's string syntax for these (no control bytes)


def _pylock(profile: str, python: str, lock_text: str, carriers: list[tuple[str, str, Path, str]]) -> str:
    """The profile's lock for `python` with the carriers' packages appended (their wheels by path,
    beside this file's directory: `../<wheel>` in dist/install/)."""
    body = lock_text.split("\n", 1)[1]  # the generator's header line goes; this file says what it is
    head = (
        f"# KT release install file: profile {profile} for CPython {python}, x86_64 Linux ({PLATFORM}).\n"
        f"#   pip install -r {Path(distdir.install_name(profile, python, 'pylock')).name}"
        "  (PEP 751; any installer that reads it)\n"
    )
    marker = f"python_version == '{python}' and sys_platform == 'linux' and platform_machine == 'x86_64'"
    env = f"environments = [{_toml_str(marker)}]\n"
    first, rest = body.split("\n", 1)
    blocks = []
    for name, version, wheel, sha in carriers:
        blocks.append(
            "\n[[packages]]\n"
            f"name = {_toml_str(name)}\n"
            f"version = {_toml_str(version)}\n"
            f"wheels = [{{ name = {_toml_str(wheel.name)}, path = {_toml_str('../' + wheel.name)}, "
            f"size = {wheel.stat().st_size}, hashes = {{ sha256 = {_toml_str(sha)} }} }}]\n"
        )
    return head + first + "\n" + env + rest.rstrip("\n") + "\n" + "".join(blocks)


def write(cs: CarrierSet, staging: Path, pythons: Sequence[str], digests: dict[str, str]) -> list[distdir.InstallFile]:
    """Every install file of every profile and Python into staging/install/, as manifest.json records
    them; `digests`: wheel filename -> sha256 (computed once by the assembly)."""
    from packaging.pylock import Pylock

    (staging / distdir.INSTALL_DIR).mkdir()
    written = []
    for profile in locks.install_profiles():
        reached = _closure(profile, staging)  # one walk of the wheels' metadata per profile
        for python in pythons:
            pylock, names = _third_party(profile, python, cs, reached)
            carriers = []
            for name in names:
                wheel = _carrier_wheel(staging, name, python)
                carriers.append((name, str(parse_wheel_filename(wheel.name)[1]), wheel, digests[wheel.name]))
            txt = _requirements(profile, python, pylock, carriers)
            toml = _pylock(profile, python, locks.pylock_path(profile, python).read_text(), carriers)
            Pylock.from_dict(tomllib.loads(toml)).validate()  # what we write is valid PEP 751
            for fmt, text in (("requirements", txt), ("pylock", toml)):
                name, data = distdir.install_name(profile, python, fmt), text.encode()
                (staging / name).write_bytes(data)
                digest = hashlib.sha256(data).hexdigest()
                written.append(distdir.InstallFile(profile, python, name, fmt, digest))  # type: ignore[arg-type]
    return written
