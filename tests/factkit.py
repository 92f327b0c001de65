"""Made-up reader facts for analyzer unit tests (no build, no file): one builder, every field defaulted."""

from __future__ import annotations

from typing import Any

from audits.readers._elf import ElfFacts


def elf_facts(member: str, **fields: Any) -> ElfFacts:
    """An x86-64 Linux shared object named `member` with nothing in it but what `fields` set."""
    base: dict[str, Any] = {
        "machine": "EM_X86_64",
        "needed": (),
        "rpath": (),
        "runpath": (),
        "soname": "",
        "textrel": False,
        "execstack": False,
        "rwx_segments": (),
        "exports": (),
        "version_needs": (),
        "exec_sections": (),
        "symbols": (),
    }
    return ElfFacts(member=member, **{**base, **fields})
