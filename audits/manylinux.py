"""The manylinux verdict for a glibc wheel of one architecture, and version ordering. Every policy fact (the
verdict, the overclaim and forbidden-symbol rules, the release payload's system libraries) is read from
audits/platforms.py's policy objects, for every libc family and architecture."""

from __future__ import annotations

import re

from . import platforms
from .readers import ElfFacts


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
