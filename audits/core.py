"""Run every analyzer over one wheel or many: read -> analyze."""

from __future__ import annotations

import fnmatch
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from packaging.utils import InvalidWheelFilename, parse_wheel_filename

from . import manylinux, platforms
from .analyzers import (
    cuda_rules,
    dist_rules,
    elf_rules,
    install_rules,
    isa_rules,
    license_rules,
    link_rules,
    manifest_rules,
    payload_rules,
    sbom_rules,
    size_rules,
    wheel_rules,
)
from .analyzers._common import finding
from .analyzers.manifest_rules import MANIFEST
from .errors import AuditError
from .model import Finding
from .policy import ExternalProvider, Policy
from .readers import ElfFacts, FeatureUse, WheelFacts, read_wheel
from .readers import _sbom as sbom_reader
from .readers._cuda import KernelPayload, cuobjdump_tool, find_cuobjdump, read_kernel_payload
from .readers._install import read_install_files
from .readers._json import RELEASE_MANIFEST as RELEASE_MANIFEST_SCHEMA
from .readers._json import SIZE_BASELINE, load
from .readers._payload import ArchiveFacts, WheelSummary, read_archive, summarize
from .readers._wheel import ReadOptions, file_digest

SCHEMA_VERSION = 1


@dataclass
class WheelResult:
    """One wheel's audit: its findings and the report sections it contributes."""

    wheel: str
    sha256: str
    size: int
    findings: list[Finding] = field(default_factory=list)
    cpu: dict[str, Any] = field(default_factory=dict)
    cuda: dict[str, Any] = field(default_factory=dict)
    sizes: dict[str, Any] = field(default_factory=dict)
    platform: str | None = None  # the most portable manylinux tag the ELF files allow
    platform_reason: str = ""  # what keeps a more portable tag out
    summary: WheelSummary | None = None  # what the release-level payload rules need
    installed: tuple[str, ...] = ()  # member paths, for the release-level collision rule
    names: dist_rules.DistNames | None = None  # for the release-level distribution-name rule
    has_sbom: bool = False  # for the release-level SBOM rule (sbom.missing)
    sbom_components: int | None = None  # how many components its SBOM lists (None: no valid SBOM)
    sbom_hashes: frozenset[str] = frozenset()  # every sha256 its SBOM lists: the release manifest's inputs
    license: str | None = None  # its License-Expression
    links: list[dict[str, Any]] = field(default_factory=list)  # per link scope: what each ELF file bound
    glibc: tuple[str, str] | None = None  # the newest GLIBC_ version any ELF file needs, and that ELF file


def read_options(policy: Policy, dist_name: str = "", tags: frozenset[str] = frozenset()) -> ReadOptions:
    """What the reader must keep of a wheel for the policy's rules (never whole members
    otherwise): the manifests' bytes, the code of the CPU variants and loaders, exports where
    the export rule applies, and cuobjdump for any embedded CUDA code."""
    keep = {policy.cuda_payload_member, MANIFEST} | ({policy.payload.manifest_member} if policy.payload else set())
    code = {v.member for v in policy.variants}

    def wants_code(name: str) -> bool:
        return name in code or any(fnmatch.fnmatch(name, p) for p in policy.loader_members)

    return ReadOptions(
        limits=policy.limits,
        keep=keep.__contains__,
        code=wants_code,
        exports=dist_name in policy.exports_applies_to,
        cuobjdump=find_cuobjdump(),
        forbidden=platforms.forbidden_symbols(),
        # a wheel for baseline x86-64 (no _v2.._v4 tag): its libraries' code is sampled for what they run
        isa_budget=policy.library_sample_bytes if _baseline_x86_64(tags) else 0,
        isa_budget_wheel=policy.wheel_sample_bytes if _baseline_x86_64(tags) else 0,
        isa_baseline=policy.baseline,
    )


def _baseline_x86_64(tags: frozenset[str]) -> bool:
    return any(platforms.family_of(t) in ("manylinux", "musllinux") and t.endswith("_x86_64") for t in tags)


