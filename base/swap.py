"""Kill-safe replacement of a directory, and the sweep of what killed runs leave behind.

``replace_dir(new, dest)`` puts a complete tree in place of another so that, after a kill at any instant,
``dest`` is either the previous tree or the new one, never absent: on Linux one ``renameat2`` with
``RENAME_EXCHANGE`` swaps the two names atomically; elsewhere (or on a file system without it) two
renames, and a run killed between them is repaired by the next ``sweep()``, which puts the previous
tree back.

Every temporary name a stage writes under the repository ends in its writer's pid
(``.dist-staging-PID``, ``.dist-old-PID``, ``.NAME.PID.part``): ``sweep()`` removes those whose process
is gone, from the places stages write them. The next assembly runs it, and so does ``nox -s clean``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

from . import paths

RENAME_EXCHANGE = 2  # linux/fs.h
AT_FDCWD = -100
_LEFTOVER = re.compile(r"^\..+[.-](?P<pid>\d+)(\.part)?$")


def _renameat2() -> object | None:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name, use_errno=True)
        return libc.renameat2
    except (OSError, AttributeError):
        return None


def exchange(a: Path, b: Path) -> bool:
    """Swap the names `a` and `b` in one atomic step; False where the system cannot (then nothing moved)."""
    fn = _renameat2()
    if fn is None:
        return False
    rc = fn(AT_FDCWD, os.fsencode(a), AT_FDCWD, os.fsencode(b), RENAME_EXCHANGE)  # type: ignore[operator]
    if rc == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
        return False
    raise OSError(err, os.strerror(err), str(a))


def old_name(dest: Path) -> Path:
    """Where the two-rename fallback parks the previous tree (this process's pid in the name)."""
    return dest.parent / f".{dest.name}-old-{os.getpid()}"


def replace_dir(new: Path, dest: Path) -> None:
    """`new` (a complete tree beside `dest`) becomes `dest`; the previous tree is removed afterwards."""
    if not dest.exists():
        new.rename(dest)
        return
    if exchange(new, dest):
        shutil.rmtree(new, ignore_errors=True)  # it now holds the previous tree
        return
    old = old_name(dest)
    dest.rename(old)
    try:
        new.rename(dest)
    except BaseException:
        if old.exists() and not dest.exists():
            old.rename(dest)  # the previous release back in place
        raise
    shutil.rmtree(old, ignore_errors=True)


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _places() -> Iterator[Path]:
    """The folders stages write temporary names in (not the venvs: `clean` removes those whole)."""
    yield paths.DIST.parent
    yield paths.STAGE_CACHE
    yield paths.KERNEL_OUT
    yield paths.CACHE
    if paths.CACHE.is_dir():
        yield from (p for p in paths.CACHE.iterdir() if p.is_dir() and not p.name.startswith("debian-"))


def leftovers() -> list[Path]:
    """Temporary trees and files of runs that are gone (their pid is no live process)."""
    found = []
    for place in _places():
        try:
            names = sorted(place.iterdir())
        except OSError:
            continue
        for p in names:
            m = _LEFTOVER.match(p.name)
            if m and not _alive(int(m["pid"])):
                found.append(p)
    return found


def sweep(say: bool = True) -> list[Path]:
    """Remove every leftover of a killed run; a previous dist/ parked by a run killed between its two
    renames is put back first when dist/ is absent. Returns what was removed."""
    gone = leftovers()
    dist = paths.DIST
    parked = sorted((p for p in gone if p.name.startswith(f".{dist.name}-old-")), key=lambda p: p.stat().st_mtime)
    if parked and not dist.exists():
        parked[-1].rename(dist)
        gone.remove(parked[-1])
        if say:
            print(f"{dist}: put back the previous release from {parked[-1].name} (a run was killed mid-swap)")
    for p in gone:
        if say:
            print(f"removing {p} (left by a killed run)")
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)
    return gone
