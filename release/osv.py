"""Known vulnerabilities from OSV data on disk: what an air-gapped site mirrors (`--advisories FILE`).

The file is OSV's own export (``PyPI/all.zip``: one JSON advisory per member), a folder of OSV JSON files,
or one JSON file holding an advisory or a list of them. A pin is affected when an advisory's ``affected``
entry for the PyPI ecosystem names the package and lists its version in ``versions`` or places it inside
an ``ECOSYSTEM`` range (``introduced`` .. ``fixed`` / ``last_affected`` / ``limit``, compared as PEP 440
versions). The answer has pip-audit's shape (name, version, vulns: id, aliases, fix_versions), so the
waivers apply the same way. A pin whose version is no PEP 440 version is NOT CHECKED, never a pass.
The file's sha256 and the newest ``modified`` date among its advisories say what the answer rests on.
"""

from __future__ import annotations

import hashlib
import json
import zipfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from .errors import ReleaseError

_MEMBER_LIMIT = 64 << 20  # one advisory's JSON: far below this; a larger member is refused, not read


def _records(path: Path) -> Iterator[tuple[str, bytes]]:
    """(where, JSON bytes) of every advisory document in `path`."""
    if path.is_dir():
        for f in sorted(path.rglob("*.json")):
            yield str(f), f.read_bytes()
    elif zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as zf:
            for info in zf.infolist():
                if info.is_dir() or not info.filename.endswith(".json"):
                    continue
                if info.file_size > _MEMBER_LIMIT:
                    raise ReleaseError(f"{path}: {info.filename} declares {info.file_size} bytes; not an advisory")
                yield f"{path}:{info.filename}", zf.read(info)
    else:
        yield str(path), path.read_bytes()


def _documents(where: str, raw: bytes) -> list[dict[str, Any]]:
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise ReleaseError(f"{where}: not JSON ({exc}); --advisories takes OSV data") from None
    docs = data if isinstance(data, list) else [data]
    for d in docs:
        if not isinstance(d, dict) or not isinstance(d.get("id"), str) or not isinstance(d.get("affected", []), list):
            raise ReleaseError(f"{where}: not an OSV advisory (no string `id`, or `affected` is not a list)")
    return docs


def _sha256(path: Path) -> str:
    if path.is_dir():
        h = hashlib.sha256()
        for doc in sorted(path.rglob("*.json")):
            h.update(f"{doc.relative_to(path)}\0".encode() + hashlib.sha256(doc.read_bytes()).digest())
        return h.hexdigest()
    with path.open("rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def _version(text: object) -> Version | None:
    try:
        return Version(str(text))
    except InvalidVersion:
        return None


def _in_range(v: Version, events: Sequence[dict[str, Any]]) -> bool:
    """OSV ECOSYSTEM range semantics over events ordered by version."""
    keyed = []
    for ev in events:
        for kind in ("introduced", "fixed", "last_affected", "limit"):
            if kind in ev:
                at = Version("0") if ev[kind] == "0" else _version(ev[kind])
                if at is not None:
                    keyed.append((at, kind))
    affected = False
    for at, kind in sorted(keyed, key=lambda k: k[0]):
        if kind == "introduced" and v >= at:
            affected = True
        elif (kind in ("fixed", "limit") and v >= at) or (kind == "last_affected" and v > at):
            affected = False
    return affected


def _fixes(affected: dict[str, Any]) -> list[str]:
    return sorted(
        {str(ev["fixed"]) for r in affected.get("ranges", []) for ev in r.get("events", []) if "fixed" in ev},
        key=lambda x: _version(x) or Version("0"),
    )


@dataclass
class Advisories:
    """OSV advisories by normalized PyPI package name, and what they came from."""

    by_package: dict[str, list[tuple[dict[str, Any], dict[str, Any]]]] = field(default_factory=dict)
    source: dict[str, Any] = field(default_factory=dict)

    def affecting(self, name: str, version: str) -> list[dict[str, Any]] | None:
        """pip-audit's `vulns` for this pin, or None when its version cannot be compared (NOT CHECKED)."""
        v = _version(version)
        if v is None:
            return None
        out: dict[str, dict[str, Any]] = {}
        for doc, aff in self.by_package.get(canonicalize_name(name), []):
            listed = version in [str(x) for x in aff.get("versions", [])]
            ranged = any(
                r.get("type") == "ECOSYSTEM" and _in_range(v, r.get("events", [])) for r in aff.get("ranges", [])
            )
            if listed or ranged:
                entry = out.setdefault(
                    doc["id"], {"id": doc["id"], "aliases": list(doc.get("aliases", [])), "fix_versions": []}
                )
                entry["fix_versions"] = sorted({*entry["fix_versions"], *_fixes(aff)})
        return list(out.values())

    def dependencies(self, pins: Sequence[tuple[str, str]]) -> list[dict[str, Any]]:
        """pip-audit's `dependencies` for these pins."""
        out: list[dict[str, Any]] = []
        for name, version in pins:
            vulns = self.affecting(name, version)
            if vulns is None:
                out.append({"name": name, "version": version, "skip_reason": f"not a PEP 440 version ({version})"})
            else:
                out.append({"name": name, "version": version, "vulns": vulns})
        return out


def load(path: Path) -> Advisories:
    """Every PyPI advisory in `path`; ReleaseError names a file that is missing or not OSV data."""
    if not path.exists():
        raise ReleaseError(f"--advisories {path}: no such file or folder; give OSV data (PyPI's all.zip)")
    out = Advisories()
    newest = ""
    count = 0
    for where, raw in _records(path):
        for doc in _documents(where, raw):
            count += 1
            newest = max(newest, str(doc.get("modified", "")))
            for aff in doc.get("affected", []):
                pkg = aff.get("package", {}) if isinstance(aff, dict) else {}
                if str(pkg.get("ecosystem", "")).lower() != "pypi" or not pkg.get("name"):
                    continue
                out.by_package.setdefault(canonicalize_name(str(pkg["name"])), []).append((doc, aff))
    if count == 0:
        raise ReleaseError(f"--advisories {path}: holds no OSV advisory")
    out.source = {
        "kind": "advisory file",
        "file": str(path),
        "sha256": _sha256(path),
        "date": newest or "unknown (no `modified` field)",
        "advisories": count,
    }
    return out
