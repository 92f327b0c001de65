"""Turn inputs into carrier wheels: forks (rename, patch, rewrite requirements),
dependency-only repacks, and the generated umbrella."""

from __future__ import annotations

import io
import json
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version

from base.stagecache import file_sha256

from . import licensing, proc, sbom, wheelio
from .alias._kt_dist_alias import UPSTREAM_FILE  # <dist-info>/kt_upstream.json of every fork and repack
from .draft import Draft, Finish
from .errors import ConsistencyError, InputError, PatchError
from .model import ALIAS_DIR, Carrier, CarrierSet

ALIAS_FILES = ("_kt_dist_alias.py", "_kt_dist_alias.pth")

Rewrite = Callable[[str], str]


def carrier_version(c: Carrier, cs: CarrierSet, upstream_version: str = "") -> str:
    """A carrier's version from its rule: the KT version, upstream.postN, or the upstream's."""
    if c.version_rule == "kt":
        return cs.kt_version
    if c.version_rule == "post":
        v = Version(upstream_version)
        if v.is_postrelease or v.is_devrelease or v.local:
            raise InputError(
                f"{c.name}: upstream {c.upstream} {v} already has a post/dev/local part; fork a final release"
            )
        return f"{v.public}.post{c.post}"
    return upstream_version


def rename_requirement(line: str, new_name: str, new_spec: str | None = None) -> str:
    """Swap the project name in a Requires-Dist value, keeping every other byte
    (extras, bounds, marker); with new_spec, the version specifier too."""
    try:
        req = Requirement(line)
    except InvalidRequirement as exc:
        raise InputError(f"Requires-Dist {line!r} does not parse: {exc}") from None
    m = re.match(r"\s*" + re.escape(req.name) + r"(?![A-Za-z0-9._-])", line)
    if not m:
        raise InputError(f"cannot locate the name {req.name!r} in Requires-Dist {line!r}")
    rest = line[m.end() :]
    if new_spec is not None:
        extras = f"[{','.join(sorted(req.extras))}]" if req.extras else ""
        marker = f"; {req.marker}" if req.marker else ""
        return f"{new_name}{extras}{new_spec}{marker}"
    return new_name + rest


def make_rewrite(c: Carrier, cs: CarrierSet, versions: Mapping[str, str], upstream_of: Mapping[str, str]) -> Rewrite:
    """Requirement rewriter for carrier `c`. versions: carrier -> version; upstream_of: carrier -> upstream version."""
    replaced = cs.by_upstream()

    def rewrite(line: str) -> str:
        req = Requirement(line)
        target = replaced.get(canonicalize_name(req.name))
        if target is None:
            return line
        if target == c.name:  # self-reference through an extra: sglang[test] -> sglang-kt[test]
            return rename_requirement(line, target)
        specs = list(req.specifier)
        if c.pin_forks:  # the upstream's own bounds give way to the release's sibling versions
            return rename_requirement(line, target, f"=={versions[target]}")
        # A fork pins its sibling forks exactly: upstream `transformers==X` becomes
        # `transformers-kt==X.postN`, and X must be what the sibling derives from.
        if c.kind == "fork" and len(specs) == 1 and specs[0].operator == "==":
            pinned = Version(specs[0].version)
            if pinned != Version(upstream_of[target]):
                raise ConsistencyError(
                    f"{c.name}: upstream {c.upstream} pins {req.name}=={pinned}, but {target} derives from "
                    f"{upstream_of[target]}; lock {req.name}=={pinned} in lockfiles/carrier-inputs.in"
                )
            return rename_requirement(line, target, f"=={versions[target]}")
        return rename_requirement(line, target)  # bounds unchanged, byte for byte

    return rewrite


def _behind_extra(line: str, extra: str) -> str:
    """A Requires-Dist value made conditional on `extra` (its own marker kept, and-ed)."""
    req = Requirement(line)
    if req.marker is not None and "extra" in str(req.marker):
        raise ConsistencyError(f"Requires-Dist {line!r} already depends on an extra; it cannot move to [{extra}]")
    marker = f'({req.marker}) and extra == "{extra}"' if req.marker else f'extra == "{extra}"'
    extras = f"[{','.join(sorted(req.extras))}]" if req.extras else ""
    return f"{req.name}{extras}{req.specifier}; {marker}"


