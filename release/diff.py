"""The release diff: what changed between the previous release (the predecessor) and this one, per
distribution, for a reviewer, and the one rule that keeps an upgrade by pip whole.

    python -m release.diff --dist dist --previous DIR|URL::NAME==V,... [--json dist/release-diff.json]

Per distribution: versions; tags (a raised glibc floor, a dropped Python or architecture are warnings);
size with its breakdown (top directories, CPU variants, the CUDA payload per SM) and growth (a warning
above the policy's `size.diff_warn_mib` or `size.diff_warn_pct`); files added, removed and changed (by
the sha256 their RECORD gives); requirements; the exported dynamic symbols of every ELF; SASS/PTX targets
(kt-kernel's build manifest, the payload manifest); CPU variants; the license expression; SBOM components.

**Paths that change owner.** pip installs a distribution's new version and then uninstalls its old one by
the old RECORD, deleting every file it lists, whoever owns that file now (pypa/pip#8509). A path that moves
from distribution A to distribution B between two releases survives `pip install -U` only when pip replaces
A before it installs B, which it does when B requires A's new version (dependencies first). So for every
path whose owner changes between the predecessor's wheels and ours, B must require A's new version, directly
or through the release's other unconditional requirements; otherwise it is an error of the diff (and the
release verdict's `diff` item fails), naming the path, both owners and the fix. A path whose old owner the
release no longer ships is an error too: nothing ever uninstalls that owner before its files are needed.

The predecessor is a folder of wheels (an earlier dist/, or wheels downloaded from an index) or an index with
pins (`URL::NAME==VERSION,NAME==VERSION`), downloaded once by pip (the index's sha256 checked) into the
build cache. The diff reads only zip directories, RECORD, METADATA, the manifests and ELF symbol tables.
"""

from __future__ import annotations

import argparse
import io
import json
import re
import zipfile
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.tags import parse_tag
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename

from base import distdir
from base.cli import dist_option
from base.errors import StageError, report
from locks.previous import AUTO, PreviousError, newest_older, previous_wheels

from .errors import ReleaseError

__all__ = ["DIFF", "Diff", "DiffError", "PreviousError", "compare", "make", "previous_wheels", "read_wheel", "summary"]

DIFF = "release-diff.json"
SCHEMA_VERSION = 1
SCHEMA = Path(__file__).resolve().parent / "schemas" / "release-diff.schema.json"
ELF_LIMIT = 256 << 20  # an ELF member read for its symbols: larger ones are named, not read
SHOWN = 20  # paths listed per kind in the JSON beyond the counts (the counts are always whole)
BUILD_MANIFEST = "kt_kernel/_build.json"


class DiffError(ReleaseError):
    """A wheel of the predecessor that cannot be read: the message names the file, the problem and the fix."""


@dataclass(frozen=True)
class Facts:
    """What the diff compares of one wheel, read from its zip directory and a few members."""

    name: str
    version: str
    filename: str
    tags: tuple[str, ...]
    size: int
    files: Mapping[str, tuple[str, int]]  # path -> (RECORD hash, size), dist-info excluded
    requires: tuple[str, ...]
    license: str
    exports: Mapping[str, frozenset[str]]  # ELF member -> exported dynamic symbols
    unread: tuple[str, ...]  # ELF members too large to read for their symbols
    cuda: Mapping[str, tuple[tuple[str, ...], tuple[str, ...], int]]  # member -> (sass, ptx, size)
    variants: Mapping[str, int]  # CPU variant -> the size of its library
    sbom: frozenset[str]  # "name@version" of each SBOM component


def _metadata(text: str, key: str) -> list[str]:
    out = []
    for line in text.split("\n\n", 1)[0].splitlines():
        k, sep, value = line.partition(":")
        if sep and k.strip().lower() == key.lower():
            out.append(value.strip())
    return out


