"""dist/, the release's wire format: one typed contract every stage reads and the assembly writes.

A release directory holds the wheels, the install files under ``install/``, ``SHA256SUMS`` (every
wheel and install file with its sha256, in the assembly's order) and ``manifest.json`` (the record of
each wheel, its inputs and patches, the install files, the payload archive and, once the release
report judged it, the verdict). This module owns all of it:

- **the types**: :class:`Manifest` and the frozen records inside it. ``manifest.json`` is parsed into
  them, every member checked against its annotation (types, patterns, enumerations, no unknown
  member), and written from them; the JSON Schema (``audits/schemas/release-manifest.schema.json``, for
  the audit, which ships alone and reads dist/ with its own defensive reader) is generated from the same
  annotations (``python -m base.distdir --schema``) and a test keeps the committed file equal to it;
- **one opening per process**: :func:`open_release` reads ``SHA256SUMS`` and ``manifest.json`` once,
  checks that they list the same files with the same digests, and re-hashes every listed file at most
  once per process (a later opening of unchanged files reuses the check);
- **the names**: install files (:func:`install_name`) and the key of exactly what a stage reads from
  dist/ (:meth:`Release.key`, without the verdict, which is the release report's output);
- **the writes**: :func:`write` (the assembly, into its staging directory) and :func:`record_verdict`
  (the release report; the manifest rewritten whole, a temporary file renamed).

Stdlib only: nox imports base before any venv exists.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import sys
import types
import typing
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from . import keys, paths, swap
from .errors import StageError
from .version import python_tag

SUMS = "SHA256SUMS"
MANIFEST = "manifest.json"
INSTALL_DIR = "install"
SCHEMA_VERSION: Literal[1] = 1
VERDICT_MEMBER = "release"  # the release report's output, no stage's input: left out of Release.key
SCHEMA_FILE = paths.ROOT / "audits" / "schemas" / "release-manifest.schema.json"
MAX_MANIFEST = 16 << 20  # bytes; a release's manifest is tens of KiB

# Patterns end in END, not a bare $: Python's re (which jsonschema uses too) lets $ match before a
# trailing newline, so "...whl\n" would pass; the lookahead refuses it in Python and ECMA 262 alike.
END = r"(?!\n)$"
SHA256 = rf"^[0-9a-f]{{64}}{END}"
PLAIN_NAME = rf"^[A-Za-z0-9_][A-Za-z0-9_.+!-]*{END}"  # a file name in one directory: no separator, no ..
WHEEL_NAME = rf"^[A-Za-z0-9_][A-Za-z0-9_.+!-]*\.whl{END}"
INSTALL_NAME = rf"^install/[A-Za-z0-9_][A-Za-z0-9_.+-]*\.(txt|toml){END}"
PYTHON = rf"^3\.[0-9]+{END}"
NAME = rf"^[a-z0-9]([a-z0-9-]*[a-z0-9])?{END}"  # a canonical project name


class DistError(StageError):
    """dist/ is missing, unreadable, or differs from its own record; the message names the file and the fix."""


def _m(pattern: str = "", doc: str = "") -> dict[str, str]:
    """A field's JSON Schema pattern and description (the schema and the parser read both)."""
    return {"pattern": pattern, "doc": doc}


def _f(pattern: str = "", doc: str = "") -> Any:
    """A required field with its pattern and description."""
    return field(metadata=_m(pattern, doc))


@dataclass(frozen=True)
class Input:
    """An upstream distribution a wheel derives from, by the sha256 of the file downloaded."""

    name: str = _f(NAME, "its canonical project name")
    version: str = _f(doc="its version")
    filename: str = _f(PLAIN_NAME, "the file downloaded")
    sha256: str = _f(SHA256)


@dataclass(frozen=True)
class Patch:
    """A patch applied to an input (carriers/patches/<carrier>/)."""

    file: str = _f(PLAIN_NAME, "its file name")
    sha256: str = _f(SHA256)


@dataclass(frozen=True)
class Wheel:
    """One wheel of the release."""

    name: str = _f(NAME, "its canonical project name")
    version: str = _f(doc="its version")
    kind: Literal["native", "fork", "repack", "umbrella"] = _f(doc="how carriers.toml makes it")
    filename: str = _f(WHEEL_NAME, "its file in dist/")
    sha256: str = _f(SHA256)
    size: int = _f(doc="bytes")
    pythons: tuple[str, ...] = _f(PYTHON, "the Pythons of the release it installs on")
    inputs: tuple[Input, ...] = _f(doc="what it derives from")
    patches: tuple[Patch, ...] = _f(doc="the patches applied, in order")


