"""A CycloneDX SBOM in every wheel the release writes (PEP 770: ``<dist-info>/sboms/kt-release.cdx.json``),
written with cyclonedx-python-lib: the distribution itself, the upstream wheel it derives from (purl,
version, the input's sha256), each patch applied (its sha256), each library auditwheel grafted into
``<package>.libs/``, a library linked statically into the wheel's binaries (the CUDA runtime, as the kernel
build recorded it in _build.json), and for a part carrier its part of the lazy CUDA archive; the payload's
provider lists every archived file with its sha256 and the distribution it was taken from.

It claims only what it checked: a grafted library is said to be a Debian package's file only when its bytes
are that file's (their md5 is the one dpkg's md5sums record for the path the package installs); auditwheel
rewrites what it grafts (patchelf), so a graft normally carries no such claim, never a guess by file name.

Deterministic: no serial number, the release's date as its timestamp (SOURCE_DATE_EPOCH where set, else
_version.py's __release_date__, as the zip entries), sorted components; nothing in it differs between a clone
and a source archive of one commit.
"""

from __future__ import annotations

import datetime
import functools
import os
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from cyclonedx.model import HashAlgorithm, HashType, Property
from cyclonedx.model.bom import Bom
from cyclonedx.model.component import Component, ComponentType
from cyclonedx.model.license import LicenseExpression
from cyclonedx.output.json import JsonV1Dot6
from packageurl import PackageURL

from . import licensing

MEMBER = "sboms/kt-release.cdx.json"  # under the wheel's .dist-info/
_MIN_EPOCH = 315532800  # zip timestamps start in 1980; so does the SBOM's


@dataclass(frozen=True)
class Upstream:
    """The input wheel a fork or repack derives from."""

    name: str
    version: str
    filename: str
    sha256: str


@dataclass(frozen=True)
class Part:
    """A part of the lazy CUDA archive a carrier ships."""

    member: str
    index: int
    count: int
    size: int
    sha256: str


@dataclass(frozen=True)
class Static:
    """A library linked statically into the wheel's binaries (no file of its own in the wheel)."""

    library: str
    version: str
    source: str  # "pypi:<distribution>" when it came from that PyPI wheel, else where
    linked_into: tuple[str, ...]


@dataclass
class Provenance:
    """Everything one wheel's SBOM says besides the distribution itself."""

    upstream: Upstream | None = None
    patches: Sequence[tuple[str, str]] = ()  # (file name, sha256)
    grafted: Sequence[tuple[str, str, str]] = ()  # (member, sha256, md5) under <package>.libs/
    static: Sequence[Static] = ()
    part: Part | None = None
    archive: Mapping[str, Mapping[str, object]] = field(default_factory=dict)  # path -> {sha256, size, origin}


def _sha(digest: str) -> list[HashType]:
    return [HashType(alg=HashAlgorithm.SHA_256, content=digest)]


def _pypi(name: str, version: str) -> PackageURL:
    return PackageURL(type="pypi", name=name.lower().replace("_", "-"), version=version)


DPKG_INFO = Path("/var/lib/dpkg/info")


