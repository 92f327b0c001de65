"""Rule 5: instruction-level ISA per CPU variant, and a baseline-only loader."""

from __future__ import annotations

import fnmatch
from typing import Any

from ..model import Finding
from ..policy import Policy
from ..readers import ElfFacts, FeatureUse, feature_uses
from ._common import finding


def _use_text(u: FeatureUse) -> str:
    return f"{u.instruction} ({u.feature}) at {u.address:#x} in {u.symbol}"


def disassembled_members(elfs: dict[str, ElfFacts], policy: Policy) -> dict[str, dict[str, FeatureUse]]:
    """Feature use of every CPU variant and loader library: disassembled once, shared by
    the ISA rule and the build-manifest rule."""
    variants = {v.member for v in policy.variants}
    return {
        name: feature_uses(e)
        for name, e in elfs.items()
        if name in variants or any(fnmatch.fnmatch(name, p) for p in policy.loader_members)
    }


def isa(wheel: str, uses_of: dict[str, dict[str, FeatureUse]], policy: Policy) -> tuple[list[Finding], dict[str, Any]]:
    """Findings, and the report's CPU-variant section. uses_of: disassembled_members()."""
    out: list[Finding] = []
    section: dict[str, Any] = {}
    variant_members = {v.member for v in policy.variants}
    if not any(m in uses_of for m in variant_members):
        return out, section  # not a kt-kernel wheel
    for v in policy.variants:
        if v.member not in uses_of:
            out.append(
                finding(
                    "isa.variant-missing",
                    wheel,
                    v.member,
                    f"CPU variant {v.name} is not in the wheel",
                    "build all six variants (nox -s build_cpu without --variant)",
                )
            )
            section[v.name] = {"present": False}
            continue
        uses = uses_of[v.member]
        forbidden = [u for f, u in uses.items() if f not in v.allowed]
        for u in forbidden:
            out.append(
                finding(
                    "isa.forbidden-feature",
                    wheel,
                    v.member,
                    f"{v.name} variant uses {_use_text(u)}, {u.count} instruction(s) need {u.feature}",
                    f"check that kernel/CMakeLists.txt gives kt_cpu_{v.name} no flag enabling {u.feature}, "
                    "and that no shared object compiled with it is linked in",
                )
            )
        if v.marker not in uses:
            out.append(
                finding(
                    "isa.marker-missing",
                    wheel,
                    v.member,
                    f"{v.name} variant contains no {v.marker} instruction: it is mislabeled",
                    f"make the {v.name} hot loop use {v.marker} (kernel/src/cpu/dot.h), or drop the variant",
                )
            )
        section[v.name] = {
            "present": True,
            "member": v.member,
            "allowed": sorted(v.features),
            "marker": v.marker,
            "marker_present": v.marker in uses,
            "features_used": {f: u.count for f, u in uses.items()},
            "forbidden": [_use_text(u) for u in forbidden],
        }
    for name, uses in uses_of.items():
        if not any(fnmatch.fnmatch(name, p) for p in policy.loader_members):
            continue
        above = [u for f, u in uses.items() if f not in policy.baseline and f not in policy.loader_guarded]
        for u in above:
            out.append(
                finding(
                    "isa.loader-above-baseline",
                    wheel,
                    name,
                    f"loader uses {_use_text(u)}; it runs before the CPU check, so an older CPU would SIGILL",
                    "compile kernel/src/core with no -m ISA flags and no LTO (kernel/CMakeLists.txt, KT_ISA_RESET)",
                )
            )
        section["loader"] = {
            "member": name,
            "features_used": {f: u.count for f, u in uses.items()},
            "above_baseline": [_use_text(u) for u in above],
        }
    return out, section
