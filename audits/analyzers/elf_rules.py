"""Rules 3-4: ELF/ABI hygiene and wheel-relative RPATH resolution."""

from __future__ import annotations

import fnmatch
import posixpath
from collections.abc import Collection

from ..model import Finding
from ..policy import ExternalProvider, Policy
from ..readers import ElfFacts
from ._common import finding


def elf_abi(wheel: str, dist_name: str, elfs: list[ElfFacts], policy: Policy) -> list[Finding]:
    out: list[Finding] = []
    for e in elfs:
        for lib in e.needed:
            for rule in policy.forbidden_needed:
                if fnmatch.fnmatch(lib, rule.pattern) and rule.applies(e.member):
                    out.append(finding("elf.needed-forbidden", wheel, e.member, f"DT_NEEDED {lib}", rule.fix))
        if e.textrel:
            out.append(finding("elf.textrel", wheel, e.member, "has text relocations (DT_TEXTREL)",
                               "compile every object with -fPIC; check hand-written assembly"))  # fmt: skip
        if e.execstack:
            out.append(finding("elf.execstack", wheel, e.member, "requests an executable stack (PT_GNU_STACK RWE)",
                               "link with -Wl,-z,noexecstack and add .note.GNU-stack to assembly sources"))  # fmt: skip
        for i in e.rwx_segments:
            msg = f"program header {i} is a writable+executable PT_LOAD segment"
            out.append(finding("elf.rwx-segment", wheel, e.member, msg,
                               "drop -N/--omagic and custom 'awx' sections from the link"))  # fmt: skip
        if dist_name in policy.exports_applies_to:
            extra = [s for s in e.exports if not any(fnmatch.fnmatchcase(s, p) for p in policy.exports_allowed)]
            if extra:
                shown = ", ".join(extra[:5]) + (f" and {len(extra) - 5} more" if len(extra) > 5 else "")
                msg = f"exports {len(extra)} undeclared symbols: {shown}"
                fix = "build with -fvisibility=hidden and a version script (kernel/cmake/*.map)"
                out.append(finding("elf.exports", wheel, e.member, msg, fix))
    return out


def _search_dirs(e: ElfFacts, member_dir: str) -> tuple[list[str], list[str]]:
    """(resolved in-tree dirs, bad entries) for the ELF's RUNPATH (else RPATH)."""
    entries = e.runpath or e.rpath
    dirs, bad = [], []
    for entry in entries:
        if entry in ("$ORIGIN", "${ORIGIN}") or entry.startswith(("$ORIGIN/", "${ORIGIN}/")):
            rest = entry.split("}", 1)[1] if entry.startswith("${") else entry[len("$ORIGIN") :]
            dirs.append(posixpath.normpath(posixpath.join(member_dir, rest.lstrip("/"))))
        else:
            bad.append(entry)
    return dirs, bad


def rpath(
    wheel: str,
    elfs: list[ElfFacts],
    tree: Collection[str],
    system: Collection[str],
    external: Collection[ExternalProvider] = (),
    always_external: Collection[str] = (),
) -> list[Finding]:
    """Every RPATH entry is $ORIGIN-relative; every non-system DT_NEEDED resolves inside `tree`.

    `tree` holds the paths the ELF files live among: the wheel's members, or a
    CUDA payload's layout once extracted (member names "payload!inner/path").
    `external`: providers this wheel requires whose libraries may resolve outside it.
    """
    out: list[Finding] = []
    by_dir: dict[str, set[str]] = {}
    for path in tree:
        by_dir.setdefault(posixpath.dirname(path), set()).add(posixpath.basename(path))
    for e in elfs:
        member_path = e.member.split("!", 1)[-1]
        prefix = e.member.split("!", 1)[0] + "!" if "!" in e.member else ""
        dirs, bad = _search_dirs(e, posixpath.dirname(member_path))
        for entry in bad:
            out.append(finding(
                "rpath.not-origin", wheel, e.member,
                f"{'RUNPATH' if e.runpath else 'RPATH'} entry {entry!r} is "
                + ("empty (it means the current directory)" if not entry else "not $ORIGIN-relative"),
                "set wheel-relative entries only, e.g. $ORIGIN/../lib (CMake: INSTALL_RPATH, BUILD_WITH_INSTALL_RPATH)",
            ))  # fmt: skip
        for lib in e.needed:
            if lib in system or lib in always_external or "/" in lib:
                continue
            if any(p.preloaded and fnmatch.fnmatch(lib, pat) for p in external for pat in p.libraries):
                continue
            entries = e.runpath or e.rpath
            if any(fnmatch.fnmatch(lib, pat) and p.path and any(x.rstrip("/").endswith(p.path) for x in entries)
                   for p in external for pat in p.libraries):  # fmt: skip
                continue
            if any(lib in by_dir.get(d.lstrip("./") if d != "." else "", set()) or lib in by_dir.get(d, set())
                   for d in dirs):  # fmt: skip
                continue
            out.append(finding(
                "rpath.unresolved", wheel, e.member,
                f"DT_NEEDED {lib} is not a system library and is not found through "
                f"{list(e.runpath or e.rpath) or 'any RPATH'} inside {prefix or 'the wheel'}",
                "vendor it with auditwheel repair, or fix the RPATH so it points at the bundled copy",
            ))  # fmt: skip
    return out
