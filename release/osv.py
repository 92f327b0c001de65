"""Known vulnerabilities from OSV data on disk: what an air-gapped site mirrors (`--advisories FILE`).

The file is OSV's own export (``PyPI/all.zip``: one JSON advisory per member), a folder of OSV JSON files,
or one JSON file holding an advisory or a list of them. Read as OSV means it (ossf.github.io/osv-schema):

- ``versions`` lists affected versions, compared as PEP 440 versions (``2013b`` is ``2013b0``, ``1.0`` is
  ``1.0.0``);
- an ``ECOSYSTEM`` range's events (``introduced``, ``fixed``, ``last_affected``) are PyPI's PEP 440 versions,
  evaluated in version order; its ``limit`` events are upper bounds beside them (a version is affected only
  below one of them; ``*`` is none), never read as ``fixed``;
- a pin's local label is left out for matching, as pip matches ``torch==2.1.2`` to ``2.1.2+cu121``;
- a ``GIT`` range is described by the advisory's ``versions`` (OSV's exporters enumerate them); without
  them, a ``SEMVER`` range (no PyPI ordering), a range of another type, or a bound or listed version that
  is no PEP 440 version cannot be evaluated here: the pin is NOT CHECKED, never clean;
- a ``withdrawn`` advisory is ignored, and said so (the data's summary counts and names them).

Data that is not OSV (wrong shapes, JSON nested deeper than any advisory, a damaged zip member) is refused
naming the file, the advisory and the fix. The answer has pip-audit's shape (name, version, vulns: id,
aliases, fix_versions), so the waivers apply the same way; a pin some advisory could not be evaluated for
carries `not_evaluated`. The file's sha256 and the newest ``modified`` date say what the answer rests on.
"""

from __future__ import annotations

import hashlib
import json
import zipfile
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from .errors import ReleaseError

_MEMBER_LIMIT = 16 << 20  # one advisory's JSON: far below this; a larger member is refused, not read
# The whole: OSV's PyPI export holds about 20,000 advisories in under 200 MiB of JSON. Data beyond these is
# refused before anything is inflated (a 125 KiB zip of many members once cost 1.3 GiB and 5 s).
_COUNT_LIMIT = 500_000
_TOTAL_LIMIT = 1 << 30
_FIX = "give OSV's PyPI export (https://osv-vulnerabilities.storage.googleapis.com/PyPI/all.zip) or OSV JSON files"
_BOUNDS = ("introduced", "fixed", "last_affected", "limit")


def _records(path: Path) -> Iterator[tuple[str, bytes]]:
    """(where, JSON bytes) of every advisory document in `path`."""
    if path.is_dir():
        files = sorted(path.rglob("*.json"))
        _bounded(path, [(str(f), f.stat().st_size) for f in files])
        for f in files:
            yield str(f), f.read_bytes()
    elif zipfile.is_zipfile(path):
        try:
            with zipfile.ZipFile(path) as zf:
                members = [i for i in zf.infolist() if not i.is_dir() and i.filename.endswith(".json")]
                _bounded(path, [(i.filename, i.file_size) for i in members])
                for info in members:
                    try:
                        data = zf.read(info)
                    except (zipfile.BadZipFile, zlib.error, EOFError, OSError) as exc:
                        raise ReleaseError(
                            f"{path}: {info.filename} is damaged ({exc}); download the advisory data again"
                        ) from None
                    yield f"{path}:{info.filename}", data
        except zipfile.BadZipFile as exc:
            raise ReleaseError(f"{path}: a damaged zip ({exc}); download the advisory data again") from None
    else:
        size = path.stat().st_size
        if size > _TOTAL_LIMIT:
            raise ReleaseError(f"{path}: {size / 2**30:.1f} GiB, more than any OSV export's advisories; {_FIX}")
        yield str(path), path.read_bytes()


def _bounded(path: Path, members: list[tuple[str, int]]) -> None:
    """ReleaseError unless the advisory documents are within the bounds of any OSV export: each member, their
    count and their total size (as declared: a zip member is never inflated past its declared size)."""
    big = next(((n, size) for n, size in members if size > _MEMBER_LIMIT), None)
    if big is not None:
        raise ReleaseError(f"{path}: {big[0]} declares {big[1]} bytes; not an advisory ({_FIX})")
    if len(members) > _COUNT_LIMIT:
        raise ReleaseError(f"{path}: {len(members)} documents, more than any OSV export's {_COUNT_LIMIT}; {_FIX}")
    total = sum(size for _, size in members)
    if total > _TOTAL_LIMIT:
        raise ReleaseError(
            f"{path}: {total / 2**30:.1f} GiB of advisories, more than any OSV export's "
            f"{_TOTAL_LIMIT >> 30} GiB; {_FIX}"
        )