@dataclass(frozen=True)
class WheelContext:
    """Every fact the wheel analyzers read, collected (all I/O, disassembly and cuobjdump) before
    any analyzer runs; the analyzers are pure functions of it and the policy."""

    w: WheelFacts
    elfs: tuple[ElfFacts, ...]
    tree: tuple[str, ...]  # member paths: where the ELF files live
    system: frozenset[str]  # the claimed tag's system libraries
    external: tuple[ExternalProvider, ...]  # providers the wheel requires whose libraries live outside it
    chains: elf_rules.Chains  # elf_rules.load_chains: where each need resolves, what nothing loads
    uses: dict[str, dict[str, FeatureUse]]  # feature use of the CPU variants and loaders
    kernel_payload: KernelPayload | None  # kt-kernel's own CUDA archive
    baseline: dict[str, Any] | None
    target: platforms.Target | None  # the libc family and architecture the verdict is computed for
    untargeted: str  # why no target (no ELF of a known architecture, a non-Linux platform), or ""
    sboms: tuple[list[str], dict[str, str]] = ([], {})  # the SBOM members, and why any is not valid CycloneDX


def read_context(path: Path, policy: Policy, baseline: dict[str, Any] | None) -> WheelContext:
    """Read one wheel for the analyzers (raises AuditError if it is not a readable wheel)."""
    dist_name, plat_tags = "", frozenset[str]()
    try:
        name, _, _, wheel_tags = parse_wheel_filename(path.name)
        dist_name, plat_tags = str(name), frozenset(t.platform for t in wheel_tags)
    except InvalidWheelFilename:
        pass
    opts = read_options(policy, dist_name, plat_tags)
    w = read_wheel(path, opts)
    elfs = tuple(w.elfs.values())
    tree = tuple(m.name for m in w.members)
    required = wheel_rules.required_names(w)
    payload_member = w.member(policy.cuda_payload_member) if policy.cuda_payload_member else None
    kp = None
    if payload_member is not None:
        kp = read_kernel_payload(
            payload_member.name,
            payload_member.data or b"",
            payload_member.sha256,
            opts.cuobjdump,
            [lib.member for lib in policy.cuda_libraries],
            policy.limits.memory_max_bytes,
        )
    plats = [t.platform for t in w.tags]
    target, untargeted = platforms.target(plats, list(elfs))
    return WheelContext(
        w=w,
        elfs=elfs,
        tree=tree,
        system=platforms.system_libraries(target, plats),
        external=tuple(p for p in policy.external if p.provider in required),
        chains=elf_rules.load_chains(list(elfs), tree),
        uses=isa_rules.disassembled_members(w.elfs, policy),
        kernel_payload=kp,
        baseline=baseline,
        target=target,
        untargeted=untargeted,
        sboms=(sbom_reader.documents(w), sbom_reader.schema_problems(w)),
    )


Result = tuple[list[Finding], dict[str, Any]]  # findings, and the report section they describe ({} if none)
Analyzer = Callable[[WheelContext, Policy], Result]


def _only(fn: Callable[[WheelContext, Policy], list[Finding]]) -> Analyzer:
    """A rule that only finds (no report section of its own)."""
    return lambda c, p: (fn(c, p), {})


