"""The KT release version: set once, in ``kernel/python/kt_kernel/_version.py``; read only here
(the kernel's own build reads the same file through its pyproject)."""

from __future__ import annotations

import datetime as _dt
import re
from pathlib import Path

from .errors import StageError
from .paths import VERSION_FILE


class VersionFileError(StageError):
    """_version.py lacks a line this release needs; the message names the file and the line."""


def _field(name: str, path: Path) -> str:
    m = re.search(rf'^{name}\s*=\s*"([^"]+)"', path.read_text(), re.MULTILINE)
    if not m:
        raise VersionFileError(f'{path}: no line {name} = "..."; the KT release sets it there')
    return m.group(1)


def kt_version(path: Path = VERSION_FILE) -> str:
    """``__version__`` of _version.py."""
    return _field("__version__", path)


def release_date(path: Path = VERSION_FILE) -> _dt.date:
    """``__release_date__`` of _version.py."""
    return _dt.date.fromisoformat(_field("__release_date__", path))


def python_key(version: str) -> tuple[int, int]:
    """ "3.12" -> (3, 12), for ordering."""
    major, minor = version.split(".")
    return int(major), int(minor)


def python_tag(version: str) -> str:
    """ "3.12" -> "cp312", the interpreter tag of its wheels (and of the install files' names)."""
    return "cp" + version.replace(".", "")
