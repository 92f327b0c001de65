"""A schema check passed once is not run again on the same bytes: a marker file named by the hash of
everything the check reads (the document, the schema, the validating library's version), in the
user's cache. Importing a validator costs about a second (jsonschema loads every optional format
checker), more than auditing a small wheel; only a pass is remembered, so a failure is always
reported fresh. KT_AUDIT_CACHE names the directory; set it empty to check every time."""

from __future__ import annotations

import hashlib
import os
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
    if marker.is_file():
        return ""
    problem = check()
    if not problem:
        try:
            marker.parent.mkdir(parents=True, exist_ok=True)
            marker.touch()
        except OSError:
            pass  # a read-only cache: the next run checks again
    return problem