def _json_member(zf: zipfile.ZipFile, name: str, where: str) -> dict[str, Any]:
    """A JSON object member (a manifest, an SBOM); DiffError naming it when it is unreadable or no object."""
    try:
        data = json.loads(zf.read(name))
    except (KeyError, ValueError, zipfile.BadZipFile, zlib.error, EOFError, OSError) as exc:
        raise DiffError(f"{where}: {name} cannot be read ({exc})") from None
    if not isinstance(data, dict):
        raise DiffError(f"{where}: {name} is not a JSON object")
    return data


def _table(value: object) -> dict[str, Any]:
    """A manifest's table, or {} where the member holds another type (the audit judges those)."""
    return value if isinstance(value, dict) else {}


def read_wheel(path: Path, payload_member: str = "") -> Facts:
    """The facts of one wheel; DiffError naming the file when it is no readable wheel. `payload_member`: where
    the payload manifest lies (the audit policy's [payload] manifest_member), read for its SASS/PTX."""
    from audits.readers import read_elf_stream

    try:
        name, version, _, tags = parse_wheel_filename(path.name)
    except InvalidWheelFilename as exc:
        raise DiffError(f"{path}: not a wheel's file name ({exc}); give a folder of wheels") from None
    try:
        zf = zipfile.ZipFile(path)
    except (OSError, zipfile.BadZipFile) as exc:
        raise DiffError(f"{path}: not a readable wheel ({exc}); download it again") from None
    with zf:
        infos = {i.filename: i for i in zf.infolist() if not i.is_dir()}
        dist_info = next((n.split("/")[0] for n in infos if n.endswith(".dist-info/RECORD")), "")
        if not dist_info:
            raise DiffError(f"{path}: no .dist-info/RECORD; not a wheel")
        try:
            record = zf.read(f"{dist_info}/RECORD").decode("utf-8")
            meta = zf.read(f"{dist_info}/METADATA").decode("utf-8")
        except (KeyError, UnicodeDecodeError, zipfile.BadZipFile, OSError) as exc:
            raise DiffError(f"{path}: {dist_info} cannot be read ({exc})") from None
        files: dict[str, tuple[str, int]] = {}
        import csv

        for row in csv.reader(io.StringIO(record)):
            if len(row) < 3 or not row[0] or row[0].startswith(dist_info + "/"):
                continue
            size = int(row[2]) if row[2].isdigit() else (infos[row[0]].file_size if row[0] in infos else 0)
            files[row[0]] = (row[1], size)
        exports: dict[str, frozenset[str]] = {}
        unread: list[str] = []
        for member, info in sorted(infos.items()):
            if not re.search(r"\.so($|\.)", member.rsplit("/", 1)[-1]):
                continue
            if info.file_size > ELF_LIMIT:
                unread.append(member)
                continue
            try:
                data = zf.read(member)
            except (zipfile.BadZipFile, zlib.error, EOFError, OSError) as exc:
                raise DiffError(f"{path}: {member} is damaged ({exc}); download the wheel again") from None
            if data[:4] != b"\x7fELF":
                continue
            try:
                elf = read_elf_stream(member, io.BytesIO(data), code=False)
            except ValueError:
                unread.append(member)
                continue
            exports[member] = frozenset(elf.exports)
        cuda: dict[str, tuple[tuple[str, ...], tuple[str, ...], int]] = {}
        variants: dict[str, int] = {}
        if BUILD_MANIFEST in infos:
            build = _json_member(zf, BUILD_MANIFEST, str(path))
            for v, spec in _table(build.get("variants")).items():
                file = spec.get("file", "") if isinstance(spec, dict) else ""
                variants[str(v)] = files.get(str(file), ("", 0))[1]
            for member, spec in _table(_table(build.get("cuda")).get("files")).items():
                if isinstance(spec, dict):
                    cuda[str(member)] = _archs(spec)
        if payload_member in infos:
            manifest = _json_member(zf, payload_member, str(path))
            for member, spec in _table(manifest.get("files")).items():
                if isinstance(spec, dict) and (spec.get("sass") or spec.get("ptx")):
                    cuda[f"payload:{member}"] = _archs(spec)
        sbom: set[str] = set()
        for member in infos:
            if member.startswith(f"{dist_info}/sboms/") and member.endswith(".json"):
                doc = _json_member(zf, member, str(path))
                components = doc.get("components")
                for c in components if isinstance(components, list) else []:
                    if isinstance(c, dict):
                        sbom.add(f"{c.get('name')}@{c.get('version')}")
    return Facts(
        name=str(canonicalize_name(name)),
        version=str(version),
        filename=path.name,
        tags=tuple(sorted(str(t) for t in tags)),
        size=path.stat().st_size,
        files=files,
        requires=tuple(_metadata(meta, "Requires-Dist")),
        license=(_metadata(meta, "License-Expression") or _metadata(meta, "License") or [""])[0],
        exports=exports,
        unread=tuple(unread),
        cuda=cuda,
        variants=variants,
        sbom=frozenset(sbom),
    )


