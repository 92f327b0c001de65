"""Kill-safe replacement of a directory, the names stages write before renaming into place, and the sweep
of what killed runs leave behind.

``replace_dir(new, dest)`` puts a complete tree in place of another. On Linux one ``renameat2`` with
``RENAME_EXCHANGE`` swaps the two names atomically: after a kill at any instant ``dest`` is the previous
tree or the new one, never absent. On a file system without the exchange (and other systems) two renames:
``dest`` is absent for the instant between them, and a run killed in that instant leaves it absent until the
next ``sweep()`` (every assembly and ``nox -s clean`` run one first), which puts the previous tree back.

Every temporary name a stage writes carries a reserved marker, its writer's pid and its kind:
``.NAME.kt-PID.part`` (a file or tree being written, then renamed to NAME: ``part(dest)``),
``.NAME.kt-PID.staging`` and ``.NAME.kt-PID.old`` (a tree swapped in, the tree swapped out). ``sweep()``
removes only such names, only in the folders the table ``TEMPORARY`` gives for each stage, and only when
the pid is in the system's range and no live process has it. A user's ``.dist-backup-20261205/`` or
``.snapshot-20261205120000`` is never a match; a bundle's ``--out`` folder is swept of its own leftovers
by the next bundle into it (``sweep_beside``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import fnmatch
import glob
import os
import re
import shutil
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from . import paths

RENAME_EXCHANGE = 2  # linux/fs.h
AT_FDCWD = -100


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


MARK = "kt-"
_TEMPORARY = re.compile(r"^\.(?P<name>.+)\.kt-(?P<pid>[1-9][0-9]{0,9})\.(?P<kind>part|staging|old)$")


def _temporary(dest: Path, kind: str, tag: str = "") -> Path:
    return dest.with_name(f".{dest.name}{'.' + tag if tag else ''}.{MARK}{os.getpid()}.{kind}")


def part(dest: Path, tag: str = "") -> Path:
    """Where this process writes `dest` before renaming it into place: `.NAME[.TAG].kt-PID.part` beside it
    (`tag` keeps two writers of one name in one process apart)."""
    return _temporary(dest, "part", tag)


def staging_name(dest: Path) -> Path:
    """Where the assembly stages the tree that replaces `dest` (this process's pid in the name)."""
    return _temporary(dest, "staging")


def old_name(dest: Path) -> Path:
    """Where the two-rename fallback parks the previous tree (this process's pid in the name)."""
    return _temporary(dest, "old")


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


def _pid_max() -> int:
    try:
        return int(Path("/proc/sys/kernel/pid_max").read_text())
    except (OSError, ValueError):
        return 4194304  # Linux's largest


def _alive(pid: int) -> bool:
    """Whether a process with this pid exists (one out of the system's range is no process at all)."""
    if pid == os.getpid():
        return True
    if not 0 < pid <= _pid_max():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return True  # someone else's process (or one we cannot ask about): never swept
    return True


@dataclass(frozen=True)
class Temporary:
    """Where one stage writes temporary names, and which kinds (part, staging, old) of which names."""

    writer: str
    folders: Callable[[], Iterable[Path]]
    kinds: tuple[str, ...] = ("part",)
    names: Callable[[], Iterable[str]] | None = None  # the destinations it writes there (None: any name)


def _cache_folders() -> Iterator[Path]:
    yield paths.CACHE
    if paths.CACHE.is_dir():
        yield from (p for p in paths.CACHE.iterdir() if p.is_dir() and not p.name.startswith("."))
    inputs = Path(os.environ.get("KT_RELEASE_CACHE") or paths.INPUTS_CACHE)
    yield inputs
    yield inputs / paths.WHEEL_MEMO
    yield inputs / paths.PAYLOAD_FRAMES


TEMPORARY: tuple[Temporary, ...] = (
    Temporary(
        "assemble: dist/ staged and swapped", lambda: [paths.DIST.parent], ("staging", "old"), lambda: [paths.DIST.name]
    ),
    Temporary("release_report: manifest.json with its verdict", lambda: [paths.DIST], names=lambda: ["manifest.json"]),
    Temporary("assemble, verify: downloads, wheels, archive frames, Debian roots", _cache_folders),
    Temporary("every stage: its record", lambda: [paths.STAGE_CACHE]),
    Temporary("build_cpu, build_cuda: the kernel wheel", lambda: [paths.KERNEL_OUT]),
    Temporary("verify_install: each Python's evidence", lambda: [paths.BUILD], names=lambda: ["verify-cp3*.json"]),
    Temporary("verify_install: the pip its resolutions run", lambda: [paths.VERIFY_WORK]),
    Temporary("verify_install: a Debian root being made", lambda: [paths.DEBIAN_ROOTS]),
    Temporary("publish: its snapshot of dist/", lambda: [paths.PUBLISH_WORK], names=lambda: ["snapshot"]),
    Temporary(
        "bundle: its staging tree beside --out",
        lambda: sorted({p.parent for p in remembered()}),
        names=lambda: sorted({glob.escape(p.name) for p in remembered()}),
    ),
)


def remember(dest: Path) -> None:
    """Record `dest` (a folder outside the build tree that a stage stages beside) before staging there: the
    sweep and `nox -s clean` then find a killed run's `.NAME.kt-PID.part` beside it, wherever it is."""
    dest = Path(os.path.abspath(dest))  # noqa: PTH100 (the name given, links not followed)
    if dest in remembered():
        return
    paths.STAGING_PLACES.parent.mkdir(parents=True, exist_ok=True)
    with paths.STAGING_PLACES.open("a", encoding="utf-8") as fh:  # one short line: appended whole
        fh.write(f"{dest}\n")


def remembered() -> list[Path]:
    """The places `remember` recorded (absolute paths only; anything else in the file is passed over)."""
    try:
        lines = paths.STAGING_PLACES.read_text(encoding="utf-8").splitlines()
    except OSError:
        return []
    return [Path(ln) for ln in dict.fromkeys(lines) if ln.startswith("/") and "\0" not in ln]


def _matches(entry: Temporary, name: str) -> bool:
    m = _TEMPORARY.match(name)
    if m is None or m["kind"] not in entry.kinds:
        return False
    if entry.names is None:
        return True
    base = m["name"]
    return any(fnmatch.fnmatchcase(base, n) for n in entry.names())


def _dead(name: str) -> bool:
    m = _TEMPORARY.match(name)
    return m is not None and not _alive(int(m["pid"]))


def leftovers() -> list[Path]:
    """Temporary trees and files of runs that are gone, in the folders each stage writes them."""
    found: dict[Path, None] = {}
    for entry in TEMPORARY:
        for place in entry.folders():
            try:
                names = sorted(place.iterdir())
            except OSError:
                continue
            for p in names:
                if _matches(entry, p.name) and _dead(p.name):
                    found[p] = None
    return list(found)


def _remove(p: Path, say: bool) -> None:
    if say:
        print(f"removing {p} (left by a killed run)")
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p, ignore_errors=True)
    else:
        p.unlink(missing_ok=True)


