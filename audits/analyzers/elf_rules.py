"""Rules 3-4: ELF/ABI hygiene and wheel-relative RPATH resolution."""

from __future__ import annotations

import fnmatch
import posixpath
from collections.abc import Collection

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


def load_chains(elfs: list[ElfFacts], tree: Collection[str]) -> dict[tuple[str, str], str | None]:
    """Where each (ELF member, DT_NEEDED) resolves inside `tree` (its path) or None, following
    glibc's search through every load chain: an object with DT_RUNPATH searches it alone; an
    object without searches its own DT_RPATH and then the DT_RPATH of each object that loaded
    it; a name already loaded in the chain is reused (breadth-first, like ld.so). Chains start at
    the ELF files no other ELF of the tree needs (the extensions Python loads)."""
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
    for e in elfs:  # loaded only by a cycle of its own: judge it on its own search path
        if _path(e.member) not in seen_roots:
            walk(e)
    return out


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
    where = load_chains(elfs, tree)
    for e in elfs:
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
                    f"{prefix or 'the wheel'}",
                    "vendor it with auditwheel repair, or fix the RPATH so it points at the bundled copy",
                )
            )
    return out