def _shape_error(where: str, ident: object, at: str, what: str) -> ReleaseError:
    name = f"advisory {ident}" if isinstance(ident, str) else "an advisory"
    return ReleaseError(f"{where}: {name}: `{at}` {what}; not OSV data: {_FIX}")


def _check_shape(where: str, doc: object) -> dict[str, Any]:
    """One advisory, its shape as OSV defines it (the parts this reader uses), or ReleaseError naming it."""
    if not isinstance(doc, dict) or not isinstance(doc.get("id"), str):
        raise ReleaseError(f"{where}: not an OSV advisory (no string `id`); {_FIX}")
    ident = doc["id"]
    affected = doc.get("affected", [])
    if not isinstance(affected, list):
        raise _shape_error(where, ident, "affected", "is not a list")
    if not isinstance(doc.get("aliases", []), list) or not all(isinstance(a, str) for a in doc.get("aliases", [])):
        raise _shape_error(where, ident, "aliases", "is not a list of strings")
    for i, aff in enumerate(affected):
        at = f"affected[{i}]"
        if not isinstance(aff, dict):
            raise _shape_error(where, ident, at, "is not an object")
        pkg = aff.get("package", {})
        if not isinstance(pkg, dict) or not all(isinstance(pkg.get(k, ""), str) for k in ("ecosystem", "name")):
            raise _shape_error(where, ident, f"{at}.package", "is not an object with string ecosystem and name")
        versions = aff.get("versions", [])
        if not isinstance(versions, list) or not all(isinstance(v, str) for v in versions):
            raise _shape_error(where, ident, f"{at}.versions", "is not a list of strings")
        ranges = aff.get("ranges", [])
        if not isinstance(ranges, list):
            raise _shape_error(where, ident, f"{at}.ranges", "is not a list")
        for j, r in enumerate(ranges):
            rat = f"{at}.ranges[{j}]"
            if not isinstance(r, dict) or not isinstance(r.get("type"), str):
                raise _shape_error(where, ident, rat, "is not an object with a string `type`")
            events = r.get("events")
            if not isinstance(events, list) or not all(
                isinstance(ev, dict) and all(isinstance(ev[k], str) for k in _BOUNDS if k in ev) for ev in events
            ):
                raise _shape_error(where, ident, f"{rat}.events", "is not a list of events with string versions")
    return doc


def _documents(where: str, raw: bytes) -> list[dict[str, Any]]:
    try:
        data = json.loads(raw)
    except RecursionError:
        raise ReleaseError(f"{where}: JSON nested deeper than any advisory; not OSV data: {_FIX}") from None
    except ValueError as exc:
        raise ReleaseError(f"{where}: not JSON ({exc}); --advisories takes OSV data") from None
    docs = data if isinstance(data, list) else [data]
    return [_check_shape(where, d) for d in docs]


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


def _public(v: Version) -> Version:
    """The version without its local label: what `pkg==2.1.2` matches (2.1.2+cu121 included)."""
    return Version(v.public) if v.local else v


class _Unevaluable(Exception):
    """This advisory entry cannot be evaluated for a pin here (the message says why)."""


