"""The rules every cache folder of the project follows: it is ours before we read, write or run from it, and
we prune only the names we write there.

A cache folder may be shared (``KT_CACHE_DIR`` across checkouts, ``KT_RELEASE_CACHE`` named by an engineer),
so it is a trust boundary:

- ``owned(folder)``: the folder (made if absent) must be a real directory, not a symbolic link, owned by the
  running user (root's by root) and writable by nobody else; otherwise ``CacheError`` names the path, its owner
  and mode, and the fix. Another user's bytes are never read as ours, and no program in it runs.
- ``prune(folder, name, ...)``: the one least-recently-used pruning of every cache. It looks only at entries
  whose whole name matches ``name`` (the pattern of the names the caller writes), so a user's file beside them
  (a ``torch-*.whl``, an ``archive-backup.tar.zst``) is never a candidate.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
from collections.abc import Iterable
from pathlib import Path

from .errors import StageError


class CacheError(StageError):
    """A cache folder that is not the running user's alone: refused, with the fix."""

    exit_code = 2


def _who(uid: int) -> str:
    try:
        import pwd

        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except (KeyError, ImportError):
        return f"uid {uid}"


def problem(path: Path) -> str:
    """Why `path` is no folder of the running user's alone ("" when it is)."""
    try:
        st = os.lstat(path)
    except OSError as exc:
        return f"cannot be read ({exc.strerror or exc})"
    if stat.S_ISLNK(st.st_mode):
        return f"is a symbolic link (to {Path(path).readlink()})"
    if not stat.S_ISDIR(st.st_mode):
        return "is not a directory"
    if st.st_uid != os.geteuid():
        return f"belongs to {_who(st.st_uid)}, not to the running user {_who(os.geteuid())}"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        who = "others" if st.st_mode & stat.S_IWOTH else "its group"
        return f"is writable by {who} (mode {stat.filemode(st.st_mode)})"
    return ""


def owned(folder: Path, what: str = "cache folder") -> Path:
    """`folder`, made if absent (mode 0700 for the last component), once it is a directory of the running user's
    that nobody else can write; CacheError naming the path, the problem and the fix otherwise."""
    folder = Path(os.path.abspath(folder))  # noqa: PTH100 (resolve() would follow the link this judges)
    if not os.path.lexists(folder):
        folder.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):  # made meanwhile by another process: judged below like any other
            folder.mkdir(0o700)
    wrong = problem(folder)
    if wrong:
        raise CacheError(
            f"{folder}: the {what} {wrong}; nothing in it is read, run or deleted. Use a folder of your own "
            f"(`chown {os.geteuid()} {folder} && chmod go-w {folder}`, or point the variable that names it at "
            "another folder)"
        )
    return folder


def prune(
    folder: Path,
    name: re.Pattern[str],
    *,
    keep: Iterable[Path] = (),
    max_count: int | None = None,
    max_bytes: int | None = None,
) -> list[Path]:
    """Remove the least recently used entries of `folder` whose whole name matches `name` (files only) beyond
    the newest `max_count` and beyond `max_bytes` in all, never one in `keep`; returns what was removed. Entries
    another process removes meanwhile are passed over."""
    found = []
    try:
        listing = list(os.scandir(folder))
    except FileNotFoundError:
        return []
    for entry in listing:
        if not name.fullmatch(entry.name):
            continue
        try:
            st = entry.stat(follow_symlinks=False)
        except FileNotFoundError:  # another process pruned it meanwhile
            continue
        if stat.S_ISREG(st.st_mode):
            found.append((st.st_mtime, st.st_size, Path(entry.path)))
    kept = {Path(p) for p in keep}
    removed = []
    total = 0
    for n, (_, size, path) in enumerate(sorted(found, key=lambda x: x[0], reverse=True)):
        total += size
        over = (max_count is not None and n >= max_count) or (max_bytes is not None and total > max_bytes)
        if over and path not in kept:
            path.unlink(missing_ok=True)
            removed.append(path)
    return removed
