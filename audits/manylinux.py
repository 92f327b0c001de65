"""manylinux facts from auditwheel's own policy data: what each tag allows (symbol versions per
architecture, system libraries), which tag a wheel claims, and the most portable tag its binaries
allow (the verdict `auditwheel show` gives). Pure functions of that data and of reader facts."""

from __future__ import annotations

import importlib.resources
import json
import re
from functools import cache
from typing import Any

from .readers import ElfFacts, WheelFacts
from .readers._elf import is_loader

_LEGACY = {"manylinux1": (2, 5), "manylinux2010": (2, 12), "manylinux2014": (2, 17)}


@cache
def _manylinux_policies() -> list[dict[str, Any]]:
    """auditwheel's manylinux policy data (symbol versions, library whitelist)."""
    path = importlib.resources.files("auditwheel.policy") / "manylinux-policy.json"
    data: list[dict[str, Any]] = json.loads(path.read_text())
    return data


def glibc_of(platform: str) -> tuple[int, int] | None:
    """The glibc (major, minor) a manylinux platform tag names, or None for other tags."""
    for legacy, ver in _LEGACY.items():
        if platform.startswith(legacy + "_"):
            return ver
    m = re.match(r"manylinux_(\d+)_(\d+)_", platform)
    return (int(m.group(1)), int(m.group(2))) if m else None


def policy_for(glibc: tuple[int, int]) -> dict[str, Any] | None:
    """The auditwheel policy for the newest manylinux_X_Y not above `glibc`."""
    best = None
    for p in _manylinux_policies():
        ver = glibc_of(p["name"] + "_")
        if ver and ver <= glibc and (best is None or ver > glibc_of(best["name"] + "_")):  # type: ignore[operator]
            best = p
    return best


def system_libraries(w: WheelFacts) -> frozenset[str]:
    """The system libraries the wheel's most portable claimed tag allows to need."""
    return system_libraries_for([t.platform for t in w.tags])


def system_libraries_for(platforms: list[str]) -> frozenset[str]:
    """The manylinux policy's system libraries for the most portable of `platforms`."""
    claimed = [g for p in platforms if (g := glibc_of(p))]
    pol = policy_for(min(claimed)) if claimed else None
    libs = set(pol["lib_whitelist"]) if pol else set(_manylinux_policies()[-1]["lib_whitelist"])
    return frozenset(libs | {"ld-linux-x86-64.so.2"})


def admits(pol: dict[str, Any], version: str, arch: str = "x86_64") -> bool:
    """Whether manylinux policy `pol` allows the symbol version, e.g. "GLIBC_2.34", on `arch`."""
    prefix, _, num = version.partition("_")
    allowed = pol["symbol_versions"].get(arch, {})
    return prefix not in allowed or num in allowed[prefix]


@cache
def most_portable_first() -> tuple[dict[str, Any], ...]:
    """auditwheel's manylinux policies, most portable first."""
    return tuple(sorted(_manylinux_policies(), key=lambda p: p["priority"], reverse=True))


@cache
def forbidden_symbols() -> frozenset[str]:
    """Every symbol some manylinux policy forbids a library to use (auditwheel's "blacklist")."""
    return frozenset(s for p in _manylinux_policies() for syms in p.get("blacklist", {}).values() for s in syms)


def forbidden_uses(pol: dict[str, Any], e: ElfFacts) -> list[tuple[str, str]]:
    """(library, symbol) pairs `pol` forbids that `e` uses: as auditwheel, an undefined symbol of
    the ELF named in the blacklist of a library it needs."""
    black = pol.get("blacklist", {})
    used = set(e.forbidden_candidates)
    return sorted((lib, s) for lib in e.needed if lib in black for s in used & set(black[lib]))


def honest_platform(
    elfs: list[ElfFacts], where: dict[tuple[str, str], str | None] | None = None, arch: str = "x86_64"
) -> tuple[str | None, str]:
    """(the most portable manylinux tag for `arch` the ELF files allow, what keeps a more portable
    one out), by auditwheel's policy data and rules: every symbol version needed from a library
    outside the wheel is allowed, and every library outside the wheel is a system library of that
    tag (one that resolves nowhere, or only elsewhere on this machine, makes it linux_<arch>).
    `where`: elf_rules.load_chains (None: every DT_NEEDED counts as outside). No ELF: (None, "")."""
    if not elfs:
        return None, ""
    isa = next((e for e in elfs if e.isa_needed), None)
    if isa is not None:  # auditwheel's machine policy: no manylinux tag for an ISA extension level
        return f"linux_{arch}", f"{isa.member} declares {isa.isa_needed} in its GNU property note (ISA_1_NEEDED)"
    where = where or {}
    outside = [
        (e.member, lib) for e in elfs for lib in e.needed if where.get((e.member, lib)) is None and not is_loader(lib)
    ]
    inside_names = {(e.member, lib) for e in elfs for lib in e.needed if where.get((e.member, lib)) is not None}
    versions = [
        (e.member, lib, v)
        for e in elfs
        for lib, vs in e.version_needs
        if (e.member, lib) not in inside_names
        for v in vs
    ]
    reason = ""
    for pol in most_portable_first():
        if pol["name"] == "linux" or arch not in pol["symbol_versions"]:
            continue
        bad_lib = next(((m, lib) for m, lib in outside if lib not in pol["lib_whitelist"]), None)
        bad_sym = next(((m, lib, v) for m, lib, v in versions if not admits(pol, v, arch)), None)
        bad_use = next(((e.member, use) for e in elfs for use in forbidden_uses(pol, e)), None)
        if bad_lib is None and bad_sym is None and bad_use is None:
            return f"{pol['name']}_{arch}", reason
        # Kept from the last failure before the verdict: what the next more portable tag lacks.
        if bad_lib is not None:
            reason = (
                f"{bad_lib[1]} (needed by {bad_lib[0]}) is neither in the wheel nor a system library of {pol['name']}"
            )
        elif bad_sym is not None:
            reason = f"{bad_sym[2]} from {bad_sym[1]} (needed by {bad_sym[0]}) is newer than {pol['name']} allows"
        elif bad_use is not None:
            reason = f"{bad_use[0]} uses {bad_use[1][1]} of {bad_use[1][0]}, which {pol['name']} forbids"
    return f"linux_{arch}", reason


def version_key(v: str) -> tuple[int, ...]:
    """A version string as a tuple of its numbers, for ordering."""
    return tuple(int(x) for x in re.findall(r"\d+", v))


# platform-tag architecture -> (e_machine, ELF class, little endian)
ARCH = {
    "x86_64": ("EM_X86_64", 64, True),
    "i686": ("EM_386", 32, True),
    "aarch64": ("EM_AARCH64", 64, True),
    "ppc64le": ("EM_PPC64", 64, True),
    "ppc64": ("EM_PPC64", 64, False),
    "s390x": ("EM_S390", 64, False),
    "armv7l": ("EM_ARM", 32, True),
    "riscv64": ("EM_RISCV", 64, True),
}


def tag_architectures(w: WheelFacts) -> set[str]:
    """The architectures the platform tags name (x86_64, aarch64, ...)."""
    out = set()
    for t in w.tags:
        for arch in ARCH:
            if t.platform.endswith("_" + arch):
                out.add(arch)
    return out
