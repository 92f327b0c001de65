"""Licenses a wheel states and ships (PEP 639), checked, never trusted:

- ``license.undeclared``: no ``License-Expression`` (an error for the release's wheels: every carrier and
  repack states its license; the third-party policy says info, since most wheels predate PEP 639);
- ``license.invalid``: a ``License-Expression`` that is not SPDX, a license header under a
  Metadata-Version older than 2.4, a ``License-File`` that climbs out or names no file under
  ``.dist-info/licenses/``;
- ``license.unlicensed-binary``: a wheel that bundles compiled code (ELF files, a part of the lazy CUDA
  archive, the archive's manifest) but ships no license file; a library grafted into
  ``<package>.libs/`` without a license file of its own (``licenses/<package>.libs/<library>...``); the
  payload's provider without the license files of a distribution its archived files came from
  (``licenses/payload/<distribution>/``, by the origin its SBOM gives each file).

Pure: facts in, findings out.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from packaging.licenses import InvalidLicenseExpression, canonicalize_license_expression
from packaging.metadata import parse_email
from packaging.utils import canonicalize_name

from ..model import Finding
from ..readers._wheel import WheelFacts
from ._common import finding

FIX = "state it in the build (project.license, PEP 639) and ship the license texts under .dist-info/licenses/"
LICENSES = "licenses"  # under .dist-info (PEP 639); the carriers' copy is pinned by tests/unit/test_one_owner.py
PAYLOAD_DIR = "payload"
_LEGACY = ("LICEN", "COPYING", "NOTICE", "AUTHORS")  # license files a pre-PEP 639 wheel keeps at the root


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.strip().split(".") if x.isdigit())


def license_files(w: WheelFacts) -> list[str]:
    """The wheel's license files: everything under .dist-info/licenses/, and a pre-2.4 wheel's
    LICENSE/COPYING/NOTICE/AUTHORS files at the .dist-info root."""
    prefix = f"{w.dist_info}/"
    out = []
    for m in w.members:
        if not m.name.startswith(prefix):
            continue
        rest = m.name[len(prefix) :]
        if rest.startswith(f"{LICENSES}/") or ("/" not in rest and rest.upper().startswith(_LEGACY)):
            out.append(rest)
    return out


def _metadata(w: WheelFacts) -> tuple[dict[str, Any], dict[str, list[str]]] | None:
    """METADATA's fields as packaging parses them, and what it could not (None: no METADATA)."""
    text = w.text(f"{w.dist_info}/METADATA")
    if text is None:
        return None
    raw, unparsed = parse_email(text)
    return dict(raw), unparsed


def _expression(fields: dict[str, Any], unparsed: dict[str, list[str]]) -> str | None:
    value = fields.get("license_expression") or unparsed.get("license-expression")
    value = value[0] if isinstance(value, list) and value else value
    return str(value) if value else None


def expression(w: WheelFacts) -> str | None:
    """The License-Expression a wheel's METADATA states, as written (None: none, or no METADATA)."""
    parsed = _metadata(w)
    return _expression(*parsed) if parsed is not None else None


def _listed(w: WheelFacts, listed: list[Any], present: set[str], metadata_version: str, pep639: bool) -> list[Finding]:
    """Each License-File by the rule of the wheel's own Metadata-Version: from 2.4 (PEP 639) a path under
    .dist-info/licenses/; before it, setuptools' convention, the file in .dist-info/ itself (or, from newer
    setuptools, under licenses/ there)."""
    prefix = f"{w.dist_info}/"
    in_dist_info = {m.name[len(prefix) :] for m in w.members if m.name.startswith(prefix)}
    where = ".dist-info/licenses/" if pep639 else f".dist-info/ (where Metadata-Version {metadata_version} puts it)"
    out = []
    for value in listed:
        name = str(value)
        climbs = name.startswith("/") or "\\" in name or ".." in name.split("/")
        found = f"{LICENSES}/{name}" in present if pep639 else {name, f"{LICENSES}/{name}"} & in_dist_info
        if climbs or not found:
            why = f"climbs out of {where}" if climbs else f"names no file under {where}"
            out.append(
                finding(
                    "license.invalid",
                    w.filename,
                    f"{w.dist_info}/METADATA",
                    f"License-File {name!r} {why}" + (" (PEP 639)" if pep639 else ""),
                    f"ship the file under {where.split(' ', 1)[0]} by that relative path, or drop the header",
                )
            )
    return out


