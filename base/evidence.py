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

import contextlib
import fcntl
import json
import os
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from . import paths, swap
from .errors import StageError
from .version import python_tag

SCHEMA_VERSION = 1
SECTIONS = ("profiles", "resolution", "upgrade")
_LOCK = threading.Lock()  # one process may verify several Pythons and profiles at once


class EvidenceError(StageError):
    """An evidence file that cannot be read; the message names it and the fix."""


def path(python: str, build: Path | None = None) -> Path:
    return (build or paths.BUILD) / f"verify-{python_tag(python)}.json"


def _empty(python: str) -> dict[str, Any]:
    return {
        "schema_version": SCHEMA_VERSION,
        "python": python,
        "interpreter": None,
        "profiles": {},
        "resolution": {},
        "upgrade": {},
    }


# The members the verdict and the report read, with their types: a dict is an object of these members
# (optional, or required where the name ends in "!"; others are kept unread), a one-item list a list of
# that, a tuple any of its types. A member of another type is the file's error, named, never a traceback in
# release_report or publish.
_NUMBER = (int, float)
_RESULT: dict[str, Any] = {
    "dist_sha256": str,
    "installs_from_dist": bool,
    "produced": str,
    "outcome": str,
    "error": str,
    "problems": list,
    "not_verified": str,
    "ok": bool,
    "simulated": bool,
    "install_file": {"file!": str, "sha256!": str},
    "interpreter": dict,
    "torch": (str, {"before": (str, type(None)), "after": (str, type(None))}),
    "doctor_run": {"checks": dict, "seconds!": _NUMBER, "deep_seconds": _NUMBER},
    "doctor": {"checks": dict, "seconds!": _NUMBER, "deep_seconds": _NUMBER},
    "tokenizer": {
        "native_equal!": bool,
        "ids_compared!": _NUMBER,
        "corpus_texts!": _NUMBER,
        "special_tokens!": _NUMBER,
    },
    "json_schema": {"accepted!": _NUMBER, "rejected!": _NUMBER, "strict_thinking!": (str, bool)},
    "distributions": dict,
    "seconds": _NUMBER,
    "moves": [{"move": str, "problems": list, "files_missing": _NUMBER, "seconds": _NUMBER}],
    "previous": str,
}
_FOUND: dict[str, Any] = {
    "python": str,
    "interpreter": (
        type(None),
        {"python": str, "path!": str, "version!": str, "source!": str, "how": str, "root": str},
    ),
    "tried": [{"source": str, "path": str, "problem": str, "fix": str}],
    "searched": [str],
    "dist_sha256": str,
}
_NAMES = {str: "a string", bool: "true or false", int: "a number", float: "a number", type(None): "null"}


def _shape(value: Any, spec: Any, where: str) -> str:  # noqa: PLR0911 (one answer per kind of spec)
    """Where `value` differs from `spec` (the member's dotted path and what it should be), or ""."""
    if isinstance(spec, tuple):
        wrong = [_shape(value, s, where) for s in spec]
        if all(wrong):
            alternatives = " or ".join(dict.fromkeys(_name(s) for s in spec))
            return next((w for w in wrong if w.startswith(f"`{where}.")), f"`{where}` is not {alternatives}")
        return ""
    if isinstance(spec, dict):
        if not isinstance(value, dict):
            return f"`{where}` is not an object"
        for k, s in spec.items():
            name = k.rstrip("!")
            if name not in value:
                if k.endswith("!"):
                    return f"`{where}` has no `{name}`"
                continue
            if found := _shape(value[name], s, f"{where}.{name}"):
                return found
        return ""
    if isinstance(spec, list):
        if not isinstance(value, list):
            return f"`{where}` is not a list"
        return next((w for i, v in enumerate(value) if (w := _shape(v, spec[0], f"{where}[{i}]"))), "")
    if spec is bool or spec is type(None):
        ok = isinstance(value, spec)
    else:
        ok = isinstance(value, spec) and not isinstance(value, bool)
    return "" if ok else f"`{where}` is not {_name(spec)}"


def _name(spec: Any) -> str:
    if isinstance(spec, dict) or spec is dict:
        return "an object"
    if isinstance(spec, list) or spec is list:
        return "a list"
    return _NAMES.get(spec, "a number") if not isinstance(spec, tuple) else "a number"


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
        value = data.setdefault(section, {}) if section == "upgrade" else data.get(section)  # older files lack it
        if not isinstance(value, dict):
            raise EvidenceError(f"{file}: `{section}` is not an object of results; {fix}")
        for name, result in value.items():
            if not isinstance(result, dict):
                raise EvidenceError(f"{file}: `{section}.{name}` is not an object (a result); {fix}")
    if data.get("interpreter") is not None and not isinstance(data["interpreter"], dict):
        raise EvidenceError(f"{file}: `interpreter` is not an object; {fix}")
    wrong = _shape(data["interpreter"], _FOUND, "interpreter") if data.get("interpreter") is not None else ""
    for section in SECTIONS:
        for name, result in data[section].items():
            wrong = wrong or _shape(result, _RESULT, f"{section}.{name}")
    if wrong:
        raise EvidenceError(f"{file}: {wrong}; {fix}")
    return data


def load_all(build: Path | None = None) -> dict[str, dict[str, Any]]:
    """Every Python's evidence under `build` (python -> its file's content)."""
    out: dict[str, dict[str, Any]] = {}
    for file in sorted((build or paths.BUILD).glob("verify-cp3*.json")):
        if re.fullmatch(r"verify-cp3\d+\.json", file.name):
            data = load(file)
            out[data["python"]] = data
    return out


LOCK_TIMEOUT_S = 120.0


@contextlib.contextmanager
def _exclusive(folder: Path) -> Iterator[None]:
    """The evidence folder locked against every other process's read-modify-replace of an evidence file (two
    verify runs for one Python each keep the other's results): an flock on the folder itself, so no lock file
    is left behind; EvidenceError after LOCK_TIMEOUT_S."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        deadline = time.monotonic() + LOCK_TIMEOUT_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise EvidenceError(
                        f"{folder}: another process has held the evidence lock for {LOCK_TIMEOUT_S:.0f} s; "
                        "wait for the other verify_install to finish, or stop it"
                    ) from None
                time.sleep(0.05)
        yield
    finally:
        os.close(fd)  # releases the lock


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
    file.parent.mkdir(parents=True, exist_ok=True)
    with _LOCK, _exclusive(file.parent):
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
        tmp = swap.part(file, str(threading.get_ident()))
        tmp.write_text(json.dumps(data, indent=2) + "\n")
        tmp.replace(file)


def for_build(data: dict[str, Any], section: str, key: str | None) -> dict[str, dict[str, Any]]:
    """The results of `section` obtained on exactly the build `key` names."""
    if key is None:
        return {}
    return {n: r for n, r in data.get(section, {}).items() if r.get("dist_sha256") == key}
