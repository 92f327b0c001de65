"""Rules 3-4: ELF/ABI hygiene and wheel-relative RPATH resolution."""

from __future__ import annotations

import fnmatch
import posixpath
from collections.abc import Collection
from dataclasses import dataclass

from ..model import Finding
from ..policy import ExternalProvider, Policy
from ..readers import ElfFacts
from ..readers._elf import is_loader
from ._common import finding


def elf_abi(wheel: str, dist_name: str, elfs: list[ElfFacts], policy: Policy) -> list[Finding]:
    """Forbidden DT_NEEDED, text relocations, executable stacks, RWX segments and undeclared exports."""
    out: list[Finding] = []
    for e in elfs:
        for lib in e.needed:
            for rule in policy.forbidden_needed:
                if fnmatch.fnmatch(lib, rule.pattern) and rule.applies(e.member):
                    out.append(finding("elf.needed-forbidden", wheel, e.member, f"DT_NEEDED {lib}", rule.fix))
        if e.textrel:
            out.append(
                finding(
                    "elf.textrel",
                    wheel,
                    e.member,
                    "has text relocations (DT_TEXTREL)",
                    "compile every object with -fPIC; check hand-written assembly",
                )
            )
        if e.execstack:
            out.append(
                finding(
                    "elf.execstack",
                    wheel,
                    e.member,
                    "requests an executable stack (PT_GNU_STACK RWE)",
                    "link with -Wl,-z,noexecstack and add .note.GNU-stack to assembly sources",
                )
            )
        for i in e.rwx_segments:
            msg = f"program header {i} is a writable+executable PT_LOAD segment"
            out.append(
                finding(
                    "elf.rwx-segment", wheel, e.member, msg, "drop -N/--omagic and custom 'awx' sections from the link"
                )
            )
        if dist_name in policy.exports_applies_to:
            extra = [s for s in e.exports if not any(fnmatch.fnmatchcase(s, p) for p in policy.exports_allowed)]
            if extra:
                shown = ", ".join(extra[:5]) + (f" and {len(extra) - 5} more" if len(extra) > 5 else "")
                msg = f"exports {len(extra)} undeclared symbols: {shown}"
                fix = "build with -fvisibility=hidden and a version script (kernel/cmake/*.map)"
                out.append(finding("elf.exports", wheel, e.member, msg, fix))
    return out


def _origin_dirs(entries: tuple[str, ...], member_dir: str) -> tuple[list[str], list[str]]:
    """(in-tree dirs, entries that are not $ORIGIN-relative) of RPATH or RUNPATH entries."""
    dirs, bad = [], []
    for entry in entries:
        if entry in ("$ORIGIN", "${ORIGIN}") or entry.startswith(("$ORIGIN/", "${ORIGIN}/")):
            rest = entry.split("}", 1)[1] if entry.startswith("${") else entry[len("$ORIGIN") :]
            dirs.append(posixpath.normpath(posixpath.join(member_dir, rest.lstrip("/"))))
        else:
            bad.append(entry)
    return dirs, bad


def _path(member: str) -> str:
    """The file's path among its tree (a payload member "payload!inner/path" -> "inner/path")."""
    return member.split("!", 1)[-1]


@dataclass(frozen=True)
class Chains:
    """Where each (ELF member, DT_NEEDED) resolves inside the tree (its path, or None), and the ELF files
    nothing loads: member -> (an ELF that needs its name, the file that name resolves to instead)."""

    where: dict[tuple[str, str], str | None]
    unused: dict[str, tuple[str, str]]


def load_chains(elfs: list[ElfFacts], tree: Collection[str]) -> Chains:
    """Where each (ELF member, DT_NEEDED) resolves inside `tree` (its path) or None, following
    glibc's search through every load chain: an object with DT_RUNPATH searches it alone (glibc applies
    it to the object's own DT_NEEDED only; auditwheel's lddtree also passes it down, a difference
    docs/audit-platforms.md names); an object without searches its own DT_RPATH and then the DT_RPATH of
    each object that loaded it; a name already loaded in the chain is reused (breadth-first, like ld.so).

    Chains start at the wheel's roots, as auditwheel's do: the ELF files no other ELF of the tree needs by
    name (extension modules, executables, libraries loaded with dlopen). An ELF file whose name is needed
    but resolves to another file in every chain (a duplicate a repair left behind) is loaded by nothing:
    it is `unused`, and what it needs decides nothing. One loaded only by a cycle of its own is judged on
    its own search path."""
    by_path = {_path(e.member): e for e in elfs}
    files = {posixpath.normpath(p) for p in tree}
    needed_names = {lib for e in elfs for lib in e.needed}
    roots = [
        e
        for e in elfs
        if posixpath.basename(_path(e.member)) not in needed_names and (not e.soname or e.soname not in needed_names)
    ]
    out: dict[tuple[str, str], str | None] = {}
    seen_roots: set[str] = set()

    def walk(root: ElfFacts) -> None:
        loaded: dict[str, str] = {}  # soname or file name -> path
        queue: list[tuple[ElfFacts, tuple[str, ...]]] = [(root, ())]
        visited: set[str] = set()
        while queue:
            obj, inherited = queue.pop(0)
            here = _path(obj.member)
            if here in visited:
                continue
            visited.add(here)
            seen_roots.add(here)
            loaded.setdefault(posixpath.basename(here), here)
            if obj.soname:
                loaded.setdefault(obj.soname, here)
            own_dirs = _origin_dirs(obj.runpath or obj.rpath, posixpath.dirname(here))[0]
            chain = inherited + (() if obj.runpath else tuple(own_dirs))
            search = own_dirs if obj.runpath else [*own_dirs, *inherited]
            for lib in obj.needed:
                found = loaded.get(lib)
                if found is None:
                    found = next(
                        (c for d in search if (c := posixpath.normpath(posixpath.join(d, lib))) in files), None
                    )
                key = (obj.member, lib)
                if found is None or out.get(key, found) is None:
                    out[key] = None  # unresolved in any chain: the import through that chain fails
                else:
                    out.setdefault(key, found)
                if found is not None:
                    loaded.setdefault(lib, found)
                    child = by_path.get(found)
                    if child is not None:
                        queue.append((child, chain))

    for r in roots:
        walk(r)
    unused: dict[str, tuple[str, str]] = {}
    for e in elfs:
        here = _path(e.member)
        if here in seen_roots:
            continue
        names = {posixpath.basename(here), *([e.soname] if e.soname else [])}
        other = next(((m, f) for (m, lib), f in sorted(out.items()) if lib in names and f and f != here), None)
        if other is not None:
            unused[e.member] = other
    for e in elfs:  # loaded only by a cycle of its own: judge it on its own search path
        if _path(e.member) not in seen_roots and e.member not in unused:
            walk(e)
    return Chains(out, unused)