@dataclass(frozen=True)
class InstallFile:
    """One install file users get: `pip install --require-hashes -r` (requirements) or PEP 751 (pylock)."""

    profile: str = _f(NAME, "the install profile (lockfiles/<profile>.in)")
    python: str = _f(PYTHON, "the CPython it is for")
    file: str = _f(INSTALL_NAME, "its path in dist/")
    format: Literal["requirements", "pylock"] = _f()
    sha256: str = _f(SHA256)


@dataclass(frozen=True)
class Part:
    """One part of the payload archive and the carrier that ships it."""

    index: int = _f(doc="1-based, in the order the parts are joined")
    distribution: str = _f(NAME, "the carrier")
    version: str = _f(doc="the carrier's version")
    size: int = _f(doc="bytes")
    sha256: str = _f(SHA256)


@dataclass(frozen=True)
class Payload:
    """The lazy archive of the large CUDA binaries, cut into parts."""

    archive_sha256: str = _f(SHA256)
    archive_size: int = _f(doc="bytes, compressed")
    files: int = _f(doc="how many files it holds")
    extracted_size: int = _f(doc="bytes, extracted")
    parts: tuple[Part, ...] = _f()


@dataclass(frozen=True)
class Partial:
    """A partial development release: wheels for only some Pythons of the matrix; never published."""

    pythons: tuple[str, ...] = _f(PYTHON, "the Pythons it serves")
    missing: tuple[str, ...] = _f(PYTHON, "the Pythons of the matrix it lacks")


@dataclass(frozen=True)
class Finding:
    """A check of the verdict that failed or is missing."""

    item: str = _f()
    detail: str = _f()


@dataclass(frozen=True)
class Accepted:
    """A missing check accepted by name (or glob) with a reason."""

    item: str = _f()
    detail: str = _f()
    reason: str = _f()
    by: str = _f(doc='"command line", or "policy (until YYYY-MM-DD)"')
    pattern: str = _f()


@dataclass(frozen=True)
class Verdict:
    """The release report's verdict on exactly the dist/ whose key it records (release/verdict.py)."""

    verdict: Literal["PASSED", "INCOMPLETE", "FAILED"] = _f()
    publishable: bool = _f()
    dist_sha256: str | None = _f(SHA256, "Release.key of the dist/ judged (null: it could not be read)")
    judged: str = _f(doc="when, UTC")
    passed: tuple[str, ...] = _f()
    failed: tuple[Finding, ...] = _f()
    missing: tuple[Finding, ...] = _f()
    accepted: tuple[Accepted, ...] = _f()


@dataclass(frozen=True)
class Manifest:
    """dist/manifest.json."""

    schema_version: Literal[1] = _f()
    kt_version: str = _f(doc="the release's version")
    pythons: tuple[str, ...] = _f(PYTHON, "the Pythons it serves")
    torch: str = _f(doc="every carrier's torch requirement, joined")
    torch_candidates: tuple[str, ...] = _f(doc="the torch versions the carriers allow that the lock holds")
    wheels: tuple[Wheel, ...] = _f()
    install: tuple[InstallFile, ...] | None = field(default=None, metadata=_m(doc="absent: no install files"))
    partial: Partial | None = field(default=None, metadata=_m(doc="present: a partial development release"))
    payload: Payload | None = field(default=None, metadata=_m(doc="absent: a release without CUDA binaries"))
    release: Verdict | None = field(default=None, metadata=_m(doc="written by the release report, last"))

    # what the stages ask of it
    def wheel_for(self, name: str, python: str) -> Wheel | None:
        """The `name` wheel that installs on CPython `python`."""
        return next((w for w in self.wheels if w.name == name and python in w.pythons), None)

    def versions(self) -> dict[str, str]:
        """project -> version, of every wheel."""
        return {w.name: w.version for w in self.wheels}

    def install_file(self, profile: str, python: str, fmt: str = "requirements") -> InstallFile | None:
        return next(
            (f for f in self.install or () if f.profile == profile and f.python == python and f.format == fmt), None
        )

    def listed(self) -> list[tuple[str, str]]:
        """(sha256, file) of every file SHA256SUMS lists, in its order: the wheels, then the install files."""
        return [(w.sha256, w.filename) for w in self.wheels] + [(f.sha256, f.file) for f in self.install or ()]

    def as_json(self) -> dict[str, Any]:
        out = _dump(self)
        assert isinstance(out, dict)
        return out

    @classmethod
    def from_json(cls, data: object, where: str = MANIFEST) -> Manifest:
        """Parsed and checked against the annotations; DistError names the member and what is wrong."""
        version = data.get("schema_version") if isinstance(data, dict) else None
        if isinstance(version, int) and version > SCHEMA_VERSION:
            raise DistError(
                f"{where}: schema_version {version} is newer than this kt-release reads "
                f"({SCHEMA_VERSION}); use the kt-release that built it"
            )
        parsed = _parse(cls, data, "")
        assert isinstance(parsed, Manifest)
        return parsed