# Every per-wheel rule, in report order: pure functions of the facts and the policy, each run once;
# isa, cuda, cuda-listing and size also give the report's CPU, CUDA and size sections.
ANALYZERS: tuple[tuple[str, Analyzer], ...] = (
    ("limits", _only(lambda c, p: wheel_rules.limits(c.w))),
    ("safety", _only(lambda c, p: wheel_rules.safety(c.w))),
    (
        "layout",
        _only(
            lambda c, p: wheel_rules.layout(
                c.w, {n: m.sha256 for m in c.w.members if (n := m.name) in c.w.elfs}, p.top_level_forbidden
            )
        ),
    ),
    ("architecture", _only(lambda c, p: wheel_rules.architecture(c.w, list(c.elfs), list(c.w.non_elf)))),
    ("integrity", _only(lambda c, p: wheel_rules.integrity(c.w))),
    ("wheel-file", _only(lambda c, p: wheel_rules.wheel_file(c.w, list(c.elfs)))),
    ("metadata", _only(lambda c, p: wheel_rules.metadata(c.w))),
    ("tags", _only(lambda c, p: wheel_rules.tags(c.w, list(c.elfs)))),
    ("elf-abi", _only(lambda c, p: elf_rules.elf_abi(c.w.filename, str(c.w.name), list(c.elfs), p))),
    (
        "rpath",
        _only(
            lambda c, p: elf_rules.rpath(c.w.filename, list(c.elfs), c.tree, c.system, c.external, p.always_external)
        ),
    ),
    ("isa", lambda c, p: isa_rules.isa(c.w.filename, c.uses, p)),
    (
        "isa-grafts",
        _only(lambda c, p: isa_rules.grafts(c.w.filename, list(c.elfs), c.chains.where, c.chains.unused, p)),
    ),
    ("abi3", _only(lambda c, p: link_rules.abi3(c.w, c.elfs))),
    ("torch-abi", _only(lambda c, p: link_rules.torch_pin(c.w, c.elfs, _torch_libraries(p), c.chains.where))),
    ("build-manifest", _only(lambda c, p: manifest_rules.manifest(c.w, c.w.elfs, p, c.uses))),
    ("cuda", lambda c, p: cuda_rules.cuda(c.w, c.kernel_payload, p, c.system)),
    ("cuda-listing", lambda c, p: cuda_rules.listing(c.w)),
    ("size", lambda c, p: size_rules.size(c.w, p, c.baseline)),
    (
        "license",
        _only(
            lambda c, p: license_rules.declared(
                c.w,
                license_rules.archived_origins(c.w, *c.sboms)
                if p.payload and c.w.member(p.payload.manifest_member)
                else (),
            )
        ),
    ),
    (
        "sbom",
        _only(
            lambda c, p: sbom_rules.sbom(
                c.w,
                *c.sboms,
                p.payload.manifest_member if p.payload else None,
                c.w.text(f"{c.w.dist_info}/{dist_rules.UPSTREAM_FILE}"),
            )
        ),
    ),
)


def _torch_libraries(policy: Policy) -> tuple[str, ...]:
    """The library name patterns of the policy's torch provider ([[elf.external]] provider = "torch")."""
    return tuple(sorted({pat for e in policy.external if e.provider == "torch" for pat in e.libraries}))


def _links(ctx: WheelContext, scope: link_rules.Scope) -> tuple[list[Finding], dict[str, Any]]:
    """Every ELF of the wheel resolved against its own libraries (by load chains) and the scope's providers; the
    findings and the counts (the report's `links`)."""
    by_path = {elf_rules._path(e.member): e for e in ctx.elfs}
    inside = {
        lib: e.link for (_, lib), where in ctx.chains.where.items() if where and (e := by_path.get(where)) and e.link
    }
    system = ctx.system or platforms.system_libraries_of_tags([t.platform for t in ctx.w.tags])
    arch = ctx.target.arch if ctx.target is not None else "x86_64"
    done = [
        link_rules.resolve(e.link, inside, scope.providers, system)
        for e in ctx.elfs
        if e.link is not None and e.member not in ctx.chains.unused and platforms.elf_arch(e)[0] == arch
    ]
    return link_rules.unresolved(ctx.w.filename, done, scope), _link_counts(scope, ctx.w.filename, done)


def _link_counts(scope: link_rules.Scope, wheel: str, done: list[link_rules.Resolution]) -> dict[str, Any]:
    return {
        "scope": scope.name,
        "wheel": wheel,
        "elfs": {r.member: {"bound": r.bound, "unresolved": len(r.unresolved), "system": r.assumed} for r in done},
    }


