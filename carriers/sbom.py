"""A CycloneDX SBOM in every wheel the release writes (PEP 770: ``<dist-info>/sboms/kt-release.cdx.json``),
written with cyclonedx-python-lib: the distribution itself, the upstream wheel it derives from (purl,
version, the input's sha256), each patch applied (its sha256), each library auditwheel grafted into
``<package>.libs/`` (and, where this build host's dpkg can say, the Debian package it came from), and for a
part carrier its part of the lazy CUDA archive; the payload's provider lists every archived file with
its sha256 and the distribution it was taken from.

Deterministic: no serial number, the release's timestamp (SOURCE_DATE_EPOCH, as the zip entries), sorted
components; nothing in it differs between a clone and a source archive of one commit.
"""

from __future__ import annotations

import datetime
import functools
import os
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

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


@dataclass
class Provenance:
    """Everything one wheel's SBOM says besides the distribution itself."""

    upstream: Upstream | None = None
    patches: Sequence[tuple[str, str]] = ()  # (file name, sha256)
    grafted: Sequence[tuple[str, str]] = ()  # (member, sha256) under <package>.libs/
    part: Part | None = None
    archive: Mapping[str, Mapping[str, object]] = field(default_factory=dict)  # path -> {sha256, size, origin}


def _sha(digest: str) -> list[HashType]:
    return [HashType(alg=HashAlgorithm.SHA_256, content=digest)]


def _pypi(name: str, version: str) -> PackageURL:
    return PackageURL(type="pypi", name=name.lower().replace("_", "-"), version=version)


@functools.cache
def _debian_source(soname: str) -> str | None:
    """The Debian package (and version) that ships a library of this name on the build host, if dpkg knows."""
    try:
        found = subprocess.run(["dpkg", "-S", f"*/{soname}"], capture_output=True, text=True, check=False, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if found.returncode != 0 or ":" not in found.stdout:
        return None
    package = found.stdout.split(":", 1)[0].strip()
    version = subprocess.run(
        ["dpkg-query", "-W", "-f=${Version}", package], capture_output=True, text=True, check=False, timeout=20
    )
    return f"{package} {version.stdout.strip()}" if version.returncode == 0 else package


def _grafted_origin(member: str) -> str | None:
    """auditwheel names a grafted library <stem>-<8 hex>.so.N; the host library is <stem>.so.N."""
    base = member.rsplit("/", 1)[-1]
    stem, dot, rest = base.partition(".so")
    host = stem.rsplit("-", 1)[0] + dot + rest if "-" in stem else base
    return _debian_source(host)


def document(name: str, version: str, kt_version: str, prov: Provenance, license: str | None = None) -> bytes:
    """The SBOM of one wheel, as deterministic CycloneDX 1.6 JSON bytes; `license`: the wheel's
    License-Expression, if it states one."""
    epoch = max(int(os.environ.get("SOURCE_DATE_EPOCH", _MIN_EPOCH)), _MIN_EPOCH)
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
    for member, digest in prov.grafted:
        props = [Property(name="kt:role", value="library grafted by auditwheel")]
        origin = _grafted_origin(member)
        if origin:
            props.append(Property(name="kt:build-host-package", value=origin))
        parts.append(
            Component(
                name=member, type=ComponentType.FILE, bom_ref=f"file:{member}", hashes=_sha(digest), properties=props
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


def grafted(members: Mapping[str, bytes]) -> list[tuple[str, str]]:
    """(member, sha256) of every library under a top-level <package>.libs/ folder (auditwheel's grafts)."""
    import hashlib

    return [
        (n, hashlib.sha256(d).hexdigest())
        for n, d in sorted(members.items())
        if n.split("/", 1)[0].endswith(".libs") and ".so" in n.rsplit("/", 1)[-1]
    ]


def add(members: dict[str, bytes], di: str, name: str, version: str, kt_version: str, prov: Provenance) -> None:
    """Put (or replace) the wheel's SBOM among its members (with the License-Expression its METADATA states)."""
    license = licensing.declared(members[f"{di}/METADATA"].decode("utf-8"))
    members[f"{di}/{MEMBER}"] = document(name, version, kt_version, prov, license)
