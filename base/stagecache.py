"""Content keys for the release's stages: a stage whose every ingredient is byte-for-byte what it was
the last time it succeeded, and whose outputs are still the bytes it wrote, is reused, not re-run.

A key is the sha256 of the stage's ingredients (name -> sha256 of a file, a tree of files, or a
value such as the Python's version). The record of the last success, ``build/stage-cache/NAME.json``,
holds the key, each ingredient's hash (so a miss says what changed), when it was produced, the sha256
of every output file and, for stages whose output is a result (a verification profile), the result.
A record is trusted only if its own checksum holds and every output re-hashes to what it says; a
corrupted or hand-edited record is reported and the stage re-runs. ``fresh=True`` (``--fresh``,
``KT_FRESH=1``; CI always) ignores every record. Stdlib only: nox imports this before any venv exists.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import paths

CACHE = paths.STAGE_CACHE
SKIP_PARTS = frozenset({"__pycache__", ".mypy_cache", ".pytest_cache", ".ruff_cache"})


def file_sha256(path: Path) -> str:
    """The hex sha256 of a file (hashlib reads it in chunks)."""
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def files_sha256(files: Iterable[Path], root: Path = paths.ROOT) -> str:
    """One digest over these files' paths (relative to `root`) and contents, in sorted order."""
    h = hashlib.sha256()
    for f in sorted(set(files)):
        rel = f.relative_to(root) if f.is_relative_to(root) else f
        h.update(f"{rel}\0{file_sha256(f)}\n".encode())
    return h.hexdigest()


def tree_sha256(*roots: Path, suffixes: Sequence[str] = ()) -> str:
    """One digest over every file under `roots` (caches skipped; only `suffixes`, when given)."""
    files = [
        f
        for root in roots
        for f in ([root] if root.is_file() else root.rglob("*"))
        if f.is_file()
        and not SKIP_PARTS & set(f.parts)
        and not f.name.endswith(".pyc")
        and (not suffixes or f.name.endswith(tuple(suffixes)))
    ]
    return files_sha256(files)


def value_sha256(value: object) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()


def python_sha256() -> str:
    """The interpreter that runs the stage: implementation, version, ABI, platform."""
    return value_sha256([sys.implementation.name, sys.version, sys.abiflags, platform.machine(), sys.platform])


