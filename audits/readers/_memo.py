"""A schema check passed once is not run again on the same bytes: a marker file named by the hash of
everything the check reads (the document, the schema, the validating library's version), in the
user's cache. Importing a validator costs about a second (jsonschema loads every optional format
checker), more than auditing a small wheel; only a pass is remembered, so a failure is always
reported fresh. KT_AUDIT_CACHE names the directory; set it empty to check every time. A marker counts only
in a folder of the running user's that nobody else can write (a shared cache is a trust boundary)."""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Callable
from functools import cache
from pathlib import Path


def _root() -> Path | None:
    configured = os.environ.get("KT_AUDIT_CACHE")
    if configured is not None:
        return Path(configured) if configured else None
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kt-audit" / "checked"


@cache
def _version(dist: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return None


def checked(kind: str, inputs: list[bytes], validators: tuple[str, ...], check: Callable[[], str]) -> str:
    """`check()` (its problem, "" when the inputs pass) unless the same inputs passed it before under the
    same versions of the `validators` distributions; a pass is remembered."""
    root = _root()
    versions = [_version(d) for d in validators]
    if root is None or None in versions:
        return check()
    h = hashlib.sha256(kind.encode() + b"\0" + "\0".join(map(str, versions)).encode())
    for data in inputs:
        h.update(hashlib.sha256(data).digest())
    marker = root / kind / h.hexdigest()
    if _owned(marker) and _owned(marker.parent) and _owned(root):
        return ""
    problem = check()
    if not problem:
        try:
            marker.parent.mkdir(parents=True, mode=0o700, exist_ok=True)
            if _owned(marker.parent) and _owned(root):  # never a marker in a folder others can write
                fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o600)
                os.close(fd)
        except OSError:
            pass  # a read-only cache: the next run checks again
    return problem


def _owned(path: Path) -> bool:
    """Whether `path` is the running user's own (a file or a folder, no symbolic link) and nobody else can
    write it: a marker someone else could plant would pass a check that never ran. A shared or foreign cache
    is not an error here: the check simply runs every time."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return (
        (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode))
        and st.st_uid == os.geteuid()
        and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    )