# --- the annotations as a parser and as a JSON Schema -------------------------------------------------


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


class _Bad(ValueError):
    pass


def _parse(tp: Any, value: object, at: str) -> object:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if dataclasses.is_dataclass(tp):
        assert isinstance(tp, type)
        if not isinstance(value, dict):
            raise _Bad(f"{at or 'the manifest'}: not a JSON object")
        fields = {f.name: f for f in dataclasses.fields(tp)}
        unknown = sorted(set(value) - set(fields))
        if unknown:
            raise _Bad(f"{at or 'the manifest'}: unknown member {unknown[0]!r}")
        hints, kwargs = _hints(tp), {}
        for name, f in fields.items():
            here = f"{at}.{name}" if at else name
            if name not in value:
                if f.default is dataclasses.MISSING:
                    raise _Bad(f"{here}: missing")
                continue
            kwargs[name] = _parse(hints[name], value[name], here)
            _pattern(f.metadata.get("pattern", ""), kwargs[name], here)
        return tp(**kwargs)
    if origin in (types.UnionType, typing.Union):
        if value is None and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return _parse(inner, value, at)
    if origin is tuple:
        if not isinstance(value, list):
            raise _Bad(f"{at}: not a list")
        return tuple(_parse(args[0], v, f"{at}[{i}]") for i, v in enumerate(value))
    if origin is Literal:
        if value not in args or type(value) is not type(args[0]):
            raise _Bad(f"{at}: {value!r} is none of {', '.join(map(repr, args))}")
        return value
    if tp is bool and type(value) is not bool:
        raise _Bad(f"{at}: not true or false")
    if tp is int and (type(value) is not int or value < 0):
        raise _Bad(f"{at}: not a whole number >= 0")
    if tp is str and not isinstance(value, str):
        raise _Bad(f"{at}: not a string")
    return value


def _pattern(pattern: str, value: object, at: str) -> None:
    """A string field's (or every item of a list of strings') pattern."""
    items = value if isinstance(value, tuple) else (value,)
    for v in items:
        if pattern and isinstance(v, str) and not re.search(pattern, v):
            raise _Bad(f"{at}: {v[:80]!r} does not match {pattern}")


def _dump(value: object) -> object:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {
            f.name: _dump(getattr(value, f.name))
            for f in dataclasses.fields(value)
            if getattr(value, f.name) is not None
        }
    if isinstance(value, tuple):
        return [_dump(v) for v in value]
    return value


def _schema_of(tp: Any, defs: dict[str, Any], pattern: str = "") -> dict[str, Any]:  # noqa: PLR0911
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if dataclasses.is_dataclass(tp):
        assert isinstance(tp, type)
        if tp.__name__ not in defs:
            defs[tp.__name__] = {}  # placeholder: a dataclass that contains itself ends here
            hints, props, required = _hints(tp), {}, []
            for f in dataclasses.fields(tp):
                prop = _schema_of(hints[f.name], defs, f.metadata.get("pattern", ""))
                if f.metadata.get("doc"):
                    prop = {"description": f.metadata["doc"], **prop}
                props[f.name] = prop
                if f.default is dataclasses.MISSING:
                    required.append(f.name)
            defs[tp.__name__] = {
                "type": "object",
                "description": (tp.__doc__ or "").strip().splitlines()[0],
                "additionalProperties": False,
                "required": required,
                "properties": props,
            }
        return {"$ref": f"#/$defs/{tp.__name__}"}
    if origin in (types.UnionType, typing.Union):
        (inner,) = [a for a in args if a is not type(None)]
        return {"anyOf": [_schema_of(inner, defs, pattern), {"type": "null"}]}
    if origin is tuple:
        return {"type": "array", "items": _schema_of(args[0], defs, pattern)}
    if origin is Literal:
        return {"enum": list(args)}
    if tp is bool:
        return {"type": "boolean"}
    if tp is int:
        return {"type": "integer", "minimum": 0}
    return {"type": "string", **({"pattern": pattern} if pattern else {})}