def declared(w: WheelFacts, origins: Iterable[str] = ()) -> list[Finding]:
    """The license findings of one wheel; `origins`: the distributions its SBOM says archived payload
    files came from (the provider only)."""
    member = f"{w.dist_info}/METADATA"
    parsed = _metadata(w)
    if parsed is None:
        return []  # wheel.metadata reports a missing METADATA
    fields, unparsed = parsed
    stated = _expression(fields, unparsed)
    listed = fields.get("license_files") or unparsed.get("license-file") or []
    fn = w.filename
    out: list[Finding] = []
    if stated is None:
        legacy = str(fields.get("license") or "").strip().splitlines()
        said = f" (its free-text License header says {legacy[0][:60]!r})" if legacy else ""
        out.append(finding("license.undeclared", fn, member, f"{w.name} states no License-Expression{said}", FIX))
    else:
        try:
            canonicalize_license_expression(stated)
        except InvalidLicenseExpression as exc:
            out.append(
                finding(
                    "license.invalid",
                    fn,
                    member,
                    f"License-Expression {stated!r} is not an SPDX expression ({exc})",
                    "write an SPDX license expression (https://spdx.org/licenses/), e.g. Apache-2.0",
                )
            )
    metadata_version = str(fields.get("metadata_version", ""))
    pep639 = _version(metadata_version) >= (2, 4)
    if stated is not None and not pep639:
        out.append(
            finding(
                "license.invalid",
                fn,
                member,
                f"License-Expression under Metadata-Version {metadata_version}: it means something only from 2.4 "
                "(PEP 639), and older readers ignore it",
                "write Metadata-Version: 2.4 (any PEP 639 build backend does)",
            )
        )
    present = set(license_files(w))
    out += _listed(w, listed if isinstance(listed, list) else [listed], present, metadata_version, pep639)
    out += _unlicensed(w, present, origins)
    return out


def _unlicensed(w: WheelFacts, present: set[str], origins: Iterable[str]) -> list[Finding]:
    fn = w.filename
    binaries = sorted({*w.elfs, *(m.name for m in w.members if "/_kt_payload/" in m.name)})
    if binaries and not present:
        return [
            finding(
                "license.unlicensed-binary",
                fn,
                binaries[0],
                f"{w.name} bundles {len(binaries)} compiled file(s) ({binaries[0]}, ...) and ships no license file",
                FIX,
            )
        ]
    out = []
    for lib in binaries:
        top, _, base = lib.partition("/")
        if not top.endswith(".libs") or "/" in base:
            continue
        stem = base.split(".so", 1)[0].rsplit("-", 1)[0]  # auditwheel's libfoo-<8 hex>.so.N: libfoo
        if not any(p.startswith(f"{LICENSES}/{top}/{stem}") for p in present):
            out.append(
                finding(
                    "license.unlicensed-binary",
                    fn,
                    lib,
                    f"a library grafted into {top}/ ships no license file of its own "
                    f"(.dist-info/{LICENSES}/{top}/{stem}...): whoever redistributes it cannot say under which terms",
                    "ship the library's license (its distribution's copyright file) under "
                    f".dist-info/{LICENSES}/{top}/{stem}/",
                )
            )
    for dist in sorted({canonicalize_name(o) for o in origins if o}):
        if not any(p.startswith(f"{LICENSES}/{PAYLOAD_DIR}/{dist}/") for p in present):
            out.append(
                finding(
                    "license.unlicensed-binary",
                    fn,
                    f"{w.dist_info}/{LICENSES}/{PAYLOAD_DIR}/{dist}/",
                    f"the lazy CUDA archive holds files taken from {dist}, and its provider ships no license file "
                    "of that distribution",
                    "assemble the release with its carriers (carriers/licensing.py copies each origin's licenses)",
                )
            )
    return out


def archived_origins(w: WheelFacts, documents: list[str], problems: dict[str, str]) -> set[str]:
    """The distributions a wheel's SBOM says its archived payload files came from (`kt:origin`: the
    distribution's name first)."""
    out = set()
    for member in documents:
        if member in problems:
            continue  # sbom.invalid reports it
        try:
            doc = json.loads(w.text(member) or "{}")
        except (ValueError, RecursionError):
            continue
        for c in doc.get("components", []) if isinstance(doc, dict) else []:
            if not isinstance(c, dict):
                continue
            for p in c.get("properties", []) or []:
                if isinstance(p, dict) and p.get("name") == "kt:origin" and str(p.get("value", "")).strip():
                    out.add(str(p["value"]).split()[0])
    return out