def edit_requirements(c: Carrier, what: str, rewrite: Rewrite) -> tuple[Rewrite, Callable[[], None]]:
    """Carrier `c`'s requires_edit and requires_extra applied before `rewrite`; the second function,
    called after every line went through, raises ConsistencyError for an edit that matched nothing
    (the upstream dropped that requirement: the edit is stale)."""
    edits = dict(c.requires_edit)
    moved = {dep: extra for extra, deps in c.requires_extra for dep in deps}
    used: set[str] = set()

    def edited(line: str) -> str:
        req = Requirement(line)
        name = canonicalize_name(req.name)
        if name in edits and not (req.marker is not None and "extra" in str(req.marker)):
            used.add(name)
            line = rename_requirement(line, req.name, edits[name])
        elif name in moved:
            used.add(name)
            line = _behind_extra(line, moved[name])
        return rewrite(line)

    def check() -> None:
        stale = sorted((set(edits) | set(moved)) - used)
        if stale:
            raise ConsistencyError(
                f"{c.name}: {what} declares no requirement on {stale}; remove them from requires_edit/"
                "requires_extra in carriers/carriers.toml"
            )

    return edited, check


def _renamed_tree(members: Mapping[str, bytes], old: tuple[str, str], new: tuple[str, str]) -> dict[str, bytes]:
    """Move <old>.dist-info and <old>.data to the new distribution's names."""
    old_prefix = f"{old[0]}-{old[1]}"
    new_prefix = f"{canonicalize_name(new[0]).replace('-', '_')}-{new[1]}"
    out = {}
    for name, data in members.items():
        top, sep, rest = name.partition("/")
        target = name
        for suffix in (".dist-info", ".data"):
            if top == old_prefix + suffix:
                target = new_prefix + suffix + sep + rest
        out[target] = data
    return out


def apply_patches(members: dict[str, bytes], patches: tuple[Path, ...], what: str) -> dict[str, bytes]:
    """Apply a carrier's patch series to its members with GNU patch; PatchError names the hunk."""
    if not patches:
        return members
    if shutil.which("patch") is None:
        raise PatchError("GNU patch is not installed; apt-get install patch")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for name, data in members.items():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            (root / name).write_bytes(data)
        for patch in patches:
            cmd = ["patch", "-p1", "--forward", "--batch", "--no-backup-if-mismatch", "-d", str(root), "-i", str(patch)]
            dry = subprocess.run([*cmd, "--dry-run"], capture_output=True, text=True, check=False)
            if dry.returncode != 0:
                files = re.findall(r"(?:patching|checking) file (\S+)", dry.stdout) or ["?"]
                failed = [
                    ln for ln in dry.stdout.splitlines() if "FAILED" in ln or "ignored" in ln or "can't find" in ln
                ]
                raise PatchError(
                    f"{patch} no longer applies to {files[-1]} in {what}: {'; '.join(failed) or dry.stdout.strip()}. "
                    "Refresh the patch against this upstream version, or drop it if upstream fixed the problem."
                )
            proc.run(cmd, f"applying {patch} to {what}", PatchError, "refresh the patch against this upstream version")
        return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _unconditional(line: str) -> Requirement | None:
    """A Requires-Dist value as a requirement, or None where it serves an extra only."""
    req = Requirement(line)
    return None if req.marker is not None and "extra" in str(req.marker) else req


def _required(meta: str) -> set[str]:
    """The names a METADATA text requires outside any extra."""
    return {
        canonicalize_name(r.name) for x in wheelio.metadata_field(meta, "Requires-Dist") if (r := _unconditional(x))
    }


def release_pins(cs: CarrierSet, upstream_inputs: Mapping[str, Sequence[Path]]) -> dict[str, str]:
    """name -> version for every name a carrier's `requires_pinned` lists: the one exact version (`==V`,
    outside any extra) at which the release's upstream inputs pin it (sglang pins torch==2.14.1). Read from
    each input's METADATA alone. No input pins it exactly, or two pin it differently: ConsistencyError
    naming them and the fix."""
    wanted: dict[str, str] = {n: c.name for c in cs.carriers for n in c.requires_pinned}
    if not wanted:
        return {}
    seen: dict[str, dict[str, list[str]]] = {n: {} for n in wanted}
    for paths in upstream_inputs.values():
        for path in paths:
            for line in wheelio.read_metadata(path)[1]:
                req = _unconditional(line)
                if req is None or (name := str(canonicalize_name(req.name))) not in wanted:
                    continue
                specs = list(req.specifier)
                if len(specs) == 1 and specs[0].operator == "==":
                    seen[name].setdefault(specs[0].version, []).append(path.name)
    out = {}
    for name, by_version in sorted(seen.items()):
        if len(by_version) != 1:
            found = "; ".join(f"=={v} by {', '.join(sorted(set(w)))}" for v, w in sorted(by_version.items()))
            raise ConsistencyError(
                f"{wanted[name]}: requires_pinned = [{name!r}] takes the one version the release's inputs pin "
                f"{name} at, and they pin it {found or 'nowhere exactly'}; lock inputs that agree "
                "(lockfiles/carrier-inputs.in) or remove it from requires_pinned in carriers/carriers.toml"
            )
        out[name] = next(iter(by_version))
    return out