def schema() -> dict[str, Any]:
    """The JSON Schema of manifest.json, generated from the annotations above (the one source)."""
    defs: dict[str, Any] = {}
    root = _schema_of(Manifest, defs)
    name = root["$ref"].rsplit("/", 1)[1]
    top = defs.pop(name)
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "https://kt-release.invalid/schemas/release-manifest.schema.json",
        "title": "KT release manifest (dist/manifest.json)",
        **top,
        "description": "Generated from base/distdir.py (python -m base.distdir --schema); do not edit by hand.",
        "$defs": dict(sorted(defs.items())),
    }


# --- SHA256SUMS and the release directory ------------------------------------------------------------

_SUMS_LINE = re.compile(r"^([0-9a-f]{64})  (\S(?:.*\S)?)$")
_VERIFIED: set[tuple[object, ...]] = set()  # releases whose files this process re-hashed (with their stats)


def _sums_text(path: Path) -> str:
    try:
        return path.read_text()
    except FileNotFoundError:
        raise DistError(f"{path} is missing; build the release first (nox -s build_all)") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise DistError(f"{path} is unreadable ({exc}); rebuild dist/ (nox -s build_all)") from None


def read_sums(path: Path, text: str | None = None) -> list[tuple[str, str]]:
    """SHA256SUMS (or its `text`) as (sha256, file) in its order; DistError for a missing file, a line that
    is not `<sha256>  <name>`, a name outside the directory, or a name listed twice."""
    text = _sums_text(path) if text is None else text
    out: list[tuple[str, str]] = []
    seen: set[str] = set()
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        m = _SUMS_LINE.match(line)
        name = m.group(2) if m else ""
        if m is None or name.startswith("/") or ".." in Path(name).parts or name in seen:
            why = "lists it twice" if name in seen else "is not '<sha256>  <file in this directory>'"
            raise DistError(f"{path}:{n}: {line[:100]!r} {why}; rebuild dist/ (nox -s build_all)")
        seen.add(name)
        out.append((m.group(1), name))
    return out


def manifest_sha256(path: Path) -> str:
    """manifest.json's digest without the release verdict (the release report writes it last, after every
    stage keyed the manifest); a file that is not a JSON object is hashed as it is."""
    data = path.read_bytes()
    try:
        parsed = json.loads(data)
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict):
        return hashlib.sha256(data).hexdigest()
    parsed.pop(VERDICT_MEMBER, None)
    return keys.value_sha256(["manifest without its verdict", parsed])  # its content, with the verdict or not


def read_manifest(path: Path) -> Manifest:
    """A manifest.json (dist/'s, or a previous release's), parsed and checked; DistError says what is wrong."""
    try:
        if path.stat().st_size > MAX_MANIFEST:
            raise DistError(f"{path}: over {MAX_MANIFEST >> 20} MiB, not a release manifest; rebuild dist/")
        data = json.loads(path.read_bytes())
    except FileNotFoundError:
        raise DistError(f"{path} is missing: {path.parent} holds no release; build it (nox -s build_all)") from None
    except OSError as exc:
        raise DistError(f"{path} is unreadable ({exc}); rebuild dist/ (nox -s build_all)") from None
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise DistError(f"{path}: not a release manifest (not JSON: {exc}); rebuild dist/ (nox -s build_all)") from None
    try:
        return Manifest.from_json(data, str(path))
    except _Bad as exc:
        raise DistError(f"{path}: not a release manifest ({exc}); rebuild dist/ (nox -s build_all)") from None


@dataclass(frozen=True)
class Release:
    """An opened release directory: SHA256SUMS and manifest.json, consistent with each other."""

    path: Path
    sums: tuple[tuple[str, str], ...]  # (sha256, file), SHA256SUMS's order
    manifest: Manifest
    sums_text: str  # for the key

    def wheels_for(self, python: str) -> list[Wheel]:
        return [w for w in self.manifest.wheels if python in w.pythons]

    def install_file(self, profile: str, python: str, fmt: str = "requirements") -> tuple[Path, str]:
        """The install file users get for `profile` on CPython `python`, and its sha256 (as SHA256SUMS has it)."""
        entry = self.manifest.install_file(profile, python, fmt)
        if entry is None:
            raise DistError(
                f"{self.path / MANIFEST} lists no {profile} install file ({fmt}) for CPython {python}; "
                "rebuild the release (nox -s build_all)"
            )
        return self.path / entry.file, entry.sha256

    def key(self) -> str:
        """The key of exactly what the stages read from dist/: SHA256SUMS (after re-hashing what it lists)
        and manifest.json without the verdict."""
        try:
            manifest = manifest_sha256(self.path / MANIFEST)
        except OSError:
            raise DistError(f"{self.path / MANIFEST} is missing; rebuild dist/ (nox -s build_all)") from None
        return hashlib.sha256(self.sums_text.encode() + b"\0" + manifest.encode()).hexdigest()