def _older(a: str, b: str) -> bool:
    from packaging.version import InvalidVersion, Version

    try:
        return Version(a) < Version(b)
    except InvalidVersion:
        return False


def _archs(spec: Mapping[str, Any]) -> tuple[tuple[str, ...], tuple[str, ...], int]:
    size = spec.get("size")
    return (
        tuple(sorted(map(str, spec.get("sass") or ()))),
        tuple(sorted(map(str, spec.get("ptx") or ()))),
        size if isinstance(size, int) else 0,
    )


def _payload_member() -> str:
    """The payload manifest's member (the audit policy's [payload] manifest_member; "" without a payload)."""
    from audits.policy import load_policy

    pl = load_policy().payload
    return pl.manifest_member if pl is not None else ""


# --- the comparison --------------------------------------------------------------------------------------


@dataclass
class Diff:
    """The release diff: per distribution, the owner changes, the warnings and the errors."""

    previous: str
    dist_sha256: str | None = None  # the build it was made for (base.distdir.key)
    distributions: list[dict[str, Any]] = field(default_factory=list)
    owners: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "previous": self.previous,
            "dist_sha256": self.dist_sha256,
            "distributions": self.distributions,
            "owner_changes": self.owners,
            "warnings": self.warnings,
            "errors": self.errors,
        }


def _representative(facts: Sequence[Facts], python: str) -> Facts:
    """The wheel of a distribution that serves `python` (else its first): per-Python wheels differ in their
    extension's tag alone."""
    from locks.targets import serves

    return next((f for f in facts if serves(f.filename, python)), sorted(facts, key=lambda f: f.filename)[0])


def _glibc(tags: Iterable[str]) -> tuple[int, int] | None:
    floors = [
        (int(m[1]), int(m[2]))
        for t in tags
        for p in parse_tag(t)
        if (m := re.match(r"manylinux_(\d+)_(\d+)_", p.platform))
    ]
    legacy = {"manylinux1": (2, 5), "manylinux2010": (2, 12), "manylinux2014": (2, 17)}
    floors += [v for t in tags for p in parse_tag(t) for k, v in legacy.items() if p.platform.startswith(k + "_")]
    return min(floors) if floors else None


def _interpreters(tags: Iterable[str]) -> set[str]:
    return {p.interpreter for t in tags for p in parse_tag(t) if re.fullmatch(r"cp3\d+", p.interpreter)}


def _serves(tags: Iterable[str], interpreter: str) -> bool:
    """Whether a wheel of these tags installs on the interpreter `interpreter` (cp311): the same interpreter
    tag, a pure py3 wheel, or an abi3 wheel of that Python or an older one."""
    m = re.fullmatch(r"cp3(\d+)", interpreter)
    for t in tags:
        for p in parse_tag(t):
            if p.interpreter in (interpreter, "py3", "py2.py3"):
                return True
            n = re.fullmatch(r"cp3(\d+)", p.interpreter)
            if p.abi == "abi3" and m and n and int(n[1]) <= int(m[1]):
                return True
    return interpreter in ("py3", "py2.py3") and bool(tags)


def _archs_of(tags: Iterable[str]) -> set[str]:
    out = set()
    for t in tags:
        for p in parse_tag(t):
            if p.platform != "any":
                out.add(p.platform.split("_", 3)[-1] if p.platform.startswith("manylinux_") else p.platform)
    return out


