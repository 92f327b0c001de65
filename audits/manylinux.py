"""manylinux facts from auditwheel's own policy data: what each tag allows (symbol versions per
architecture, system libraries), which tag a wheel claims, and the most portable tag its binaries
allow (the verdict `auditwheel show` gives). Pure functions of that data and of reader facts."""

from __future__ import annotations

import json
import re
from functools import cache
from typing import Any

from . import platforms
from .readers import ElfFacts, WheelFacts

_LEGACY = {"manylinux1": (2, 5), "manylinux2010": (2, 12), "manylinux2014": (2, 17)}


@cache
def _manylinux_policies() -> list[dict[str, Any]]:
    """auditwheel's manylinux policy data (symbol versions, library whitelist)."""
    path = platforms.policy_file("manylinux-policy.json")
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
    one out): platforms.verdict for a glibc wheel of that architecture. No ELF: (None, "")."""
    if not elfs:
        return None, ""
    t = platforms.Target("manylinux", arch, platforms.policies("manylinux", arch), "")
    return platforms.verdict(t, elfs, where)


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