def sweep_beside(dest: Path, say: bool = True) -> list[Path]:
    """A folder outside the build tree a stage writes (a bundle's --out): its own leftovers beside it,
    `.NAME.kt-PID.part` with NAME its name, from runs that are gone."""
    try:
        names = sorted(dest.parent.iterdir())
    except OSError:
        return []
    gone = [p for p in names if (m := _TEMPORARY.match(p.name)) and m["name"] == dest.name and m["kind"] == "part"]
    gone = [p for p in gone if _dead(p.name)]
    for p in gone:
        _remove(p, say)
    return gone


def sweep(say: bool = True) -> list[Path]:
    """Remove every leftover of a killed run; a previous dist/ parked by a run killed between its two
    renames is put back first when dist/ is absent. Returns what was removed."""
    gone = leftovers()
    dist = paths.DIST
    parked = sorted(
        (p for p in gone if p.name.startswith(f".{dist.name}.{MARK}") and p.name.endswith(".old")),
        key=lambda p: p.stat().st_mtime,
    )
    if parked and not dist.exists():
        parked[-1].rename(dist)
        gone.remove(parked[-1])
        if say:
            print(f"{dist}: put back the previous release from {parked[-1].name} (a run was killed mid-swap)")
    for p in gone:
        _remove(p, say)
    return gone