def _in_range(v: Version, events: Sequence[dict[str, Any]]) -> bool:
    """OSV's range evaluation: over the `introduced`, `fixed` and `last_affected` events ordered by version,
    after an `introduced` at or below `v`, until a `fixed` at or below it (exclusive) or a `last_affected`
    below it (inclusive of itself). A `limit` is no `fixed`: where a range has limits, `v` is affected only
    if it is also below at least one of them (several limits are several upper bounds; `*` is no bound)."""
    keyed: list[tuple[Version, int, str]] = []
    limits: list[Version | None] = []  # None: "*", infinity
    for ev in events:
        for kind in _BOUNDS:
            if kind not in ev:
                continue
            raw = ev[kind]
            if (kind == "introduced" and raw == "0") or (kind == "limit" and raw == "*"):
                at: Version | None = None if kind == "limit" else Version("0")
            else:
                at = _version(raw)
                if at is None:
                    raise _Unevaluable(f"its {kind} bound {raw!r} is no PEP 440 version")
            if kind == "limit":
                limits.append(None if at is None else _public(at))
            elif at is not None:
                keyed.append((_public(at), _BOUNDS.index(kind), kind))
    if limits and not any(limit is None or v < limit for limit in limits):
        return False
    affected = False
    for at, _, kind in sorted(keyed):
        if kind == "introduced" and v >= at:
            affected = True
        elif (kind == "fixed" and v >= at) or (kind == "last_affected" and v > at):
            affected = False
    return affected


def _affects(aff: dict[str, Any], v: Version) -> bool:
    """Whether one `affected` entry names the (public) version `v`; _Unevaluable when it cannot be told."""
    versions = aff.get("versions", [])
    problems = []
    for listed in versions:
        lv = _version(listed)
        if lv is None:
            problems.append(f"it lists {listed!r}, no PEP 440 version")
        elif _public(lv) == v:
            return True
    for r in aff.get("ranges", []):
        kind = r["type"]
        if kind == "ECOSYSTEM":
            try:
                if _in_range(v, r["events"]):
                    return True
            except _Unevaluable as exc:
                problems.append(str(exc))
        elif kind == "GIT":
            if not versions:
                problems.append("a GIT range without `versions` (commits, no versions to compare)")
        elif kind == "SEMVER":
            problems.append("a SEMVER range (semver ordering is not PyPI's PEP 440)")
        else:
            problems.append(f"a range of type {kind!r}")
    if problems:
        raise _Unevaluable("; ".join(problems))
    return False


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

    def affecting(self, name: str, version: str) -> tuple[list[dict[str, Any]], list[str]] | None:
        """(pip-audit's `vulns` for this pin, why some advisory could not be evaluated for it), or None
        when the pin's own version is no PEP 440 version (NOT CHECKED)."""
        parsed = _version(version)
        if parsed is None:
            return None
        v = _public(parsed)
        out: dict[str, dict[str, Any]] = {}
        unevaluable: list[str] = []
        for doc, aff in self.by_package.get(canonicalize_name(name), []):
            try:
                hit = _affects(aff, v)
            except _Unevaluable as exc:
                unevaluable.append(f"{doc['id']}: {exc}")
                continue
            if hit:
                entry = out.setdefault(
                    doc["id"], {"id": doc["id"], "aliases": list(doc.get("aliases", [])), "fix_versions": []}
                )
                entry["fix_versions"] = sorted({*entry["fix_versions"], *_fixes(aff)})
        return list(out.values()), unevaluable

    def dependencies(self, pins: Sequence[tuple[str, str]]) -> list[dict[str, Any]]:
        """pip-audit's `dependencies` for these pins (with `not_evaluated` where an advisory could not be)."""
        out: list[dict[str, Any]] = []
        for name, version in pins:
            got = self.affecting(name, version)
            if got is None:
                out.append({"name": name, "version": version, "skip_reason": f"not a PEP 440 version ({version})"})
                continue
            vulns, unevaluable = got
            dep: dict[str, Any] = {"name": name, "version": version, "vulns": vulns}
            if unevaluable:
                dep["not_evaluated"] = "advisories that cannot be evaluated here: " + "; ".join(unevaluable)
            out.append(dep)
        return out


def load(path: Path) -> Advisories:
    """Every PyPI advisory in `path` (withdrawn ones left out, and counted); ReleaseError names a file that is
    missing, damaged or not OSV data."""
    if not path.exists():
        raise ReleaseError(f"--advisories {path}: no such file or folder; give OSV data (PyPI's all.zip)")
    out = Advisories()
    newest = ""
    count = 0
    withdrawn: list[str] = []
    for where, raw in _records(path):
        for doc in _documents(where, raw):
            count += 1
            newest = max(newest, str(doc.get("modified", "")))
            if doc.get("withdrawn"):
                withdrawn.append(doc["id"])
                continue
            for aff in doc.get("affected", []):
                pkg = aff.get("package", {})
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
        "withdrawn": sorted(withdrawn),  # retracted by their publisher: ignored
    }
    return out