def audit_wheel(
    path: Path,
    policy: Policy,
    baseline: dict[str, Any] | None = None,
    scopes: tuple[link_rules.Scope, ...] = (),
) -> WheelResult:
    """Read one wheel, run every analyzer of ANALYZERS over its facts (and the link resolution of link_rules in
    each of `scopes` that applies to it), apply waivers and severities."""
    try:
        ctx = read_context(path, policy, baseline)
    except AuditError as exc:
        size, digest = file_digest(path)
        res = WheelResult(path.name, digest, size)
        res.findings.append(finding("wheel.unreadable", path.name, "", str(exc), "rebuild the wheel"))
        return res
    w = ctx.w
    res = WheelResult(path.name, w.sha256, w.size)
    if policy.payload is not None:
        res.summary = summarize(w, policy.payload.manifest_member)
    res.installed = ctx.tree
    res.has_sbom = bool(ctx.sboms[0])
    if res.has_sbom and not ctx.sboms[1]:
        res.sbom_components, res.sbom_hashes = sbom_reader.components(w, *ctx.sboms)
    res.license = license_rules.expression(w)
    res.names = dist_rules.DistNames(
        w.filename,
        str(w.name),
        w.lookups,
        w.text(f"{w.dist_info}/{dist_rules.UPSTREAM_FILE}"),
        all(n in ctx.tree for n in dist_rules.ALIAS_FILES),
    )
    sections: dict[str, dict[str, Any]] = {}
    for name, analyze in ANALYZERS:
        found, sections[name] = analyze(ctx, policy)
        res.findings += found
    for scope in scopes:
        if scope.applies(w.filename):
            found, counts = _links(ctx, scope)
            res.findings += found
            if counts["elfs"]:
                res.links.append(counts)
    res.cpu, res.sizes = sections["isa"], sections["size"]
    res.cuda = (
        {**sections["cuda"], "embedded": sections["cuda-listing"]} if sections["cuda-listing"] else sections["cuda"]
    )
    needs = [(v, e.member) for e in ctx.elfs for lib, vs in e.version_needs for v in vs if v.startswith("GLIBC_")]
    res.glibc = max(needs, key=lambda n: manylinux.version_key(n[0]), default=None)
    res.platform, res.platform_reason = platforms.verdict(
        ctx.target, list(ctx.elfs), ctx.chains.where, ctx.chains.unused
    )
    if res.platform is None and ctx.untargeted:
        res.platform_reason = ctx.untargeted
    if ctx.target is not None and ctx.target.assumed:
        res.findings.append(_assumed_libc(ctx, res.platform))
    res.findings = [_waive(f, str(w.name), policy) for f in res.findings]
    return res


def _assumed_libc(ctx: WheelContext, verdict: str | None) -> Finding:
    """The note on a verdict no tag and no ELF file decided the C library of: what the binaries
    also satisfy under musl."""
    t = ctx.target
    assert t is not None
    musl = platforms.Target("musllinux", t.arch, platforms.policies("musllinux", t.arch), "")
    also, _ = platforms.verdict(musl, list(ctx.elfs), ctx.chains.where, ctx.chains.unused)
    both = f"consistent with both {verdict} and {also}" if also and also != musl.linux else f"judged {verdict}"
    return finding(
        "tag.libc-assumed",
        ctx.w.filename,
        "",
        f"{both}: {t.how}",
        "nothing to fix where the binaries are static; otherwise tag the wheel for the C library it was built "
        "against (manylinux or musllinux)",
        "info",
    )


def _kt_release(results: list[WheelResult]) -> bool:
    """Whether the wheels are a KT release: some wheel records its upstream or ships the dist-name alias."""
    return any(r.names is not None and (r.names.upstream is not None or r.names.ships_alias) for r in results)


def _sbom_for_releases(results: list[WheelResult], policy: Policy) -> None:
    """A KT release is held to an SBOM in every wheel (sbom.missing); anyone else's wheels, or a kernel
    wheel before the assembly gives it one, are not (an SBOM they do ship is still checked, wheel by wheel)."""
    if not _kt_release(results):
        return
    for r in results:
        if not r.has_sbom and r.names is not None:
            r.findings.append(_waive(sbom_rules.missing(r.wheel, r.names.dist), r.names.dist, policy))


RELEASE_MANIFEST = "manifest.json"  # dist/'s record of every wheel and the inputs it derives from (carriers)
RELEASE_MANIFEST_MAX = 16 << 20


def _release_manifest(path: Path) -> tuple[dict[str, Any] | None, str]:
    """dist/manifest.json checked against its schema (release-manifest.schema.json), or why it cannot be
    read (never an exception: it is input like any other)."""
    try:
        if path.is_symlink() or not path.is_file():
            return None, "not a regular file"
        if path.stat().st_size > RELEASE_MANIFEST_MAX:
            return None, f"over {RELEASE_MANIFEST_MAX >> 20} MiB"
        data = path.read_bytes()
    except OSError as exc:
        return None, f"{type(exc).__name__}: {str(exc)[:200]}"
    return load(data, RELEASE_MANIFEST_SCHEMA)