def honest_tags(c: Carrier, members: Mapping[str, bytes], src_name: str) -> list[str]:
    """The tags of `c`'s wheel (`retag = true`) from what its ELF files need, as the audit judges them: each of
    the input's python/abi tags with the most portable manylinux platform its ELF files allow
    (audits.manylinux.honest_platform), the libraries of an external provider the wheel requires (the audit
    policy's [[elf.external]]: torch/lib, or loaded by the importing package first) counted as that
    provider's. No ELF file, or no manylinux tag they allow: ConsistencyError naming why."""
    import fnmatch

    from audits import manylinux, platforms
    from audits.analyzers.elf_rules import load_chains
    from audits.policy import load_policy
    from audits.readers import is_elf, read_elf_stream

    required = _required(members[f"{wheelio.dist_info(members)}/METADATA"].decode("utf-8"))
    # the dynamic section and versions are all the verdict reads: no code, no export table
    elfs = [
        read_elf_stream(n, io.BytesIO(d), code=False, exports=False) for n, d in sorted(members.items()) if is_elf(d)
    ]
    if not elfs:
        raise ConsistencyError(
            f"{c.name}: retag = true, but {src_name} holds no ELF file to take a tag from; remove retag from "
            "carriers/carriers.toml"
        )
    provided = [(p.provider, pat) for p in load_policy().external if p.provider in required for pat in p.libraries]
    where = load_chains(elfs, list(members)).where
    for e in elfs:
        for lib in e.needed:
            if where.get((e.member, lib)) is None:
                by = next((prov for prov, pat in provided if fnmatch.fnmatch(lib, pat)), None)
                where[(e.member, lib)] = f"<{by}>" if by else None
    src_tags = sorted(parse_wheel_filename(src_name)[3], key=str)
    arch = platforms.tag_arch([t.platform for t in src_tags]) or "x86_64"
    platform, why = manylinux.honest_platform(elfs, where, arch)
    if platform is None or not platform.startswith("manylinux_"):
        raise ConsistencyError(
            f"{c.name}: the ELF files of {src_name} allow no manylinux tag ({why}); retag cannot make it portable: "
            "require the provider of the missing library (requires_pinned) or drop the carrier"
        )
    return sorted({f"{t.interpreter}-{t.abi}-{platform}" for t in src_tags})


def derived_name(c: Carrier, src: Path, versions: Mapping[str, str]) -> str:
    """The filename derive() gives carrier `c`'s wheel from the input `src`: the input's own tag spelling."""
    tag = "-".join(src.name[:-4].split("-")[-3:])  # compressed tag sets included
    return wheelio.wheel_name(c.name, versions[c.name], tag)


def provenance(c: Carrier, src: Path, sha256: str | None = None) -> sbom.Provenance:
    """What a derived wheel's SBOM says of its origin: its input wheel (by sha256: `sha256` where the
    caller verified it already) and its patch series. The libraries grafted into it are read from the
    finished members (Draft.finished)."""
    up_name, up_version, _, _ = parse_wheel_filename(src.name)
    return sbom.Provenance(
        upstream=sbom.Upstream(str(up_name), str(up_version), src.name, sha256 or file_sha256(src)),
        patches=[(p.name, file_sha256(p)) for p in c.patches] if c.kind == "fork" else [],
    )


def derive(
    c: Carrier,
    cs: CarrierSet,
    src: Path,
    out_dir: Path,
    versions: Mapping[str, str],
    upstream_of: Mapping[str, str],
    take: Callable[[dict[str, bytes]], None] | None = None,
) -> Path:
    """derive_draft's wheel written into `out_dir`."""
    return derive_draft(c, cs, src, versions, upstream_of, take).write(out_dir)


def derived_executable(members: Mapping[str, bytes]) -> frozenset[str]:
    """The members a derived wheel writes 0755: scripts and shared objects."""
    return frozenset(n for n in members if "/scripts/" in n or n.endswith(".so"))


