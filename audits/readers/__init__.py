"""Readers: small pure functions from bytes to frozen facts. They never print
and never decide; analyzers turn facts into findings.

Public names are imported when first used (PEP 562): the packer asks for `list_archs` without
loading the disassembler."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._cuda import cuobjdump_tool, find_cuobjdump, list_archs
    from ._elf import ElfFacts, is_elf, read_elf, read_elf_stream
    from ._isa import FeatureUse, feature_uses
    from ._json import hint, unknown_keys
    from ._python import Lookup, find_lookups
    from ._wheel import Member, WheelFacts, read_wheel

_WHERE = {
    "ElfFacts": "_elf",
    "is_elf": "_elf",
    "read_elf": "_elf",
    "read_elf_stream": "_elf",
    "FeatureUse": "_isa",
    "feature_uses": "_isa",
    "Member": "_wheel",
    "WheelFacts": "_wheel",
    "read_wheel": "_wheel",
    "find_cuobjdump": "_cuda",
    "cuobjdump_tool": "_cuda",
    "list_archs": "_cuda",
    "Lookup": "_python",
    "find_lookups": "_python",
    "hint": "_json",
    "unknown_keys": "_json",
}
__all__ = [
    "ElfFacts",
    "FeatureUse",
    "Lookup",
    "Member",
    "WheelFacts",
    "cuobjdump_tool",
    "feature_uses",
    "find_cuobjdump",
    "find_lookups",
    "hint",
    "is_elf",
    "list_archs",
    "read_elf",
    "read_elf_stream",
    "read_wheel",
    "unknown_keys",
]


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'audits.readers' has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)
