"""The previous release (the predecessor) named by `--previous SPEC`, as the wheels it consists of: the one
reader of that spec for the release diff (release/diff.py) and the upgrade verification (verify/upgrade.py).

SPEC is an earlier dist/ (its SHA256SUMS checked, the wheels its manifest lists), any folder of wheels, or
`INDEX_URL::NAME==VERSION,NAME==VERSION,...`, downloaded once by pip (the index's sha256 checked) into
the build cache (`previous/`, a folder of the running user's own)."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement

from base import cachedir, distdir, paths, swap
from base.keys import file_sha256

from .read import LockError
from .targets import download, manylinux_chain


class PreviousError(LockError):
    """A predecessor that cannot be had: the message names it, the problem and the fix."""


class Unreachable(PreviousError):
    """The index holding the predecessor did not hand it over: checks against it are NOT CHECKED, not failed."""


def previous_wheels(spec: str, python: str, cache: Path | None = None) -> tuple[list[Path], str]:
    """The predecessor's wheels and how they were found: a folder (an earlier dist/: the wheels its
    SHA256SUMS lists, each checked; else every wheel in it), or `URL::NAME==V,...` downloaded by pip for CPython
    `python` (the index's sha256 checked) into the build cache once, each wheel checked against the sha256
    recorded then before it is reused. PreviousError naming what is wrong and the fix."""
    if "::" in spec:
        return _download(spec, cache or paths.CACHE / "previous", python)
    folder = Path(spec)
    if not folder.is_dir():
        raise PreviousError(
            f"--previous {spec}: no such folder; give an earlier dist/, a folder of wheels, or "
            "INDEX_URL::NAME==VERSION,... (e.g. https://pypi.org/simple::kt-kernel==0.7.2,ktransformers==0.7.2)"
        )
    if (folder / distdir.SUMS).is_file():
        try:
            release = distdir.open_release(folder)
        except distdir.DistError as exc:
            raise PreviousError(f"--previous {folder}: {exc}") from None
        wheels = [folder / w.filename for w in release.manifest.wheels]
        return wheels, f"the release in {folder} ({release.manifest.kt_version})"
    wheels = sorted(folder.glob("*.whl"))
    if not wheels:
        raise PreviousError(f"--previous {folder}: holds no wheel; give a folder of the previous release's wheels")
    return wheels, f"{len(wheels)} wheels in {folder}"


def _download(spec: str, cache: Path, python: str) -> tuple[list[Path], str]:
    index, _, pins = spec.partition("::")
    wanted = [p.strip() for p in re.split(r"[,\s]+", pins) if p.strip()]
    for pin in wanted:
        try:
            req = Requirement(pin)
        except InvalidRequirement:
            req = None
        if req is None or len(req.specifier) != 1 or next(iter(req.specifier)).operator != "==":
            raise PreviousError(f"--previous: {pin!r} is no NAME==VERSION pin")
    if not index.startswith(("https://", "http://")) or not wanted:
        raise PreviousError(f"--previous {spec!r}: give INDEX_URL::NAME==VERSION,NAME==VERSION")
    key = hashlib.sha256(json.dumps([index, sorted(wanted), python]).encode()).hexdigest()[:32]
    cachedir.owned(cache, "previous-release cache")
    where = cache / key
    if _intact(where):
        return sorted(where.glob("*.whl")), f"{', '.join(wanted)} from {index}"
    shutil.rmtree(where, ignore_errors=True)  # our own entry (a content-keyed name), incomplete or altered
    tmp = swap.part(where)
    print(f"[diff] downloading the predecessor: {', '.join(wanted)} from {index} ...", flush=True)
    # what a CPython `python` host installs, up to trixie's glibc 2.41 (a predecessor may need newer than ours)
    label = f"previous: {', '.join(wanted)}"
    got = download(wanted, python, tmp, label, index_url=index, platforms=manylinux_chain(41))
    if got.returncode != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        raise Unreachable(
            f"--previous: downloading {', '.join(wanted)} from {index} failed (unreachable, or no such release; "
            f"give a folder of its wheels instead):\n{got.stderr[-1500:]}"
        )
    sums = {w.name: file_sha256(w) for w in sorted(tmp.glob("*.whl"))}
    (tmp / SUMS).write_text(json.dumps(sums, indent=1) + "\n")  # what a later run checks before reuse
    tmp.replace(where)
    return sorted(where.glob("*.whl")), f"{', '.join(wanted)} from {index}"


SUMS = ".sha256.json"


def _intact(where: Path) -> bool:
    """Whether a cached download holds exactly the wheels, with the sha256s, it recorded when it was made."""
    try:
        sums = json.loads((where / SUMS).read_text())
    except (OSError, ValueError):
        return False
    present = {w.name for w in where.glob("*.whl")}
    return (
        isinstance(sums, dict)
        and bool(sums)
        and present == set(sums)
        and all(file_sha256(where / n) == h for n, h in sums.items())
    )


AUTO = "auto"
DEFAULT_INDEX = "https://pypi.org/simple"


def newest_older(current: dict[str, str], index_url: str = DEFAULT_INDEX) -> tuple[str | None, str]:
    """The default predecessor: for each of the release's distributions (name -> version), the newest final
    release on `index_url` older than ours. (`INDEX_URL::NAME==V,...`, or None; what was found or why none.)"""
    from packaging.version import InvalidVersion, Version

    from .simple import IndexPageError, project_state

    pins = []
    for name, ours in sorted(current.items()):
        try:
            state = project_state(index_url, name, sizes=False)
        except IndexPageError as exc:
            return None, f"{index_url} cannot be read ({exc})"
        older = []
        for v in state.versions():
            try:
                parsed = Version(v)
            except InvalidVersion:
                continue
            if not parsed.is_prerelease and parsed < Version(ours):
                older.append(parsed)
        if older:
            pins.append(f"{name}=={max(older)}")
    if not pins:
        return None, f"{index_url} holds no release of the release's names older than this one"
    return f"{index_url}::{','.join(pins)}", f"the newest older releases on {index_url}: {', '.join(pins)}"
