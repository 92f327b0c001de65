"""Disassembly (iced-x86): which CPUID feature each instruction needs."""

from __future__ import annotations

from dataclasses import dataclass

import iced_x86

from ._elf import ElfFacts

_FEATURE_NAMES = {v: k for k, v in vars(iced_x86.CpuidFeature).items() if not k.startswith("_") and isinstance(v, int)}


@dataclass(frozen=True)
class FeatureUse:
    """How often an executable uses one CPUID feature, and where first."""

    feature: str
    count: int
    address: int  # first use
    instruction: str
    symbol: str


def feature_uses(elf: ElfFacts) -> dict[str, FeatureUse]:
    """Every CPUID feature the executable sections use, with its first use."""
    counts: dict[str, int] = {}
    first: dict[str, tuple[int, str]] = {}
    for _name, addr, code in elf.exec_sections:
        for ins in iced_x86.Decoder(64, code, ip=addr):
            if ins.is_invalid:
                continue
            for f in ins.cpuid_features():
                name = _FEATURE_NAMES.get(f, str(f))
                counts[name] = counts.get(name, 0) + 1
                if name not in first:
                    first[name] = (ins.ip, str(ins))
    return {n: FeatureUse(n, counts[n], first[n][0], first[n][1], elf.symbol_at(first[n][0])) for n in sorted(counts)}
