"""glibc-only facts from auditwheel's manylinux policy data, for the rules about the tag a wheel claims
(tag.manylinux-overclaim, tag.forbidden-symbol) and the release payload's system libraries. Reading
tags, architectures and the verdict for every libc family is audits/platforms.py's."""

from __future__ import annotations

import json
import re
from functools import cache
from typing import Any

from . import platforms
from .platforms import glibc_of
from .readers import ElfFacts


@cache
def _manylinux_policies() -> list[dict[str, Any]]:
    """auditwheel's manylinux policy data (symbol versions, library whitelist)."""
    path = platforms.policy_file("manylinux-policy.json")
    data: list[dict[str, Any]] = json.loads(path.read_text())
    return data


def policy_for(glibc: tuple[int, int]) -> dict[str, Any] | None:
    """The auditwheel policy for the newest manylinux_X_Y not above `glibc`."""
    best = None
    for p in _manylinux_policies():
        ver = glibc_of(p["name"] + "_")
        if ver and ver <= glibc and (best is None or ver > glibc_of(best["name"] + "_")):  # type: ignore[operator]
            best = p
    return best


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
