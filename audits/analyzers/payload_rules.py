"""Rule 9: the release's lazy CUDA archive across wheels - the parts against the
manifest (present, once, in order, same release, same bytes), the archive and
every file in it against the manifest, the carriers' tags and the install
closure, the archived ELF files like wheel members, and which binary runs on
each advertised compute capability. Pure: facts in, findings out."""

from __future__ import annotations

import posixpath
import re
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from ..model import Finding
from ..policy import Policy
from ..readers._payload import PART_DIR, ArchiveFacts, WheelSummary
from . import cuda_rules, elf_rules
from ._common import finding

_FIX_REBUILD = "rebuild the release with nox -s build_all (carriers/payload.py writes parts and manifest together)"
_ARCH = re.compile(r"(?:sm|compute)_(\d+)(\d)([af]?)$")


def _cc(arch: str) -> tuple[int, int, str] | None:
    m = _ARCH.match(arch)
    return (int(m.group(1)), int(m.group(2)), m.group(3)) if m else None


def runs_on(cc: str, sass: frozenset[str], ptx: frozenset[str]) -> str | None:
    """Which code of a binary runs on compute capability `cc` ("8.9"), by the driver's rules:
    SASS sm_XY runs on X.Z for Z >= Y (same major); an arch-specific sm_XYa only on X.Y itself;
    PTX compute_XY is JIT-compiled for any X.Y or newer (compute_XYa only for X.Y). None: nothing."""
    major, minor = (int(x) for x in cc.split("."))
    exact = [a for a in sass if (p := _cc(a)) and p[2] == "a" and p[:2] == (major, minor)]
    if exact:
        return f"{sorted(exact)[0]} SASS"
    same = sorted((p[1], a) for a in sass if (p := _cc(a)) and p[2] != "a" and p[0] == major and p[1] <= minor)
    if same:
        return f"{same[-1][1]} SASS"
    jit = sorted(
        ((p[0], p[1]), a)
        for a in ptx
        if (p := _cc(a)) and ((p[2] == "a" and p[:2] == (major, minor)) or (p[2] != "a" and p[:2] <= (major, minor)))
    )
    return f"{jit[-1][1]} PTX (JIT)" if jit else None


def _requirements(lines: tuple[str, ...]) -> list[Requirement]:
    """The Requires-Dist lines that parse (wheel.requires-dist reports the others)."""
    out = []
    for line in lines:
        try:
            out.append(Requirement(line))
        except InvalidRequirement:
            continue
    return out


def _reach(wheels: dict[str, WheelSummary], root: str) -> set[str]:
    todo: list[str] = [canonicalize_name(root)]
    seen: set[str] = set()
    while todo:
        name = todo.pop()
        if name in seen or name not in wheels:
            continue
        seen.add(name)
        for req in _requirements(wheels[name].requires):
            if req.marker is None or "extra" not in str(req.marker):
                todo.append(canonicalize_name(req.name))
    return seen


def _parts_and_manifest(
    provider: WheelSummary, m: dict[str, Any], groups: dict[str, list[WheelSummary]]
) -> list[Finding]:
    """Every wheel of a part's distribution (one per Python of the matrix for kt-kernel) carries
    exactly that part."""
    out: list[Finding] = []
    pf = provider.filename
    parts: list[dict[str, Any]] = m.get("parts", [])
    indices = [p.get("index") for p in parts]
    if indices != list(range(1, len(parts) + 1)):
        out.append(
            finding(
                "payload.part-order",
                pf,
                "",
                f"the manifest lists parts {indices}; they must be 1..N "
                "in order (the archive is their concatenation in that order)",
                _FIX_REBUILD,
            )
        )
    seen_members: dict[tuple[str, str], int] = {}
    for p in parts:
        key = (canonicalize_name(str(p.get("distribution", ""))), str(p.get("member", "")))
        if key in seen_members:
            out.append(
                finding(
                    "payload.part-duplicate",
                    pf,
                    key[1],
                    f"parts {seen_members[key]} and {p.get('index')} are both {key[0]}'s {key[1]}",
                    _FIX_REBUILD,
                )
            )
        seen_members[key] = int(p.get("index", 0) or 0)
        label = f"part {p.get('index')} ({key[0]} {p.get('version')}, {key[1]})"
        if not groups.get(key[0]):
            out.append(
                finding(
                    "payload.part-missing",
                    pf,
                    key[1],
                    f"{label}: no {key[0]} wheel is in the release",
                    f"build and ship {key[0]} with the release",
                )
            )
            continue
        for w in groups[key[0]]:
            out += _part_in(w, p, key[1], label, m)
    for ws in groups.values():
        for w in ws:
            for pm in w.parts:
                if (canonicalize_name(w.name), pm.name) not in seen_members:
                    out.append(
                        finding(
                            "payload.part-duplicate",
                            w.filename,
                            pm.name,
                            "an archive part the manifest does not list: a leftover or a second copy",
                            _FIX_REBUILD,
                        )
                    )
    return out