def _tops(files: Mapping[str, tuple[str, int]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for p, (_, size) in files.items():
        top = p.split("/", 1)[0]
        out[top] = out.get(top, 0) + size
    return out


def _per_sm(cuda: Mapping[str, tuple[tuple[str, ...], tuple[str, ...], int]]) -> dict[str, int]:
    """Bytes of the CUDA libraries by the SASS targets they carry (a library with several: each counted)."""
    out: dict[str, int] = {}
    for sass, ptx, size in cuda.values():
        for arch in (*sass, *(f"ptx:{p}" for p in ptx)):
            out[arch] = out.get(arch, 0) + size
    return dict(sorted(out.items()))


def _before_after(old: Mapping[str, int], new: Mapping[str, int]) -> dict[str, dict[str, int]]:
    return {k: {"before": old.get(k, 0), "after": new.get(k, 0)} for k in sorted(set(old) | set(new))}


def _set_change(old: Iterable[str], new: Iterable[str]) -> dict[str, list[str]]:
    a, b = set(old), set(new)
    return {"added": sorted(b - a), "removed": sorted(a - b)}


def _shown(items: list[str]) -> list[str]:
    return items[:SHOWN]


def compare_one(
    old: Facts | None, new: Facts | None, warn_bytes: int, warn_pct: float
) -> tuple[dict[str, Any], list[str]]:
    """One distribution's entry of the diff and its warnings."""
    ref = new or old
    assert ref is not None
    entry: dict[str, Any] = {"name": ref.name}
    warnings: list[str] = []
    if old is None or new is None:
        entry["status"] = "added" if old is None else "removed"
        entry["version"] = {"before": old.version if old else None, "after": new.version if new else None}
        entry["size"] = {"before": old.size if old else 0, "after": new.size if new else 0}
        return entry, warnings
    entry["status"] = "changed" if (old.version, old.files) != (new.version, new.files) else "unchanged"
    entry["version"] = {"before": old.version, "after": new.version}
    entry["tags"] = {"before": list(old.tags), "after": list(new.tags)}
    if _older(new.version, old.version):
        warnings.append(
            f"{new.name}: {old.version} -> {new.version} goes backwards: `pip install -U` keeps {old.version}, and "
            "only an exact pin moves users (is the predecessor really older?)"
        )
    before_glibc, after_glibc = _glibc(old.tags), _glibc(new.tags)
    if before_glibc and after_glibc and after_glibc > before_glibc:
        warnings.append(
            f"{new.name}: the glibc floor rises from {before_glibc[0]}.{before_glibc[1]} to "
            f"{after_glibc[0]}.{after_glibc[1]} ({old.filename} -> {new.filename}): hosts in between lose it"
        )
    dropped = sorted(i for i in _interpreters(old.tags) if not _serves(new.tags, i))
    if dropped:
        warnings.append(f"{new.name}: no longer serves {', '.join(dropped)} ({new.filename})")
    lost = sorted(_archs_of(old.tags) - _archs_of(new.tags))
    if lost and _archs_of(new.tags):
        warnings.append(f"{new.name}: no longer built for {', '.join(lost)}")
    delta = new.size - old.size
    pct = 100.0 * delta / old.size if old.size else 0.0
    entry["size"] = {
        "before": old.size,
        "after": new.size,
        "delta": delta,
        "percent": round(pct, 2),
        "top_directories": {
            k: v for k, v in _before_after(_tops(old.files), _tops(new.files)).items() if v["before"] or v["after"]
        },
        "cpu_variants": _before_after(old.variants, new.variants),
        "cuda_per_sm": _before_after(_per_sm(old.cuda), _per_sm(new.cuda)),
    }
    if delta > warn_bytes or (delta > 0 and pct > warn_pct):
        warnings.append(
            f"{new.name}: {old.size / 2**20:.2f} -> {new.size / 2**20:.2f} MiB (+{delta / 2**20:.2f} MiB, "
            f"+{pct:.1f}%), over the policy's {warn_bytes / 2**20:g} MiB or {warn_pct:g}% (size.diff_warn_mib/_pct)"
        )
    added = sorted(set(new.files) - set(old.files))
    removed = sorted(set(old.files) - set(new.files))
    changed = sorted(p for p in set(old.files) & set(new.files) if old.files[p][0] != new.files[p][0])
    entry["files"] = {
        "added": len(added),
        "removed": len(removed),
        "changed": len(changed),
        "examples": {"added": _shown(added), "removed": _shown(removed), "changed": _shown(changed)},
    }
    entry["requirements"] = _set_change(old.requires, new.requires)
    entry["exports"] = {
        m: _set_change(old.exports.get(m, ()), new.exports.get(m, ()))
        for m in sorted(set(old.exports) | set(new.exports))
        if old.exports.get(m) != new.exports.get(m)
    }
    entry["cuda"] = {
        m: {"before": _arch_list(old.cuda.get(m)), "after": _arch_list(new.cuda.get(m))}
        for m in sorted(set(old.cuda) | set(new.cuda))
        if (old.cuda.get(m) or ((), (), 0))[:2] != (new.cuda.get(m) or ((), (), 0))[:2]
    }
    entry["cpu_variants"] = _set_change(old.variants, new.variants)
    entry["license"] = {"before": old.license, "after": new.license}
    entry["sbom_components"] = _set_change(old.sbom, new.sbom)
    if new.unread or old.unread:
        entry["symbols_not_read"] = sorted(set(new.unread) | set(old.unread))
    return entry, warnings


def _arch_list(value: tuple[tuple[str, ...], tuple[str, ...], int] | None) -> list[str]:
    if value is None:
        return []
    return [*value[0], *(f"ptx:{p}" for p in value[1])]


def _owners(facts: Iterable[Facts]) -> dict[str, str]:
    out: dict[str, str] = {}
    for f in facts:
        for p in f.files:
            if ".data/" not in p.split("/", 1)[0] + "/":
                out.setdefault(p, f.name)
    return out


def replaced_first(after: str, before: str, facts: Sequence[Facts]) -> bool:
    """Whether installing `after` makes pip replace `before` first, at the version the release ships
    (carriers.graph.Graph.replaced_first over the release's wheels)."""
    from carriers.graph import Graph

    versions = {f.name: f.version for f in facts}
    graph = Graph({f.name: list(f.requires) for f in facts})
    return before in versions and graph.replaced_first(after, before, versions[before])


def compare(old: Sequence[Facts], new: Sequence[Facts], python: str, previous: str) -> Diff:
    """The whole diff of the predecessor's wheels `old` and the release's `new`, each distribution compared
    by its wheel for `python`."""
    from audits.policy import load_policy

    pol = load_policy()
    d = Diff(previous)
    by_old: dict[str, list[Facts]] = {}
    by_new: dict[str, list[Facts]] = {}
    for f in old:
        by_old.setdefault(f.name, []).append(f)
    for f in new:
        by_new.setdefault(f.name, []).append(f)
    for name in sorted(set(by_old) | set(by_new)):
        a = _representative(by_old[name], python) if name in by_old else None
        b = _representative(by_new[name], python) if name in by_new else None
        entry, warnings = compare_one(a, b, pol.diff_warn_bytes, pol.diff_warn_pct)
        d.distributions.append(entry)
        d.warnings += warnings
    before, after = _owners(old), _owners(new)
    moves: dict[tuple[str, str], list[str]] = {}
    for p in sorted(set(before) & set(after)):
        if before[p] != after[p]:
            moves.setdefault((before[p], after[p]), []).append(p)
    for (a_name, b_name), moved in sorted(moves.items()):
        safe = replaced_first(b_name, a_name, new)
        d.owners.append(
            {"before": a_name, "after": b_name, "paths": len(moved), "examples": _shown(moved), "safe_for_pip": safe}
        )
        if safe:
            continue
        if a_name not in by_new:
            why = f"{a_name} is no longer released, so pip never replaces it before {b_name} takes its files"
        else:
            why = f"{b_name} does not require {a_name}=={by_new[a_name][0].version}"
        d.errors.append(
            f"{len(moved)} paths move from {a_name} to {b_name} (e.g. {moved[0]}): {why}, and `pip install -U` "
            f"deletes them when it uninstalls the old {a_name} afterwards (pypa/pip#8509). Fix: make {b_name} "
            f"require {a_name}=={by_new[a_name][0].version if a_name in by_new else 'VERSION'} (carriers.toml), "
            "or keep the paths with their owner"
        )
    return d


def summary(d: Diff | None, limit: int = 12) -> list[str]:
    """The one-screen summary `nox -s release` ends with."""
    if d is None:
        return ["release diff: no predecessor (none named, or none older reachable on PyPI): --previous DIR or "
                "INDEX_URL::NAME==VERSION,..."]  # fmt: skip
    changed = [e for e in d.distributions if e["status"] != "unchanged"]
    lines = [f"release diff against {d.previous}: {len(changed)} of {len(d.distributions)} distributions changed"]
    for e in changed[:limit]:
        v = e["version"]
        size = e.get("size", {})
        grow = f", {size['delta'] / 2**20:+.2f} MiB" if "delta" in size else ""
        files = e.get("files")
        counts = f", files +{files['added']} -{files['removed']} ~{files['changed']}" if files else ""
        lines.append(f"  {e['name']}: {e['status']} {v['before'] or '-'} -> {v['after'] or '-'}{grow}{counts}")
    if len(changed) > limit:
        lines.append(f"  ... and {len(changed) - limit} more (dist/{DIFF})")
    moves = [
        f"{o['before']} -> {o['after']} ({o['paths']} paths{'' if o['safe_for_pip'] else ', UNSAFE'})" for o in d.owners
    ]
    if moves:
        lines.append("  paths changing owner: " + "; ".join(moves))
    lines += [f"  warning: {w}" for w in d.warnings]
    lines += [f"  error: {e}" for e in d.errors]
    return lines


def make(dist: Path, previous: str) -> Diff | None:
    """The diff of the release in `dist` against the predecessor `previous` names (`auto`: the newest older
    release of each of its names on PyPI, where one is reachable; None, said, where none is)."""
    release = distdir.open_release(dist)
    if previous == AUTO:
        found, why = newest_older(release.manifest.versions())
        if found is None:
            print(f"[diff] no predecessor: {why}; name one with --previous", flush=True)
            (dist / DIFF).unlink(missing_ok=True)  # an earlier run's diff, ours to remove: this run has none
            return None
        print(f"[diff] predecessor: {why}", flush=True)
        previous = found
    # locks.previous: PreviousError names what is wrong
    old_wheels, how = previous_wheels(previous, release.manifest.pythons[0])
    print(f"[diff] {len(old_wheels)} wheels of {how} against {len(release.manifest.wheels)} of {dist} ...", flush=True)
    member = _payload_member()  # the policy read once, not per wheel
    old = [read_wheel(w, member) for w in old_wheels]
    new = [read_wheel(dist / w.filename, member) for w in release.manifest.wheels]
    d = compare(old, new, release.manifest.pythons[0], how)
    d.dist_sha256 = release.key()
    return d


def write(dist: Path, d: Diff) -> Path:
    """dist/release-diff.json, written beside and renamed (a reader never sees half of it)."""
    from base import swap

    target = dist / DIFF
    tmp = swap.part(target)
    tmp.write_text(json.dumps(d.as_json(), indent=2) + "\n")
    tmp.replace(target)
    return target


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m release.diff")
    dist_option(p, "the release")
    p.add_argument("--previous", required=True, help="an earlier dist/, a folder of wheels, or URL::NAME==V,...")
    p.add_argument("--json", type=Path, help=f"where to write the diff (default: DIST/{DIFF})")
    args = p.parse_args(argv)
    try:
        d = make(args.dist, args.previous)
    except (StageError, distdir.DistError) as exc:
        return report(exc)
    if d is None:
        return 0
    if args.json:
        args.json.write_text(json.dumps(d.as_json(), indent=2) + "\n")
    else:
        write(args.dist, d)
    print("\n".join(summary(d)))
    return 1 if d.errors else 0


if __name__ == "__main__":
    raise SystemExit(main())