def _runpath_note(e: ElfFacts, lib: str, chains: Chains, elfs: list[ElfFacts]) -> str:
    """Where auditwheel's lddtree would find `lib` and glibc does not: through the RUNPATH of an ELF that
    loads `e` (glibc applies DT_RUNPATH to its object's own DT_NEEDED only)."""
    loaders = {m for (m, _), f in chains.where.items() if f == _path(e.member)}
    for parent in elfs:
        if parent.member in loaders and parent.runpath:
            dirs = _origin_dirs(parent.runpath, posixpath.dirname(_path(parent.member)))[0]
            if any(posixpath.normpath(posixpath.join(d, lib)) in {_path(x.member) for x in elfs} for d in dirs):
                return (
                    f"; {parent.member}'s RUNPATH holds it, which auditwheel follows down the chain but the "
                    "loader does not (DT_RUNPATH applies to its own object's needs only): set RPATH, or a "
                    f"RUNPATH on {posixpath.basename(_path(e.member))} itself"
                )
    return ""


def rpath(
    wheel: str,
    elfs: list[ElfFacts],
    tree: Collection[str],
    system: Collection[str],
    external: Collection[ExternalProvider] = (),
    always_external: Collection[str] = (),
) -> list[Finding]:
    """Every RPATH entry is $ORIGIN-relative; every non-system DT_NEEDED resolves inside `tree`
    through its load chain (see load_chains).

    `tree` holds the paths the ELF files live among: the wheel's members, or a
    CUDA payload's layout once extracted (member names "payload!inner/path").
    `external`: providers this wheel requires whose libraries may resolve outside it.
    """
    out: list[Finding] = []
    chains = load_chains(elfs, tree)
    where = chains.where
    for member, (needer, other) in sorted(chains.unused.items()):
        out.append(
            finding(
                "elf.unused",
                wheel,
                member,
                f"nothing loads it: {posixpath.basename(_path(member))} resolves to {_path(other)} for "
                f"{_path(needer)}, and nothing else needs it (a copy left beside the one the wheel loads); "
                "what it needs decides nothing",
                "remove the duplicate (repair the wheel once, after every edit)",
                "info",
            )
        )
    for e in elfs:
        if e.member in chains.unused:
            continue  # never loaded: its own needs cannot break an import
        prefix = e.member.split("!", 1)[0] + "!" if "!" in e.member else ""
        _dirs, bad = _origin_dirs(e.runpath or e.rpath, posixpath.dirname(_path(e.member)))
        for entry in bad:
            out.append(
                finding(
                    "rpath.not-origin",
                    wheel,
                    e.member,
                    f"{'RUNPATH' if e.runpath else 'RPATH'} entry {entry!r} is "
                    + ("empty (it means the current directory)" if not entry else "not $ORIGIN-relative"),
                    "set wheel-relative entries only, e.g. $ORIGIN/../lib "
                    "(CMake: INSTALL_RPATH, BUILD_WITH_INSTALL_RPATH)",
                )
            )
        for lib in e.needed:
            if lib in system or lib in always_external or "/" in lib or is_loader(lib):
                continue
            if any(p.preloaded and fnmatch.fnmatch(lib, pat) for p in external for pat in p.libraries):
                continue
            entries = e.runpath or e.rpath
            if any(
                fnmatch.fnmatch(lib, pat) and p.path and any(x.rstrip("/").endswith(p.path) for x in entries)
                for p in external
                for pat in p.libraries
            ):
                continue
            if where.get((e.member, lib)) is not None:
                continue
            out.append(
                finding(
                    "rpath.unresolved",
                    wheel,
                    e.member,
                    f"DT_NEEDED {lib} is not a system library and is not found through "
                    f"{list(e.runpath or e.rpath) or 'any RPATH'} (or the RPATH of what loads it) inside "
                    f"{prefix or 'the wheel'}" + _runpath_note(e, lib, chains, elfs),
                    "vendor it with auditwheel repair, or fix the RPATH so it points at the bundled copy",
                )
            )
    return out