def derive_draft(
    c: Carrier,
    cs: CarrierSet,
    src: Path,
    versions: Mapping[str, str],
    upstream_of: Mapping[str, str],
    take: Callable[[dict[str, bytes]], None] | None = None,
    src_sha256: str | None = None,
    pins: Mapping[str, str] | None = None,
) -> Draft:
    """A fork or repack wheel of carrier `c` from the upstream wheel `src` (`src_sha256`: its verified
    sha256, if known), in memory, with what finishing applies (its license, its SBOM naming the input and
    the patches, its tags where `retag` decides them). `take` removes members before anything else happens
    (the lazy CUDA archive's share); `pins`: release_pins, for `requires_pinned`."""
    up_name, up_version, _, _ = parse_wheel_filename(src.name)
    members = wheelio.read(src)
    if take is not None:
        take(members)
    di = wheelio.dist_info(members)
    old = (di[: -len(".dist-info")].rsplit("-", 1)[0], di[: -len(".dist-info")].rsplit("-", 1)[1])
    new_version = versions[c.name]
    members = _renamed_tree(members, old, (c.name, new_version))
    members = apply_patches(members, c.patches, f"{up_name} {up_version}") if c.kind == "fork" else members
    new_di = wheelio.dist_info(members)
    meta = members[f"{new_di}/METADATA"].decode("utf-8")
    rewrite, check_edits = edit_requirements(
        c, f"upstream {up_name} {up_version}", make_rewrite(c, cs, versions, upstream_of)
    )
    declared = set(wheelio.metadata_field(meta, "Provides-Extra"))
    add = [f"Requires-Dist: {d}=={versions[d]}" for d in c.requires]
    has = _required(meta)
    for dep in c.requires_pinned:
        if dep in has:
            raise ConsistencyError(
                f"{c.name}: upstream {up_name} {up_version} requires {dep} already; change its specifier with "
                "requires_edit, not requires_pinned, in carriers/carriers.toml"
            )
        if dep not in (pins or {}):
            raise ConsistencyError(f"{c.name}: no release pin for {dep} (transform.release_pins was not given it)")
        add.append(f"Requires-Dist: {dep}=={(pins or {})[dep]}")
    add += [f"Provides-Extra: {e}" for e, _ in c.requires_extra if e not in declared]
    meta = wheelio.edit_metadata(
        meta, name=c.name, version=None if c.kind == "repack" else new_version, requirement=rewrite, add=add
    )
    check_edits()
    members[f"{new_di}/METADATA"] = meta.encode("utf-8")
    expression = licensing.expression_for(c.name, c.license, str(up_name), meta)
    upstream = {"carrier": c.name, "name": c.upstream, "version": str(up_version)}
    members[f"{new_di}/{UPSTREAM_FILE}"] = (json.dumps(upstream, sort_keys=True) + "\n").encode()
    if c.dist_alias:
        for name in ALIAS_FILES:
            if name in members:
                raise ConsistencyError(f"{c.name}: upstream {up_name} already ships {name}")
            members[name] = (ALIAS_DIR / name).read_bytes()
    finish = Finish(
        c.name,
        new_version,
        cs.kt_version,
        provenance(c, src, src_sha256),
        license=expression,
        license_what=f"upstream {up_name} {up_version} ({src.name})",
        tags=honest_tags(c, members, src.name) if c.retag else None,
    )
    name = derived_name(c, src, versions)
    if finish.tags is not None:
        name = wheelio.wheel_name(c.name, new_version, wheelio.compressed_tag(finish.tags))
    return Draft(name, finish, members=members, executable=derived_executable)


def umbrella(
    c: Carrier, cs: CarrierSet, versions: Mapping[str, str], license: tuple[str, Mapping[str, bytes]]
) -> Draft:
    """The generated ktransformers wheel, in memory: exact pins to its siblings, extras serve/sft;
    `license`: the project's expression and license files (licensing.project)."""
    version = versions[c.name]
    norm = canonicalize_name(c.name).replace("-", "_")
    di = f"{norm}-{version}.dist-info"
    lines = [
        "Metadata-Version: 2.1",
        f"Name: {c.name}",
        f"Version: {version}",
        f"Summary: {c.summary}",
        f"Requires-Python: {c.requires_python}",
    ]
    lines += [f"Requires-Dist: {d}=={versions[d]}" for d in c.requires]
    for extra, deps in c.extras:
        lines.append(f"Provides-Extra: {extra}")
        lines += [f'Requires-Dist: {d}=={versions[d]}; extra == "{extra}"' for d in deps]
    init = f'"""{c.summary}."""\n\n__version__ = "{version}"\n'
    members = {
        f"{norm}/__init__.py": init.encode(),
        f"{di}/METADATA": ("\n".join(lines) + "\n\n").encode(),
        f"{di}/WHEEL": b"Wheel-Version: 1.0\nGenerator: kt-release carriers\nRoot-Is-Purelib: true\n"
        b"Tag: py3-none-any\n",
        f"{di}/top_level.txt": f"{norm}\n".encode(),
    }
    finish = Finish(
        c.name, version, cs.kt_version, license=license[0], license_what=c.name, license_files=dict(license[1])
    )
    return Draft(wheelio.wheel_name(c.name, version, "py3-none-any"), finish, members=members)
