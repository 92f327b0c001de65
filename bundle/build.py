"""An offline bundle: every wheel of one install profile's closure for one Python, its install file and
a README, in one directory a site without internet access can carry in and install from:

    pip install --no-index --find-links DIR --require-hashes -r DIR/<profile>-cp3XX.txt

The carriers are copied from the release directory, the third-party wheels downloaded by hash
(pip download --require-hashes, for that Python and platform, so no interpreter of it is needed
here); then every file is checked against the install file, and a file too many or too few is an
error. The bundle is written beside its target and renamed into place: complete, or absent."""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from packaging.utils import canonicalize_name, parse_wheel_filename

from base import distdir, swap
from base.errors import StageError
from base.keys import file_sha256
from base.version import python_tag
from locks.read import parse_pins
from locks.targets import MANYLINUX_2_34, download


class BundleError(StageError):
    """A bundle cannot be made; the message names the distribution, the Python and the fix (the
    bundle's error root)."""


@dataclass(frozen=True)
class Bundle:
    """What was written: file count, bytes, and the offline install command."""

    files: int
    bytes: int
    command: str


def pins(text: str, where: Path | str = "the install file") -> dict[str, tuple[str, frozenset[str]]]:
    """name -> (version, allowed sha256s) of a pip --require-hashes file (locks.read's one parser)."""
    return {name: (str(pin.version), frozenset(pin.hashes)) for name, pin in parse_pins(text, where).items()}


def _readme(profile: str, python: str, install: str, count: int, size: int) -> str:
    return (
        f"# Offline bundle: KT install profile {profile}, CPython {python}, x86_64 Linux\n\n"
        f"{count} wheels ({size / 2**20:.1f} MiB), each listed with its sha256 in `{install}`.\n"
        "On the target machine, with no index reachable:\n\n"
        "```console\n"
        f"$ python{python} -m venv .venv\n"
        f"$ .venv/bin/pip install --no-index --find-links . --require-hashes -r {install}\n"
        "$ .venv/bin/python -m kt_kernel.payload materialize   # the CUDA payload, where the profile has it\n"
        "```\n\n"
        "pip refuses any file whose sha256 is not the one listed, and reaches no index.\n"
    )


def build(dist: Path, profile: str, python: str, out: Path, *, index_url: str = "https://pypi.org/simple") -> Bundle:
    """Write the bundle of `profile` for `python` from the release in `dist` into `out` (which must not exist)."""
    try:
        release = distdir.open_release(dist)  # every listed file re-hashed: the bundle copies what was released
    except distdir.DistError as exc:
        raise BundleError(str(exc)) from None
    entry = release.manifest.install_file(profile, python)
    if entry is None:
        have = [Path(f.file).name for f in release.manifest.install or () if f.format == "requirements"]
        raise BundleError(
            f"{dist / distdir.install_name(profile, python)} does not exist: no install profile {profile!r} for "
            f"CPython {python} in this release (it has {', '.join(have) or 'no install files: run nox -s build_all'})"
        )
    if out.exists():
        raise BundleError(f"{out} exists; give a new directory (the bundle is written whole or not at all)")
    install = dist / entry.file
    text = install.read_text()
    wanted = pins(text, install)
    local = {
        w.name: dist / w.filename for w in release.manifest.wheels if w.name in wanted and w.sha256 in wanted[w.name][1]
    }
    missing = sorted({w.name for w in release.manifest.wheels} & set(wanted) - set(local))
    if missing:
        raise BundleError(
            f"{install.name} pins {', '.join(missing)} by a sha256 no wheel in {dist} has: the install file and the "
            "wheels are from different builds; rebuild the release (nox -s build_all)"
        )
    swap.remember(out)  # a killed bundle's staging tree is then known to the sweep and nox -s clean
    swap.sweep_beside(out)  # a killed bundle into the same --out left its staging tree beside it
    staging = swap.part(out)
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        for wheel in local.values():
            shutil.copyfile(wheel, staging / wheel.name)
        third = staging / ".third-party.txt"
        kept = [
            line
            for line in re.split(r"\n(?=[A-Za-z0-9])", text)
            if canonicalize_name(line.split("==")[0].split("[")[0]) not in local
        ]
        third.write_text("\n".join(kept) + "\n")
        if set(wanted) - set(local):  # third-party pins to download
            print(
                f"[bundle] downloading {len(wanted) - len(local)} third-party wheels for CPython {python} by hash ...",
                flush=True,
            )
            requirements = ["--require-hashes", "-r", str(third)]
            label = f"bundle: {profile} {python_tag(python)}"
            got = download(requirements, python, staging, label, index_url=index_url, platforms=MANYLINUX_2_34)
            if got.returncode != 0:
                raise BundleError(
                    f"downloading {profile}'s third-party wheels for CPython {python} failed:\n{got.stderr[-3000:]}"
                )
        third.unlink()
        problems = check(staging, wanted)
        if problems:
            raise BundleError(
                f"the bundle of {profile} for CPython {python} is not complete:\n  " + "\n  ".join(problems)
            )
        shutil.copyfile(install, staging / install.name)
        files = sorted(staging.glob("*.whl"))
        size = sum(f.stat().st_size for f in files)
        (staging / "README.md").write_text(_readme(profile, python, install.name, len(files), size))
        staging.rename(out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    command = f"pip install --no-index --find-links {out} --require-hashes -r {out / install.name}"
    return Bundle(len(files) + 2, size + install.stat().st_size, command)


def check(directory: Path, wanted: dict[str, tuple[str, frozenset[str]]]) -> list[str]:
    """Every pin has exactly one file in `directory` with an allowed sha256, and no file is unlisted."""
    problems = []
    found: dict[str, list[str]] = {}
    for wheel in sorted(directory.glob("*.whl")):
        name, version, _, _ = parse_wheel_filename(wheel.name)
        key = canonicalize_name(name)
        if key not in wanted:
            problems.append(f"{wheel.name} is not in the install file")
        elif str(version) != wanted[key][0] or file_sha256(wheel) not in wanted[key][1]:
            problems.append(f"{wheel.name}: not the pinned {key}=={wanted[key][0]} (version or sha256 differ)")
        else:
            found.setdefault(key, []).append(wheel.name)
    for pinned, (pinned_version, _) in sorted(wanted.items()):
        if len(found.get(pinned, [])) != 1:
            problems.append(f"{pinned}=={pinned_version}: {len(found.get(pinned, []))} matching files (one is needed)")
    return problems