@functools.cache
def _dpkg_owner(name: str) -> tuple[str, str, str] | None:
    """(package, version, path) of the file of this name dpkg installed on this host, if one package does."""
    try:
        found = subprocess.run(["dpkg", "-S", f"*/{name}"], capture_output=True, text=True, check=False, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    rows = [ln.split(": ", 1) for ln in found.stdout.splitlines() if ": " in ln]
    if found.returncode != 0 or len(rows) != 1 or "," in rows[0][0]:
        return None  # none, or several packages: nothing to claim
    package, path = rows[0][0].strip(), rows[0][1].strip()
    version = subprocess.run(
        ["dpkg-query", "-W", "-f=${Version}", package], capture_output=True, text=True, check=False, timeout=20
    )
    return (package, version.stdout.strip() if version.returncode == 0 else "", path)


def _dpkg_md5(package: str, path: str) -> str | None:
    """The md5 dpkg's md5sums records for `path` of `package` (None: not recorded)."""
    base = package.split(":", 1)[0]
    for info in sorted(DPKG_INFO.glob(f"{base}*.md5sums")):
        if info.name not in (f"{base}.md5sums", f"{package}.md5sums") and not info.name.startswith(f"{base}:"):
            continue
        for line in info.read_text(errors="replace").splitlines():
            digest, _, rel = line.partition("  ")
            if "/" + rel.strip() == path:
                return digest.strip()
    return None


def _grafted_origin(member: str, md5: str) -> str | None:
    """`package version` when the grafted bytes are verifiably that Debian package's file (dpkg's md5sums);
    auditwheel names a grafted library <stem>-<8 hex>.so.N, the host's file is <stem>.so.N."""
    base = member.rsplit("/", 1)[-1]
    stem, dot, rest = base.partition(".so")
    host = stem.rsplit("-", 1)[0] + dot + rest if "-" in stem else base
    owner = _dpkg_owner(host)
    if owner is None:
        return None
    package, version, path = owner
    if _dpkg_md5(package, path) != md5:
        return None  # the bytes are not the package's file (auditwheel patched them): no claim
    return f"{package} {version}".strip()


def _epoch() -> int:
    """The release's timestamp: SOURCE_DATE_EPOCH where set, else midnight UTC of _version.py's release date."""
    if os.environ.get("SOURCE_DATE_EPOCH"):
        return max(int(os.environ["SOURCE_DATE_EPOCH"]), _MIN_EPOCH)
    from base.version import release_date

    day = release_date()
    return int(datetime.datetime(day.year, day.month, day.day, tzinfo=datetime.UTC).timestamp())


def document(name: str, version: str, kt_version: str, prov: Provenance, license: str | None = None) -> bytes:
    """The SBOM of one wheel, as deterministic CycloneDX 1.6 JSON bytes; `license`: the wheel's
    License-Expression, if it states one."""
    epoch = _epoch()
    bom = Bom()
    bom.serial_number = None  # type: ignore[assignment]  # a serial would differ between two identical builds
    bom.metadata.timestamp = datetime.datetime.fromtimestamp(epoch, tz=datetime.UTC)
    purl = _pypi(name, version)
    root = Component(
        name=name,
        version=version,
        type=ComponentType.LIBRARY,
        purl=purl,
        bom_ref=str(purl),
        licenses=[LicenseExpression(license)] if license else None,
    )
    bom.metadata.component = root
    bom.metadata.tools.components.add(Component(name="kt-release", version=kt_version, type=ComponentType.APPLICATION))
    parts: list[Component] = []
    if prov.upstream is not None:
        up = _pypi(prov.upstream.name, prov.upstream.version)
        parts.append(
            Component(
                name=prov.upstream.name,
                version=prov.upstream.version,
                type=ComponentType.LIBRARY,
                purl=up,
                bom_ref=str(up),
                hashes=_sha(prov.upstream.sha256),
                properties=[Property(name="kt:input-wheel", value=prov.upstream.filename)],
            )
        )
    for file, digest in prov.patches:
        parts.append(
            Component(
                name=file,
                type=ComponentType.FILE,
                bom_ref=f"patch:{file}",
                hashes=_sha(digest),
                properties=[Property(name="kt:role", value="patch applied to the upstream")],
            )
        )
    for member, digest, md5 in prov.grafted:
        props = [Property(name="kt:role", value="library grafted by auditwheel")]
        origin = _grafted_origin(member, md5)
        if origin:
            props.append(Property(name="kt:build-host-package", value=origin))
            props.append(Property(name="kt:verified", value="its bytes are the package's file (dpkg md5sums)"))
        parts.append(
            Component(
                name=member, type=ComponentType.FILE, bom_ref=f"file:{member}", hashes=_sha(digest), properties=props
            )
        )
    for lib in prov.static:
        ref = _pypi(lib.source[5:], lib.version) if lib.source.startswith("pypi:") else None
        parts.append(
            Component(
                name=lib.library,
                version=lib.version,
                type=ComponentType.LIBRARY,
                purl=ref,
                bom_ref=f"static:{lib.library}",
                properties=[
                    Property(name="kt:role", value="library linked statically"),
                    Property(name="kt:source", value=lib.source),
                    *(Property(name="kt:linked-into", value=m) for m in lib.linked_into),
                ],
            )
        )
    if prov.part is not None:
        p = prov.part
        parts.append(
            Component(
                name=p.member,
                type=ComponentType.FILE,
                bom_ref=f"part:{p.index}",
                hashes=_sha(p.sha256),
                properties=[
                    Property(name="kt:role", value=f"part {p.index} of {p.count} of the lazy CUDA archive"),
                    Property(name="kt:size", value=str(p.size)),
                ],
            )
        )
    for path, info in sorted(prov.archive.items()):
        parts.append(
            Component(
                name=path,
                type=ComponentType.FILE,
                bom_ref=f"archived:{path}",
                hashes=_sha(str(info["sha256"])),
                properties=[
                    Property(name="kt:role", value="file of the lazy CUDA archive"),
                    Property(name="kt:origin", value=str(info["origin"])),
                    Property(name="kt:size", value=str(info["size"])),
                ],
            )
        )
    for c in parts:
        bom.components.add(c)
    bom.register_dependency(root, parts)
    return (JsonV1Dot6(bom).output_as_string(indent=1) + "\n").encode()


def grafted(members: Mapping[str, bytes]) -> list[tuple[str, str, str]]:
    """(member, sha256, md5) of every library under a top-level <package>.libs/ folder (auditwheel's grafts)."""
    import hashlib

    return [
        (n, hashlib.sha256(d).hexdigest(), hashlib.md5(d, usedforsecurity=False).hexdigest())
        for n, d in sorted(members.items())
        if n.split("/", 1)[0].endswith(".libs") and ".so" in n.rsplit("/", 1)[-1]
    ]


def static(members: Mapping[str, bytes]) -> list[Static]:
    """The statically linked libraries a top-level package's _build.json records (kt-kernel: the CUDA runtime
    its CUDA libraries link; cuda.runtime), with the files that link it."""
    import json

    out = []
    for name, data in sorted(members.items()):
        if name.count("/") != 1 or not name.endswith("/_build.json"):
            continue
        try:
            cuda = json.loads(data).get("cuda") or {}
        except (ValueError, AttributeError):
            continue
        runtime = cuda.get("runtime") if isinstance(cuda, dict) else None
        if isinstance(runtime, dict):
            files = tuple(sorted(str(f) for f in cuda.get("files") or {}))
            out.append(Static(str(runtime["library"]), str(runtime["version"]), str(runtime["source"]), files))
    return out


def add(members: dict[str, bytes], di: str, name: str, version: str, kt_version: str, prov: Provenance) -> None:
    """Put (or replace) the wheel's SBOM among its members (with the License-Expression its METADATA states)."""
    license = licensing.declared(members[f"{di}/METADATA"].decode("utf-8"))
    members[f"{di}/{MEMBER}"] = document(name, version, kt_version, prov, license)
