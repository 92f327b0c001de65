"""The SBOM a wheel ships (PEP 770: ``.dist-info/sboms/*.cdx.json``, CycloneDX), checked, never trusted:

- ``sbom.missing``: no SBOM at all (an error for the release's wheels; the third-party policy says info);
- ``sbom.invalid``: not JSON, not CycloneDX, or not valid against CycloneDX's own JSON schema (the
  CycloneDX library's validator);
- ``sbom.mismatch``: it describes another distribution or version, or leaves out what the wheel holds:
  the upstream a renamed fork records in ``kt_upstream.json``, a payload part (by sha256), a library grafted
  into ``<package>.libs/`` (by sha256), an archived payload file the manifest lists (with its origin); or,
  for a release directory, an input wheel or patch its manifest.json records (by sha256).

Pure: facts in, findings out.
"""

from __future__ import annotations

import json
from typing import Any

from packaging.utils import canonicalize_name

from ..model import Finding
from ..readers._wheel import WheelFacts
from ._common import finding

FIX = "assemble it with the release's carriers (carriers/sbom.py writes the SBOM of every wheel)"


def missing(wheel: str, dist: str) -> Finding:
    """A wheel of a KT release without an SBOM (the release-level rule: only a release is held to it)."""
    return finding(
        "sbom.missing",
        wheel,
        "",
        f"{dist} ships no SBOM (.dist-info/sboms/*.cdx.json, PEP 770): nothing in it says where its bytes came from",
        FIX,
    )


def _hashes(c: dict[str, Any]) -> set[str]:
    return {h.get("content", "") for h in c.get("hashes", []) if h.get("alg") == "SHA-256"}


def _props(c: dict[str, Any]) -> dict[str, str]:
    return {p.get("name", ""): p.get("value", "") for p in c.get("properties", [])}


def sbom(
    w: WheelFacts, documents: list[str], problems: dict[str, str], payload_manifest: str | None, upstream: str | None
) -> list[Finding]:
    """The findings of one wheel's SBOM(s): `documents` its SBOM members, `problems` those that are not
    valid CycloneDX (the reader's schema check), `payload_manifest` the payload manifest member's name
    (the policy's), `upstream` the wheel's kt_upstream.json text, if any."""
    if not documents:
        return []  # whether it must have one is the release's question (missing)
    out = [finding("sbom.invalid", w.filename, m, problem, FIX) for m, problem in sorted(problems.items())]
    components: list[dict[str, Any]] = []
    repaired = False
    for member in documents:
        if member in problems:
            continue
        doc = json.loads(w.text(member) or "{}")
        repaired = repaired or _by_auditwheel(doc)
        root = (doc.get("metadata") or {}).get("component") or {}
        if canonicalize_name(str(root.get("name", ""))) != w.name or str(root.get("version")) != str(w.version):
            out.append(
                finding(
                    "sbom.mismatch",
                    w.filename,
                    member,
                    f"the SBOM describes {root.get('name')} {root.get('version')}, the wheel is {w.name} {w.version}",
                    FIX,
                )
            )
        components += [c for c in doc.get("components", []) if isinstance(c, dict)]
    if out:
        return out
    return _coverage(w, components, payload_manifest, upstream, documents[0], grafts=not repaired)


def _by_auditwheel(doc: dict[str, Any]) -> bool:
    """Whether `auditwheel repair` wrote the SBOM (its metadata names the tool: a list in CycloneDX 1.4,
    {"components": [...]} from 1.5). Such an SBOM records the system package each grafted library came
    from, with the hash of the library as that package installed it: auditwheel renames and patches
    the copy it grafts, so the wheel's bytes are never the recorded ones, and a library no package
    provided (built by the project) is not listed at all."""
    tools = (doc.get("metadata") or {}).get("tools") or []
    if isinstance(tools, dict):
        tools = tools.get("components") or []
    return any(isinstance(t, dict) and t.get("name") == "auditwheel" for t in tools)


