"""Disassembly (iced-x86): which CPUID feature each instruction needs."""

from __future__ import annotations

from dataclasses import dataclass

from ._elf import ElfFacts, iced


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
    if not elf.exec_sections:
        return {}
    iced_x86, feature_names = iced()
    for _name, addr, code in elf.exec_sections:
        for ins in iced_x86.Decoder(64, code, ip=addr):
            if ins.is_invalid:
                continue
            for f in ins.cpuid_features():
                name = feature_names.get(f, str(f))
                counts[name] = counts.get(name, 0) + 1
                if name not in first:
                    first[name] = (ins.ip, str(ins))
    return {n: FeatureUse(n, counts[n], first[n][0], first[n][1], elf.symbol_at(first[n][0])) for n in sorted(counts)}