def cpu_sha256() -> str:
    """This host's CPU as the kernel's variant choice sees it: the model name and the feature flags."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return value_sha256(platform.processor())
    first = text.split("\n\n", 1)[0]
    wanted = [line for line in first.splitlines() if line.split(":")[0].strip() in ("model name", "flags")]
    return value_sha256(wanted)


class DistError(Exception):
    """dist/SHA256SUMS is missing or a file differs from it."""


def dist_sha256(dist: Path = paths.DIST) -> str:
    """The key of exactly the files a release's dist/ lists in SHA256SUMS (every wheel and install
    file), after re-hashing each one; DistError if any is missing or differs."""
    sums = dist / "SHA256SUMS"
    try:
        text = sums.read_text()
    except OSError:
        raise DistError(f"{sums} is missing; build the release first (nox -s build_all)") from None
    for line in text.splitlines():
        if not line.strip():
            continue
        digest, name = line.split(maxsplit=1)
        try:
            actual = file_sha256(dist / name)
        except OSError:
            raise DistError(f"{dist / name}: listed in SHA256SUMS but unreadable; rebuild dist/") from None
        if actual != digest:
            raise DistError(
                f"{dist / name}: sha256 {actual[:16]} differs from SHA256SUMS ({digest[:16]}); rebuild dist/"
            )
    return hashlib.sha256(text.encode()).hexdigest()


def today() -> str:
    """The UTC date: an ingredient of stages whose inputs change by the day (the index's vulnerability data)."""
    return time.strftime("%Y-%m-%d", time.gmtime())


def fresh_asked(flag: bool = False) -> bool:
    """--fresh on the command line, or KT_FRESH=1 in the environment (CI sets it)."""
    return flag or os.environ.get("KT_FRESH", "") not in ("", "0")


def _say(msg: str) -> None:
    sys.stdout.write(f"[cache {time.strftime('%H:%M:%S')}] {msg}\n")
    sys.stdout.flush()


def _seal(record: dict[str, Any]) -> str:
    body = {k: v for k, v in record.items() if k != "record_sha256"}
    return value_sha256(body)


@dataclass
class Hit:
    """A reused stage: its key, when it was produced, and its stored result (if it has one)."""

    stage: str
    key: str
    produced: str
    result: Any


class Stage:
    """One stage's key and record: ``reuse()`` before running it, ``done()`` after it succeeded."""

    def __init__(
        self,
        name: str,
        ingredients: Mapping[str, str],
        *,
        outputs: Sequence[Path] = (),
        fresh: bool = False,
        cache: Path | None = None,
    ) -> None:
        self.name = name
        self.ingredients = dict(sorted(ingredients.items()))
        self.key = value_sha256([name, self.ingredients])  # two stages of the same ingredients: two keys
        self.outputs = [Path(o) for o in outputs]
        self.fresh = fresh_asked(fresh)
        self.path = (cache or CACHE) / f"{name}.json"

    def _load(self) -> dict[str, Any] | None:
        if not self.path.exists():
            return None
        try:
            record = json.loads(self.path.read_text())
            ok = isinstance(record, dict) and record.get("record_sha256") == _seal(record)
        except (OSError, ValueError):
            ok = False
        if not ok:
            _say(f"{self.name}: the record {self.path} is corrupted (its checksum does not hold); re-running")
            return None
        return record  # type: ignore[no-any-return]

    def why_not(self) -> str | None:
        """None when the stage can be reused; otherwise why it must run."""
        if self.fresh:
            return "--fresh: every stage runs"
        record = self._load()
        if record is None:
            return "no record of a previous run" if not self.path.exists() else "corrupted record"
        if record.get("key") != self.key:
            old = record.get("ingredients", {})
            changed = [n for n in self.ingredients if old.get(n) != self.ingredients[n]]
            changed += [f"{n} (gone)" for n in old if n not in self.ingredients]
            return "changed: " + (", ".join(changed) or "the key")
        for rel, digest in record.get("outputs", {}).items():
            out = paths.ROOT / rel
            try:
                actual = file_sha256(out)
            except OSError:
                return f"output {rel} is missing"
            if actual != digest:
                return f"output {rel} changed since it was produced"
        return None

    def reuse(self) -> Hit | None:
        """The previous result if nothing changed (and a line saying so), else None (and why)."""
        why = self.why_not()
        if why is not None:
            _say(f"{self.name}: running ({why}); key {self.key[:16]}")
            return None
        record = self._load()
        assert record is not None
        _say(f"{self.name}: reused, key {self.key[:16]}, produced {record['produced']} (--fresh re-runs it)")
        record["last"] = {"outcome": "reused", "at": time.time()}
        self._write(record)
        return Hit(self.name, self.key, record["produced"], record.get("result"))

    @staticmethod
    def now() -> str:
        """A record's time format (UTC)."""
        return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())

    def done(self, result: Any = None) -> None:
        """Record a success: the key, the ingredients, the outputs' sha256 and the result."""
        outputs = {}
        for out in self.outputs:
            rel = out.resolve().relative_to(paths.ROOT) if out.resolve().is_relative_to(paths.ROOT) else out
            outputs[str(rel)] = file_sha256(out)
        record = {
            "stage": self.name,
            "key": self.key,
            "ingredients": self.ingredients,
            "produced": self.now(),
            "outputs": outputs,
            "result": result,
            "last": {"outcome": "ran", "at": time.time()},
        }
        self._write(record)

    def _write(self, record: dict[str, Any]) -> None:
        record["record_sha256"] = _seal(record)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(f".tmp-{os.getpid()}")
        tmp.write_text(json.dumps(record, indent=2, sort_keys=True, default=str) + "\n")
        tmp.replace(self.path)


def last_outcomes(cache: Path | None = None) -> dict[str, dict[str, Any]]:
    """Every stage's record: name -> {"outcome": "ran"|"reused", "at", "key", "produced"} (corrupt ones left out)."""
    out: dict[str, dict[str, Any]] = {}
    for f in sorted((cache or CACHE).glob("*.json")):
        try:
            record = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(record, dict) or record.get("record_sha256") != _seal(record):
            continue
        out[f.stem] = {**record.get("last", {}), "key": record.get("key"), "produced": record.get("produced")}
    return out
