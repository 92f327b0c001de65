"""Readers: small pure functions from bytes to frozen facts. They never print
and never decide; analyzers turn facts into findings."""

from ._elf import ElfFacts, read_elf
from ._isa import FeatureUse, feature_uses
from ._wheel import Member, WheelFacts, read_wheel

__all__ = ["ElfFacts", "FeatureUse", "Member", "WheelFacts", "feature_uses", "read_elf", "read_wheel"]