def _coverage(
    w: WheelFacts,
    components: list[dict[str, Any]],
    payload_manifest: str | None,
    upstream: str | None,
    member: str,
    grafts: bool = True,
) -> list[Finding]:
    """What the wheel holds that its SBOM must list (`grafts`: the .libs/ libraries by their sha256, unless
    auditwheel's SBOM records where they came from instead)."""
    out = []
    purls = {str(c.get("purl", "")) for c in components}
    files = {str(c.get("name", "")): c for c in components if c.get("type") == "file"}
    if upstream:
        try:
            up = json.loads(upstream)
            purl = f"pkg:pypi/{canonicalize_name(up['name'])}@{up['version']}"
        except (ValueError, KeyError, TypeError, RecursionError):
            purl = ""  # dist.upstream-record reports an unreadable record
        if purl and purl not in purls:
            out.append(
                finding(
                    "sbom.mismatch",
                    w.filename,
                    member,
                    f"the wheel derives from {purl} (kt_upstream.json), its SBOM does not list it",
                    FIX,
                )
            )
    for m in w.members:
        top = m.name.split("/", 1)[0]
        grafted = grafts and top.endswith(".libs") and ".so" in m.name.rsplit("/", 1)[-1]
        part = "/_kt_payload/" in m.name
        if (grafted or part) and m.sha256 not in _hashes(files.get(m.name, {})):
            what = "a library grafted into .libs/" if grafted else "a part of the lazy CUDA archive"
            out.append(
                finding(
                    "sbom.mismatch",
                    w.filename,
                    m.name,
                    f"{what} is not in the SBOM with its sha256 ({m.sha256[:16]})",
                    FIX,
                )
            )
    manifest = w.text(payload_manifest) if payload_manifest else None
    if manifest:
        try:
            archived = json.loads(manifest).get("files", {})
        except (ValueError, AttributeError, RecursionError):
            archived = {}  # payload.manifest reports an unreadable manifest
        for path, info in sorted(archived.items()) if isinstance(archived, dict) else []:
            c = files.get(path, {})
            if str(info.get("sha256")) not in _hashes(c) or not _props(c).get("kt:origin"):
                out.append(
                    finding(
                        "sbom.mismatch",
                        w.filename,
                        path,
                        "an archived payload file is not in the provider's SBOM with its sha256 and origin",
                        FIX,
                    )
                )
    return out


def inputs(manifest: dict[str, Any] | None, problem: str, hashes: dict[str, frozenset[str]]) -> list[Finding]:
    """The release manifest (dist/manifest.json) against the SBOMs: every input wheel and patch it records
    for a wheel must be in that wheel's SBOM with the same sha256. `hashes`: wheel filename -> every sha256
    its SBOM lists (wheels with an SBOM only: sbom.missing speaks for the others)."""
    where = "manifest.json"
    if manifest is None:
        return [
            finding(
                "sbom.mismatch",
                where,
                "",
                f"the release manifest cannot be read ({problem}): the SBOMs' inputs cannot be checked against it",
                "rebuild the release (nox -s build_all writes dist/manifest.json)",
            )
        ]
    out = []
    wheels = manifest.get("wheels", [])
    for entry in wheels if isinstance(wheels, list) else []:
        if not isinstance(entry, dict) or str(entry.get("filename")) not in hashes:
            continue
        listed = hashes[str(entry["filename"])]
        records = [("input", i, "filename") for i in entry.get("inputs") or []]
        records += [("patch", p, "file") for p in entry.get("patches") or []]
        for kind, rec, label in records:
            digest = str(rec.get("sha256", "")) if isinstance(rec, dict) else ""
            if digest not in listed:
                name = rec.get(label, "?") if isinstance(rec, dict) else "?"
                out.append(
                    finding(
                        "sbom.mismatch",
                        str(entry["filename"]),
                        "",
                        f"the release manifest records {kind} {name} (sha256 {digest[:16]}) for this wheel; "
                        "its SBOM does not list that hash",
                        FIX,
                    )
                )
    return out