def _waive(f: Finding, dist_name: str, policy: Policy) -> Finding:
    """A waiver makes one known finding info; a severity entry sets a rule's level for this policy."""
    for wv in policy.waivers:
        if wv.rule == f.rule and wv.wheel == dist_name and (not wv.member or wv.member == f.member):
            return replace(f, severity="info", message=f"waived ({wv.reason}): {f.message}")
    for sv in policy.severities:
        if sv.rule == f.rule and (not sv.wheel or sv.wheel == dist_name) and f.severity == "error":
            return replace(f, severity=sv.level, message=f"{f.message} [{policy.name} policy: {sv.reason}]")
    return f


def expand(paths: list[Path]) -> list[Path]:
    """Wheel files from paths (files, or directories of .whl files); unusable paths raise AuditError."""
    out: list[Path] = []
    for p in paths:
        if p.is_dir() and p.suffix == ".whl":
            raise AuditError(f"{p}: a directory named like a wheel; give the .whl file, or the directory holding it")
        if p.is_dir():
            out += sorted(w for w in p.glob("*.whl") if w.is_file())
        elif p.is_file():
            out.append(p)
        elif p.exists():
            raise AuditError(f"{p}: not a regular file")
        else:
            raise AuditError(f"{p}: no such file or directory")
    if not out:
        raise AuditError(f"no wheels found in {', '.join(map(str, paths))}; build them first (nox -s build_cpu)")
    return out


def link_scope(name: str, folders: list[Path], wheels: frozenset[str] | None = None) -> link_rules.Scope:
    """A link scope over `folders` (an installed environment's site-packages); AuditError naming a missing one."""
    missing = [str(d) for d in folders if not d.is_dir()]
    if missing:
        raise AuditError(f"--link {', '.join(missing)}: no such folder; give an installed environment's site-packages")
    return link_rules.Scope(name, link_rules.Providers.scan(folders), wheels)