def _part_in(w: WheelSummary, p: dict[str, Any], member: str, label: str, m: dict[str, Any]) -> list[Finding]:
    """One wheel of the part's distribution against the manifest's entry for the part."""
    out: list[Finding] = []
    name = canonicalize_name(w.name)
    if w.version != str(p.get("version")):
        out.append(
            finding(
                "payload.part-version",
                w.filename,
                member,
                f"{label}: the manifest is release {m.get('release')} and wants {name} {p.get('version')}, the "
                f"release has {w.version}: parts from two releases",
                _FIX_REBUILD,
            )
        )
    pm = {x.name: x for x in w.parts}.get(member)
    if pm is None:
        return [
            *out,
            finding("payload.part-missing", w.filename, member, f"{label}: the wheel does not carry it", _FIX_REBUILD),
        ]
    if pm.size != p.get("size") or pm.sha256 != p.get("sha256"):
        out.append(
            finding(
                "payload.part-mismatch",
                w.filename,
                member,
                f"{label} is {pm.size} bytes, sha256 {pm.sha256}; the manifest says {p.get('size')} bytes, "
                f"{p.get('sha256')}",
                _FIX_REBUILD,
            )
        )
    return out


def _carriers(provider: WheelSummary, m: dict[str, Any], groups: dict[str, list[WheelSummary]]) -> list[Finding]:
    out: list[Finding] = []
    wheels = {n: ws[0] for n, ws in groups.items()}
    carriers = [canonicalize_name(str(p.get("distribution", ""))) for p in m.get("parts", [])]
    for w in (w for name in dict.fromkeys([*carriers, canonicalize_name(provider.name)]) for w in groups.get(name, [])):
        if any(t.endswith("-any") for t in w.tags):
            out.append(
                finding(
                    "payload.carrier-any",
                    w.filename,
                    "",
                    f"{w.name} carries the CUDA payload (a part or "
                    f"its manifest) but is tagged {', '.join(w.tags)}: an `any` wheel must not carry "
                    "Linux ELF payload",
                    "tag it for the archive's platform (carriers/payload.py retags part carriers)",
                )
            )
    need = set(carriers)
    users = [n for n in wheels if canonicalize_name(provider.name) in _reach(wheels, n)]
    for user in sorted(users):
        missing = sorted(need - _reach(wheels, user))
        if missing:
            out.append(
                finding(
                    "payload.closure",
                    wheels[user].filename,
                    "",
                    f"installing {user} pulls "
                    f"{provider.name} (it can import the archived binaries) but not the part "
                    f"carrier(s) {missing}: the payload cannot be materialized",
                    f"make {provider.name} require every part carrier at its exact version",
                )
            )
    return out