def open_release(dist: Path, *, rehash: bool = True) -> Release:
    """dist/ opened: SHA256SUMS and manifest.json read and checked against each other (the same files,
    the same digests); with `rehash`, every listed file re-hashed, at most once per process while the
    files are unchanged. DistError names the file that is missing or differs, and the fix."""
    manifest = read_manifest(dist / MANIFEST)
    sums_path = dist / SUMS
    text = _sums_text(sums_path)
    sums = read_sums(sums_path, text)
    recorded = manifest.listed()
    if sorted(recorded) != sorted(sums):
        odd = sorted({n for _, n in recorded} ^ {n for _, n in sums}) or sorted(
            n for d, n in recorded if (d, n) not in set(sums)
        )
        raise DistError(
            f"{sums_path} and {dist / MANIFEST} list other files or digests ({', '.join(odd[:5])}); "
            "rebuild dist/ (nox -s build_all)"
        )
    release = Release(dist, tuple(sums), manifest, text)
    if rehash:
        _rehash(release)
    return release


def _rehash(release: Release) -> None:
    dist = release.path
    try:
        stats = tuple((st.st_size, st.st_mtime_ns, st.st_ino) for _, n in release.sums for st in [(dist / n).stat()])
    except OSError:
        gone = next(n for _, n in release.sums if not (dist / n).is_file())
        raise DistError(
            f"{dist / gone}: listed in SHA256SUMS but unreadable; rebuild dist/ (nox -s build_all)"
        ) from None
    memo = (str(dist.resolve()), release.sums, stats)
    if memo in _VERIFIED:
        return
    for digest, name in release.sums:
        actual = keys.file_sha256(dist / name)
        if actual != digest:
            raise DistError(
                f"{dist / name}: sha256 {actual[:16]} differs from SHA256SUMS ({digest[:16]}); "
                "rebuild dist/ (nox -s build_all)"
            )
    _VERIFIED.add(memo)


def key(dist: Path) -> str:
    """Release.key of dist/ (opened and re-hashed); DistError if anything is missing or differs."""
    return open_release(dist).key()


def outputs(dist: Path) -> list[Path]:
    """What the assembly wrote: every file SHA256SUMS lists, SHA256SUMS and manifest.json."""
    return [dist / n for _, n in read_sums(dist / SUMS)] + [dist / SUMS, dist / MANIFEST]


def install_name(profile: str, python: str, fmt: str = "requirements") -> str:
    """install/PROFILE-cp3NN.txt (pip) or install/pylock.PROFILE-cp3NN.toml (PEP 751), relative to dist/."""
    stem = f"{profile}-{python_tag(python)}"
    return f"{INSTALL_DIR}/{stem}.txt" if fmt == "requirements" else f"{INSTALL_DIR}/pylock.{stem}.toml"


def manifest_text(manifest: Manifest) -> str:
    return json.dumps(manifest.as_json(), indent=2, sort_keys=True) + "\n"


def write(staging: Path, manifest: Manifest) -> None:
    """SHA256SUMS and manifest.json into the assembly's staging directory (swapped in whole after)."""
    (staging / SUMS).write_text("".join(f"{digest}  {name}\n" for digest, name in manifest.listed()))
    (staging / MANIFEST).write_text(manifest_text(manifest))


def record_verdict(dist: Path, verdict: Mapping[str, Any]) -> None:
    """The verdict into manifest.json's `release` member, every other member as it was; written whole
    (a temporary file, renamed)."""
    path = dist / MANIFEST
    manifest = read_manifest(path)
    try:
        judged = _parse(Verdict, dict(verdict), VERDICT_MEMBER)
    except _Bad as exc:
        raise DistError(f"{path}: the verdict is not a release verdict ({exc}); nothing was written") from None
    assert isinstance(judged, Verdict)
    tmp = swap.part(path)
    tmp.write_text(manifest_text(dataclasses.replace(manifest, release=judged)))
    tmp.replace(path)


def schema_text() -> str:
    return json.dumps(schema(), indent=2) + "\n"


def main(argv: Iterable[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args != ["--schema"]:
        print("usage: python -m base.distdir --schema   (the manifest's JSON Schema, on stdout)", file=sys.stderr)
        return 2
    sys.stdout.write(schema_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