def run(
    paths: list[Path],
    policy: Policy,
    baseline_file: Path | None = None,
    link: list[Path] | None = None,
    scopes: tuple[link_rules.Scope, ...] = (),
    unchecked: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Audit every wheel; returns the report (schema: audits/schemas/audit-report.schema.json). `link`: folders
    whose libraries every wheel's ELF files are resolved against (an installed environment's site-packages);
    `scopes`: link scopes of their own (an install profile's closure for the wheels it installs); `unchecked`:
    scope -> why its closure could not be had (the report says NOT CHECKED, never a pass)."""
    if link:
        scopes = (*scopes, link_scope("given", link))
    baseline = None
    if baseline_file is not None:
        try:
            raw, problem = load(baseline_file.read_bytes(), SIZE_BASELINE)
        except OSError as exc:
            raise AuditError(f"{baseline_file}: cannot read the size baseline ({exc.strerror})") from None
        if problem:
            raise AuditError(
                f"{baseline_file}: cannot read the size baseline: {problem}; give a previous audit report (--json) "
                "or a {name: bytes} map"
            )
        # Accept a previous audit report, or a plain {name: bytes} map.
        baseline = {w["name"]: w["size"] for w in raw.get("wheels", [])} if "wheels" in raw else raw
    t0 = time.perf_counter()
    results = [audit_wheel(p, policy, baseline, scopes) for p in expand(paths)]
    payload_section = _release_payload(results, policy, scopes)
    by_file = {r.wheel: r for r in results}
    for f in wheel_rules.collisions({r.wheel: r.installed for r in results}):
        by_file[f.wheel].findings.append(f)
    for f in dist_rules.name_lookups([r.names for r in results if r.names is not None]):
        names = by_file[f.wheel].names
        assert names is not None  # the finding came from this wheel's facts
        by_file[f.wheel].findings.append(_waive(f, names.dist, policy))
    _sbom_for_releases(results, policy)
    unattached: list[Finding] = []  # release-level findings about no one wheel
    release = _kt_release(results)  # a manifest.json beside anyone else's wheels is not ours to judge
    for p in paths:
        if release and p.is_dir() and (p / RELEASE_MANIFEST).exists():
            manifest, problem = _release_manifest(p / RELEASE_MANIFEST)
            for f in sbom_rules.inputs(manifest, problem, {r.wheel: r.sbom_hashes for r in results if r.has_sbom}):
                target = by_file.get(f.wheel)
                if target is None:
                    unattached.append(f)
                else:
                    target.findings.append(_waive(f, target.names.dist if target.names else f.wheel, policy))
    findings = [f for r in results for f in r.findings] + unattached
    release_files = [f for p in paths if p.is_dir() for f in read_install_files(p)]
    findings += install_rules.analyze(release_files, {r.wheel: r.sha256 for r in results})
    return {
        "schema_version": SCHEMA_VERSION,
        "passed": not any(f.severity == "error" for f in findings),
        "policy": str(policy.source),
        "policy_name": policy.name,
        "elapsed_s": round(time.perf_counter() - t0, 3),
        "wheels": [
            {
                "filename": r.wheel,
                "name": r.wheel.split("-")[0].replace("_", "-").lower(),
                "sha256": r.sha256,
                "size": r.size,
                "errors": sum(f.severity == "error" for f in r.findings),
                "honest_platform": r.platform,
                "platform_reason": r.platform_reason,
                "license": r.license,
                "sbom_components": r.sbom_components,
                **({"links": r.links} if r.links else {}),
                **({"glibc_needed": {"version": r.glibc[0], "elf": r.glibc[1]}} if r.glibc else {}),
            }
            for r in results
        ],
        "findings": [f.as_dict() for f in findings],
        "cpu_variants": {r.wheel: r.cpu for r in results if r.cpu},
        "cuda_architectures": {r.wheel: r.cuda for r in results if r.cuda},
        "sizes": {r.wheel: r.sizes for r in results},
        "payload": payload_section,
        **({"links_not_checked": dict(unchecked)} if unchecked else {}),
        "tools": {"cuobjdump": tool.as_dict() if (tool := cuobjdump_tool()) else None},
    }


def _stream_archive(summaries: list[WheelSummary], policy: Policy) -> ArchiveFacts | None:
    """Read the archive out of the part members in the manifest's order; None if a part is absent."""
    assert policy.payload is not None
    provider = next((s for s in summaries if s.manifest is not None), None)
    if provider is None or provider.manifest is None:
        return None
    by_name = {s.name: s for s in summaries}
    located: list[tuple[Path, str]] = []
    for p in provider.manifest.get("parts", []):
        carrier = by_name.get(str(p.get("distribution")))
        if carrier is None or not any(pm.name == p.get("member") for pm in carrier.parts):
            return None
        located.append((carrier.path, str(p["member"])))
    root = policy.payload.kt_cuda_root
    detailed = {f"{root}/{lib.member}" for lib in policy.cuda_libraries}
    window = min(provider.manifest["archive"]["window_log"], policy.payload.zstd_window_log)
    declared = {name: f["size"] for name, f in provider.manifest["files"].items()}
    return read_archive(located, window, find_cuobjdump(), detailed, declared, policy.limits.archive_max_bytes)


def _release_payload(
    results: list[WheelResult], policy: Policy, scopes: tuple[link_rules.Scope, ...] = ()
) -> dict[str, Any]:
    """The release-level payload rules (and the link resolution of the archive's ELF files, laid out as the cache
    extracts them, in each scope that holds the manifest's wheel); their findings join the wheel they name."""
    summaries = [r.summary for r in results if r.summary is not None]
    if policy.payload is None or not any(s.parts or s.manifest or s.manifest_error for s in summaries):
        return {}
    provider = next((s for s in summaries if s.manifest is not None), summaries[0])
    system = platforms.system_libraries_of_tags([t.rsplit("-", 1)[-1] for t in provider.tags])
    archive = _stream_archive(summaries, policy)
    findings, section = payload_rules.analyze(summaries, archive, policy, system)
    elfs = {f.path: f.elf.link for f in (archive.files if archive else ()) if f.elf is not None and f.elf.link}
    inside = {Path(p).name: d for p, d in elfs.items()} | {d.soname: d for d in elfs.values() if d.soname}
    by_file = {r.wheel: r for r in results}
    for scope in scopes:
        if elfs and scope.applies(provider.filename):
            done = [link_rules.resolve(d, inside, scope.providers, system) for d in elfs.values()]
            findings += link_rules.unresolved(provider.filename, done, scope)
            by_file[provider.filename].links.append(_link_counts(scope, f"{provider.filename}!payload", done))
    by_file = {r.wheel: r for r in results}
    for f in findings:
        r = by_file.get(f.wheel, results[0])
        name = r.summary.name if r.summary else r.wheel.split("-")[0]
        r.findings.append(_waive(f, name, policy))
    return section