def _archive(provider: WheelSummary, m: dict[str, Any], a: ArchiveFacts, policy: Policy) -> list[Finding]:
    out: list[Finding] = []
    pf = provider.filename
    meta = m.get("archive", {})
    if a.size != meta.get("size") or a.sha256 != meta.get("sha256"):
        out.append(
            finding(
                "payload.archive-mismatch",
                pf,
                "",
                f"the parts concatenate to {a.size} bytes, sha256 "
                f"{a.sha256}; the manifest says {meta.get('size')} bytes, {meta.get('sha256')}",
                _FIX_REBUILD,
            )
        )
    window, allowed = meta.get("window_log", 0), policy.payload.zstd_window_log if policy.payload else 0
    if window > allowed:
        out.append(
            finding(
                "payload.archive-mismatch",
                pf,
                "",
                f"window_log {window}: decompressing needs a {2**window / 2**20:.0f} MiB window, over the policy's "
                f"window_log {allowed}; kt_kernel.payload refuses it",
                "pack with the policy's [payload] zstd_window_log (carriers/payload.py reads it)",
            )
        )
    if a.error:
        out.append(
            finding(
                "payload.archive-mismatch", pf, "", f"the archive does not decompress/untar: {a.error}", _FIX_REBUILD
            )
        )
    claimed: dict[str, Any] = m.get("files", {})
    seen: set[str] = set()
    for f in a.files:
        norm = posixpath.normpath(f.path)  # as kt_kernel.payload names the file it writes
        if f.path.startswith("/") or ".." in f.path.split("/"):
            out.append(
                finding(
                    "payload.unsafe-member",
                    pf,
                    f"payload!{f.path}",
                    f"{f.path!r} escapes the archive root",
                    "pack the archive with carriers/payload.py only",
                )
            )
            continue
        if f.kind in ("link", "special"):
            out.append(
                finding(
                    "payload.unsafe-member",
                    pf,
                    f"payload!{f.path}",
                    f"{f.path!r} is a {f.kind}" + (f" to {f.linkname!r}" if f.linkname else ""),
                    "the archive holds regular files only; kt_kernel.payload refuses the rest",
                )
            )
            continue
        if f.kind != "file":
            continue
        if norm in seen:
            out.append(
                finding(
                    "payload.file-mismatch",
                    pf,
                    f"payload!{norm}",
                    "appears twice in the archive: kt_kernel.payload refuses the archive",
                    _FIX_REBUILD,
                )
            )
            continue
        seen.add(norm)
        c = claimed.get(norm)
        if c is None:
            out.append(
                finding(
                    "payload.file-mismatch",
                    pf,
                    f"payload!{norm}",
                    "in the archive but not in the manifest",
                    _FIX_REBUILD,
                )
            )
            continue
        # One finding per defective file: bytes that differ from the manifest make its other claims moot.
        if c.get("size") != f.size or c.get("sha256") != f.sha256:
            out.append(
                finding(
                    "payload.file-mismatch",
                    pf,
                    f"payload!{norm}",
                    f"{f.size} bytes, sha256 {f.sha256}; the manifest says {c.get('size')} bytes, {c.get('sha256')}",
                    _FIX_REBUILD,
                )
            )
            continue
        if f.cuda_error:
            out.append(
                finding(
                    "cuda.fatbin-unreadable",
                    pf,
                    f"payload!{norm}",
                    f"cuobjdump cannot read it: {f.cuda_error}",
                    "rebuild the library; check it with cuobjdump --list-elf",
                )
            )
        elif (
            a.cuda_inspected
            and f.elf is not None
            and (set(c.get("sass", [])) != f.sass or set(c.get("ptx", [])) != f.ptx)
        ):
            out.append(
                finding(
                    "payload.file-mismatch",
                    pf,
                    f"payload!{norm}",
                    f"holds SASS {sorted(f.sass)} + PTX "
                    f"{sorted(f.ptx)}; the manifest claims {c.get('sass')} + {c.get('ptx')}",
                    _FIX_REBUILD,
                )
            )
    # After a stream error the rest of the files were never read: that is the archive's finding, not theirs.
    for name in [] if a.error else sorted(set(claimed) - seen):
        out.append(
            finding(
                "payload.file-mismatch", pf, f"payload!{name}", "in the manifest but not in the archive", _FIX_REBUILD
            )
        )
    return out


def coverage(pf: str, a: ArchiveFacts, policy: Policy) -> tuple[list[Finding], dict[str, dict[str, str | None]]]:
    """Per archived CUDA binary and advertised compute capability: what runs there."""
    assert policy.payload is not None
    out: list[Finding] = []
    matrix: dict[str, dict[str, str | None]] = {}
    for f in a.files:
        if f.elf is None or not (f.sass or f.ptx):
            continue
        need, reason = policy.payload.targets_for(f.path)
        row = {cc: runs_on(cc, f.sass, f.ptx) for cc in policy.payload.targets}
        matrix[f.path] = row
        for cc, what in row.items():
            if what is not None:
                continue
            if cc in need:
                out.append(
                    finding(
                        "payload.sass-coverage",
                        pf,
                        f"payload!{f.path}",
                        f"nothing runs on compute "
                        f"capability {cc}: SASS {sorted(f.sass)}, PTX {sorted(f.ptx) or 'none'}",
                        "build it for that architecture, or narrow its targets in [[payload.coverage]] with the reason",
                    )
                )
            else:
                out.append(
                    finding(
                        "payload.sass-coverage",
                        pf,
                        f"payload!{f.path}",
                        f"not for compute capability {cc}, by policy: {reason}",
                        "none needed",
                        severity="info",
                    )
                )
    return out, matrix


