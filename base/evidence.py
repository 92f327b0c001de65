"""The install verification's evidence, one file per CPython of the matrix: `build/verify-cp3NN.json`.

verify_install writes it (each result as it comes, the file replaced whole), the release verdict and the
publish gate read it. One file per Python, so that CI's verify jobs (one per Python) each upload their own
and the publish jobs merge them without a collision.

    {"schema_version": 1, "python": "3.12",
     "interpreter": {...},            # base.interpreters.Found.as_dict(): the one used, or why none
     "profiles": {"sft": {...}},      # each venv profile's result, stamped with the dist/ it ran on
     "resolution": {"sft": {...}}}    # normal resolution of each install profile with this Python's pip

A result carries `dist_sha256` (the build it was obtained on); a failed profile is `{"error": ...}`, one
that could not be checked here `{"not_verified": ...}`: neither is ever read as a pass.
"""

from __future__ import annotations

import json
import re
import threading
from pathlib import Path
from typing import Any

from . import paths, swap
from .errors import StageError
from .version import python_tag

SCHEMA_VERSION = 1
SECTIONS = ("profiles", "resolution")
_LOCK = threading.Lock()  # one process may verify several Pythons and profiles at once


class EvidenceError(StageError):
    """An evidence file that cannot be read; the message names it and the fix."""


def path(python: str, build: Path | None = None) -> Path:
    return (build or paths.BUILD) / f"verify-{python_tag(python)}.json"


def _empty(python: str) -> dict[str, Any]:
    return {"schema_version": SCHEMA_VERSION, "python": python, "interpreter": None, "profiles": {}, "resolution": {}}


def load(file: Path) -> dict[str, Any]:
    """One evidence file, its shape checked; EvidenceError naming what is wrong and the fix."""
    fix = "run nox -s verify_install again (it rewrites the file), or remove it"
    try:
        data = json.loads(file.read_text())
    except (OSError, ValueError) as exc:
        raise EvidenceError(f"{file}: cannot be read as JSON ({exc}); {fix}") from None
    if not isinstance(data, dict) or data.get("schema_version") != SCHEMA_VERSION:
        got = data.get("schema_version") if isinstance(data, dict) else type(data).__name__
        raise EvidenceError(f"{file}: schema_version {got!r}, this kt-release reads {SCHEMA_VERSION}; {fix}")
    if not isinstance(data.get("python"), str) or not re.fullmatch(r"3\.\d+", data["python"]):
        raise EvidenceError(f"{file}: `python` is not a CPython version like 3.12; {fix}")
    if file.name != path(data["python"]).name:
        raise EvidenceError(f"{file}: holds CPython {data['python']}'s evidence under another Python's name; {fix}")
    for section in SECTIONS:
        value = data.get(section)
        if not isinstance(value, dict) or not all(isinstance(v, dict) for v in value.values()):
            raise EvidenceError(f"{file}: `{section}` is not an object of results; {fix}")
    if data.get("interpreter") is not None and not isinstance(data["interpreter"], dict):
        raise EvidenceError(f"{file}: `interpreter` is not an object; {fix}")
    return data


def load_all(build: Path | None = None) -> dict[str, dict[str, Any]]:
    """Every Python's evidence under `build` (python -> its file's content)."""
    out: dict[str, dict[str, Any]] = {}
    for file in sorted((build or paths.BUILD).glob("verify-cp3*.json")):
        if re.fullmatch(r"verify-cp3\d+\.json", file.name):
            data = load(file)
            out[data["python"]] = data
    return out


def update(
    python: str,
    *,
    build: Path | None = None,
    interpreter: dict[str, Any] | None = None,
    section: str = "",
    name: str = "",
    result: dict[str, Any] | None = None,
) -> None:
    """Record the interpreter found for `python`, or one result (`section` "profiles" or "resolution",
    `name` the profile); the file is replaced whole (written beside it, then renamed)."""
    file = path(python, build)
    with _LOCK:
        data = load(file) if file.exists() else _empty(python)
        if interpreter is not None:
            data["interpreter"] = interpreter
        if section:
            if section not in SECTIONS:
                raise ValueError(f"unknown evidence section {section!r}")
            if result is None:
                data[section].pop(name, None)
            else:
                data[section][name] = result
        file.parent.mkdir(parents=True, exist_ok=True)
        tmp = swap.part(file, str(threading.get_ident()))
        tmp.write_text(json.dumps(data, indent=2) + "\n")
        tmp.replace(file)


def for_build(data: dict[str, Any], section: str, key: str | None) -> dict[str, dict[str, Any]]:
    """The results of `section` obtained on exactly the build `key` names."""
    if key is None:
        return {}
    return {n: r for n, r in data.get(section, {}).items() if r.get("dist_sha256") == key}
