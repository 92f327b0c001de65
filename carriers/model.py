"""Carrier definitions: carriers.toml -> frozen dataclasses, validated on load."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import tomllib
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.utils import canonicalize_name

from audits.readers import hint, unknown_keys
from base import version as _version
from base.paths import VERSION_FILE
from base.version import python_key

from .errors import DefinitionError

DEFINITIONS = Path(__file__).resolve().parent / "carriers.toml"
Kind = Literal["native", "umbrella", "fork", "repack"]
# Every key of carriers.toml and its value's type: the schema is their one owner.
SCHEMA_FILE = Path(__file__).resolve().parent / "schemas" / "carriers.schema.json"
SCHEMA: dict[str, Any] = json.loads(SCHEMA_FILE.read_text())
KINDS: tuple[str, ...] = tuple(SCHEMA["$defs"]["carrier"]["properties"]["kind"]["enum"])
# `payload = "manifest"`: this fork provides the package the lazy CUDA archive serves and holds
# its manifest; `payload_part = N`: this carrier's wheel holds part N of the archive.
PAYLOAD_ROLES = {"manifest"}
# The folder of a part carrier's import package that holds its payload part (the packer writes it,
# the release report reads it; the audit's own copy is pinned by tests/unit/test_one_owner.py).
PART_DIR = "_kt_payload"
# `dist_alias = true`: this fork ships carriers/alias/ (a .pth and its module), by which every renamed
# distribution answers importlib.metadata lookups by its upstream name. One fork hosts it: the one
# every environment holding a renamed distribution has (transformers-kt).
ALIAS_DIR = Path(__file__).resolve().parent / "alias"
_VERSION_RULES = {"native": {"kt"}, "umbrella": {"kt"}, "fork": {"kt", "post"}, "repack": {"upstream"}}


@dataclass(frozen=True)
class Source:
    """A carrier input built from a pinned source tree (git URL and commit) instead of a wheel."""

    git: str
    commit: str


@dataclass(frozen=True)
class Carrier:
    """One release wheel as carriers.toml defines it: kind, upstream, version rule, patches, payload part."""

    name: str
    kind: Kind
    version_rule: str
    upstream: str = ""
    post: int = 0
    summary: str = ""
    license: str = ""  # SPDX expression (PEP 639) for a fork or repack whose upstream declares none
    requires: tuple[str, ...] = ()
    requires_python: str = ""
    extras: tuple[tuple[str, tuple[str, ...]], ...] = ()
    source: Source | None = None
    patches: tuple[Path, ...] = field(default=())
    payload_part: int = 0  # 1-based position of the archive part this wheel carries; 0: none
    payload_manifest: bool = False
    dist_alias: bool = False
    # Forks whose upstream bounds exclude the release's versions (carriers.toml says why, per key):
    pin_forks: bool = False  # every requirement on a replaced upstream -> its carrier, pinned exactly
    requires_edit: tuple[tuple[str, str], ...] = ()  # (requirement name, new specifier), marker kept
    requires_extra: tuple[tuple[str, tuple[str, ...]], ...] = ()  # (extra, requirement names moved to it)
    # Third-party requirements the upstream omits, pinned at the one version the release's other inputs pin
    # (transform.release_pins): sgl-deep-gemm's extension is built against one torch but does not say so.
    requires_pinned: tuple[str, ...] = ()
    retag: bool = False  # the wheel takes the most portable tag its ELF files allow (transform.honest_tags)

    @property
    def import_package(self) -> str:
        """The import package the wheel installs (parts ride inside it): kt-kernel -> kt_kernel."""
        return canonicalize_name(self.upstream or self.name).replace("-", "_")


# The release's keys above the carrier tables (carriers.toml's top level).
RELEASE_KEYS = set(SCHEMA["properties"])  # the release-wide keys beside the carrier tables


@dataclass(frozen=True)
class CarrierSet:
    """Every carrier of the release, the KT version they share and the CPython versions the release
    supports (`pythons`, the one owner of the release's Python matrix)."""

    carriers: tuple[Carrier, ...]
    kt_version: str
    pythons: tuple[str, ...] = ("3.11",)

    def __getitem__(self, name: str) -> Carrier:
        for c in self.carriers:
            if c.name == name:
                return c
        raise KeyError(name)

    @property
    def part_carriers(self) -> tuple[Carrier, ...]:
        """The carriers that hold a part of the lazy CUDA archive, in part order."""
        return tuple(sorted((c for c in self.carriers if c.payload_part), key=lambda c: c.payload_part))

    @property
    def payload_provider(self) -> Carrier | None:
        """The carrier that holds the archive's manifest (and the package it serves)."""
        return next((c for c in self.carriers if c.payload_manifest), None)

    def by_upstream(self) -> dict[str, str]:
        """upstream project name -> the carrier that replaces it."""
        return {c.upstream: c.name for c in self.carriers if c.upstream}


def kt_version(path: Path = VERSION_FILE) -> str:
    """The KT release version (base.version reads kernel/python/kt_kernel/_version.py)."""
    try:
        return _version.kt_version(path)
    except _version.VersionFileError as exc:
        raise DefinitionError(str(exc)) from None


def _unknown_keys(errors: list[Any], path: Path, name: str, kind: str) -> None:
    """The first key of carrier `name` (or of a table in it) that the schema does not name, with the
    closest one it does."""
    for where, key, known in unknown_keys(errors):
        if where and where[0] == name:
            inner = "".join(f"{x}." for x in where[1:])
            raise DefinitionError(f"{path}: [{name}] unknown key {inner}{key!r} for a {kind}{hint(key, known)}")


def load(path: Path = DEFINITIONS, patches_dir: Path | None = None, version: str | None = None) -> CarrierSet:
    """Read and validate carriers.toml; DefinitionError naming the key and the fix."""
    patches_dir = patches_dir or path.parent / "patches"
    try:
        data: dict[str, Any] = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise DefinitionError(f"{path}: cannot read carrier definitions: {exc}") from exc
    import jsonschema

    schema_errors = list(jsonschema.Draft202012Validator(SCHEMA).iter_errors(data))
    pythons = _pythons(data, path)
    data = {k: v for k, v in data.items() if k not in RELEASE_KEYS}
    carriers = []
    names = set(data)
    for name, spec in data.items():
        if not isinstance(spec, dict):
            raise DefinitionError(
                f"{path}: {name} = {spec!r} is neither a carrier table nor a release key{hint(name, RELEASE_KEYS)}"
            )
        if canonicalize_name(name) != name:
            raise DefinitionError(
                f"{path}: [{name}] is not a normalized distribution name; use [{canonicalize_name(name)}]"
            )
        kind = spec.get("kind")
        if kind not in KINDS:
            raise DefinitionError(f"{path}: [{name}] kind {kind!r} must be one of {sorted(KINDS)}")
        _unknown_keys(schema_errors, path, name, kind)
        rule = spec.get("version", "")
        if rule not in _VERSION_RULES[kind]:
            raise DefinitionError(f"{path}: [{name}] version = {rule!r}; a {kind} takes {sorted(_VERSION_RULES[kind])}")
        if rule == "post" and int(spec.get("post", 0)) < 1:
            raise DefinitionError(f"{path}: [{name}] version = 'post' needs post = N (N >= 1)")
        for dep in [*spec.get("requires", []), *(d for ds in spec.get("extras", {}).values() for d in ds)]:
            if not isinstance(dep, str):
                raise DefinitionError(f"{path}: [{name}] requires/extras take carrier names, not {dep!r}")
            if dep not in names:
                raise DefinitionError(f"{path}: [{name}] pins {dep!r}, which is not a carrier{hint(dep, names)}")
        pinned = spec.get("requires_pinned", [])
        for dep in pinned:
            if not isinstance(dep, str) or canonicalize_name(dep) != dep:
                raise DefinitionError(
                    f"{path}: [{name}] requires_pinned takes normalized distribution names, not {dep!r}"
                )
            if dep in names:
                raise DefinitionError(
                    f"{path}: [{name}] requires_pinned names the carrier {dep!r}; a carrier goes in requires"
                )
        source = None
        if "source" in spec:
            src = spec["source"]
            if set(src) != {"git", "commit"} or not re.fullmatch(r"[0-9a-f]{40}", str(src.get("commit", ""))):
                raise DefinitionError(f"{path}: [{name}] source needs git = URL and commit = a full 40-hex SHA")
            source = Source(str(src["git"]), str(src["commit"]))
        pdir = patches_dir / name
        patches = tuple(sorted(pdir.glob("*.patch"))) if pdir.is_dir() else ()
        if patches and kind != "fork":
            raise DefinitionError(f"{pdir}: only forks take patches; a {kind} ships upstream files unchanged")
        part = spec.get("payload_part", 0)
        if isinstance(part, bool) or not isinstance(part, int) or part < (1 if "payload_part" in spec else 0):
            raise DefinitionError(f"{path}: [{name}] payload_part = {part!r}; it takes the part's position, 1..N")
        role = spec.get("payload")
        if role is not None and role not in PAYLOAD_ROLES:
            raise DefinitionError(f"{path}: [{name}] payload = {role!r}; it takes {sorted(PAYLOAD_ROLES)}")
        carriers.append(
            Carrier(
                name=name,
                kind=kind,
                version_rule=rule,
                upstream=spec.get("upstream", ""),
                post=int(spec.get("post", 0)),
                summary=spec.get("summary", ""),
                license=_license(spec, path, name),
                requires=tuple(spec.get("requires", [])),
                requires_python=spec.get("requires_python", ""),
                extras=tuple((k, tuple(v)) for k, v in sorted(spec.get("extras", {}).items())),
                source=source,
                patches=patches,
                payload_part=part,
                payload_manifest=role == "manifest",
                dist_alias=_flag(spec, "dist_alias", path, name),
                pin_forks=_flag(spec, "pin_forks", path, name),
                requires_edit=_edits(spec, path, name),
                requires_extra=_moved(spec, path, name),
                requires_pinned=tuple(pinned),
                retag=_flag(spec, "retag", path, name),
            )
        )
    rest = [e for e in schema_errors if e.validator != "additionalProperties"]
    if rest:
        shown = "\n  ".join(f"{'.'.join(map(str, e.absolute_path)) or '(top)'}: {e.message}" for e in rest[:5])
        raise DefinitionError(f"{path}: does not match {SCHEMA_FILE.name}:\n  {shown}")
    cs = CarrierSet(tuple(carriers), version or kt_version(), pythons)
    _check_payload(cs, path)
    hosts = [c.name for c in cs.carriers if c.dist_alias]
    if len(hosts) > 1:
        raise DefinitionError(f"{path}: {hosts} all set dist_alias = true; one fork ships the alias")
    return cs


def _pythons(data: dict[str, Any], path: Path) -> tuple[str, ...]:
    """`pythons = ["3.11", "3.12", ...]`: CPython versions, ascending, each once."""
    raw = data.get("pythons", ["3.11"])
    if not isinstance(raw, list) or not raw or not all(isinstance(v, str) for v in raw):
        raise DefinitionError(f'{path}: pythons = {raw!r}; it takes a list of CPython versions: ["3.11", "3.12"]')
    bad = [v for v in raw if not re.fullmatch(r"3\.\d{1,2}", v)]
    if bad:
        raise DefinitionError(f'{path}: pythons holds {bad}; each entry is a CPython "3.N" version')
    ordered = sorted(set(raw), key=python_key)
    if ordered != raw:
        raise DefinitionError(f"{path}: pythons = {raw}; list each version once, ascending: {ordered}")
    return tuple(raw)


def _license(spec: dict[str, Any], path: Path, name: str) -> str:
    """`license = "SPDX"`, in its canonical spelling (carriers/licensing.py states it in the wheel)."""
    if "license" not in spec:
        return ""
    from packaging.licenses import InvalidLicenseExpression, canonicalize_license_expression

    try:
        return str(canonicalize_license_expression(str(spec["license"])))
    except InvalidLicenseExpression:
        raise DefinitionError(
            f"{path}: [{name}] license = {spec['license']!r} is not an SPDX license expression; "
            'write one such as "Apache-2.0" or "MIT OR Apache-2.0" (https://spdx.org/licenses/)'
        ) from None


def _flag(spec: dict[str, Any], key: str, path: Path, name: str) -> bool:
    value = spec.get(key, False)
    if not isinstance(value, bool):
        raise DefinitionError(f"{path}: [{name}] {key} = {value!r}; it takes true or false")
    return value


def _edits(spec: dict[str, Any], path: Path, name: str) -> tuple[tuple[str, str], ...]:
    """requires_edit = { NAME = "SPECIFIER" }: a valid PEP 440 specifier per normalized name."""
    edits = spec.get("requires_edit", {})
    if not isinstance(edits, dict):
        raise DefinitionError(f'{path}: [{name}] requires_edit takes a table: {{ datasets = ">=2.16" }}')
    out = []
    for dep, new in sorted(edits.items()):
        if canonicalize_name(dep) != dep:
            raise DefinitionError(f"{path}: [{name}] requires_edit key {dep!r}: use {canonicalize_name(dep)!r}")
        try:
            SpecifierSet(new)
        except (InvalidSpecifier, TypeError):
            raise DefinitionError(
                f'{path}: [{name}] requires_edit {dep} = {new!r} is not a version specifier (e.g. ">=2.16")'
            ) from None
        out.append((dep, str(new)))
    return tuple(out)


def _moved(spec: dict[str, Any], path: Path, name: str) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """requires_extra = { EXTRA = [NAME, ...] }: names moved behind an extra, each once."""
    table = spec.get("requires_extra", {})
    if not isinstance(table, dict) or not all(isinstance(v, list) for v in table.values()):
        raise DefinitionError(f'{path}: [{name}] requires_extra takes a table of lists: {{ multimodal = ["av"] }}')
    seen: set[str] = set()
    for extra, deps in table.items():
        for dep in deps:
            if not isinstance(dep, str) or canonicalize_name(dep) != dep:
                raise DefinitionError(f"{path}: [{name}] requires_extra.{extra}: {dep!r} is not a normalized name")
            if dep in seen:
                raise DefinitionError(f"{path}: [{name}] requires_extra names {dep!r} twice")
            seen.add(dep)
    clash = seen & {d for d, _ in _edits(spec, path, name)}
    if clash:
        raise DefinitionError(f"{path}: [{name}] {sorted(clash)} both edited and moved to an extra; do one")
    return tuple((extra, tuple(deps)) for extra, deps in sorted(table.items()))


def _check_payload(cs: CarrierSet, path: Path) -> None:
    """Parts are numbered 1..N once each, and exactly one carrier holds the manifest when any part exists."""
    numbers = [c.payload_part for c in cs.part_carriers]
    if numbers != list(range(1, len(numbers) + 1)):
        raise DefinitionError(
            f"{path}: payload_part values {numbers} must number the parts 1..{len(numbers)} once each"
        )
    providers = [c.name for c in cs.carriers if c.payload_manifest]
    if len(providers) > 1:
        raise DefinitionError(f"{path}: {providers} all set payload = 'manifest'; one carrier holds the manifest")
    if numbers and not providers:
        raise DefinitionError(
            f"{path}: carriers hold archive parts but none sets payload = 'manifest'; mark the "
            "fork that provides sgl_kernel"
        )
    if providers and not numbers:
        raise DefinitionError(f"{path}: [{providers[0]}] holds a payload manifest but no carrier sets payload_part")