def analyze(
    summaries: list[WheelSummary], archive: ArchiveFacts | None, policy: Policy, system: frozenset[str]
) -> tuple[list[Finding], dict[str, Any]]:
    """Every payload rule over the release. `archive` is None when the parts could not be streamed."""
    if policy.payload is None:
        return [], {}
    groups: dict[str, list[WheelSummary]] = {}
    for w in summaries:  # kt-kernel: one wheel per Python of the matrix
        groups.setdefault(canonicalize_name(w.name), []).append(w)
    providers = [w for w in summaries if w.manifest is not None or w.manifest_error]
    carrying = [w for w in summaries if w.parts]
    if not providers:
        return [
            finding(
                "payload.manifest",
                w.filename,
                w.parts[0].name,
                "carries a CUDA archive part but no wheel "
                f"of the release holds the manifest ({policy.payload.manifest_member})",
                _FIX_REBUILD,
            )
            for w in carrying
        ], {}
    out: list[Finding] = []
    if len(providers) > 1:
        out.append(
            finding(
                "payload.manifest",
                providers[1].filename,
                policy.payload.manifest_member,
                f"a second manifest (also in {providers[0].filename})",
                _FIX_REBUILD,
            )
        )
    provider = providers[0]
    if provider.manifest is None:
        return [
            finding(
                "payload.manifest",
                provider.filename,
                policy.payload.manifest_member,
                f"unreadable manifest: {provider.manifest_error}",
                _FIX_REBUILD,
            )
        ], {}
    m = provider.manifest
    out += _parts_and_manifest(provider, m, groups)
    out += _carriers(provider, m, groups)
    section: dict[str, Any] = {
        "manifest": f"{provider.filename}!{policy.payload.manifest_member}",
        "archive_bytes": m.get("archive", {}).get("size"),
        "parts": [{k: p.get(k) for k in ("index", "distribution", "version", "size")} for p in m.get("parts", [])],
    }
    if archive is None:
        out.append(
            finding(
                "payload.archive-mismatch",
                provider.filename,
                "",
                "the archive was not inspected: a part is missing (see payload.part-missing)",
                _FIX_REBUILD,
            )
        )
        return out, section
    out += _archive(provider, m, archive, policy)
    elfs = [f.elf for f in archive.files if f.elf is not None]
    for f in archive.files:
        if f.elf_error:
            out.append(
                finding("wheel.unreadable", provider.filename, f"payload!{f.path}", f.elf_error, "rebuild the library")
            )
    out += elf_rules.elf_abi(provider.filename, provider.name, elfs, policy)
    requires = {canonicalize_name(r.name) for r in _requirements(provider.requires)}
    external = [p for p in policy.external if p.provider in requires]
    out += elf_rules.rpath(
        provider.filename, elfs, [f.path for f in archive.files], system, external, policy.always_external
    )
    if archive.cuda_inspected:
        root = policy.payload.kt_cuda_root + "/"
        kt = {f.path[len(root) :]: (f.size, f.cuda) for f in archive.files if f.path.startswith(root) and f.cuda}
        lib_findings, section["kt_libraries"] = cuda_rules.check_libraries(
            provider.filename, f"payload!{root}", dict(kt), policy
        )
        out += lib_findings
        cov, matrix = coverage(provider.filename, archive, policy)
        out += cov
        section["coverage"] = matrix
    else:
        out.append(
            finding(
                "cuda.tool-missing",
                provider.filename,
                "",
                "cuobjdump not found: the archive's SASS/PTX were not checked",
                "install nvidia-cuda-cuobjdump (lockfiles/audit.txt) or set KT_CUOBJDUMP",
            )
        )
    section["files"] = {
        f.path: {"bytes": f.size, "sass": sorted(f.sass), "ptx": sorted(f.ptx)}
        for f in archive.files
        if f.kind == "file"
    }
    return out, section


__all__ = ["PART_DIR", "analyze", "coverage", "runs_on"]
