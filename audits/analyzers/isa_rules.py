"""Rule 5: instruction-level ISA per CPU variant, a baseline-only loader, and the libraries a baseline x86-64
wheel loads (sampled: what auditwheel, which reads ISA notes only, cannot see)."""

from __future__ import annotations

import fnmatch
from collections.abc import Collection, Mapping
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


def _size(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n >= 1 << 20 else f"{n / 1024:.1f} KiB"


def grafts(
    wheel: str,
    elfs: list[ElfFacts],
    where: Mapping[tuple[str, str], str | None],
    unused: Collection[str],
    policy: Policy,
) -> list[Finding]:
    """Every library the wheel's own ELF files load (grafted into <pkg>.libs/, or bundled), whose sampled code
    uses instructions above x86-64 baseline that no ISA note declares: a warning when nothing in it chooses
    code at run time (on an older CPU the import dies with "Illegal instruction"; a manylinux_2_34 image builds
    what it grafts for x86-64-v2), info when it dispatches (cpuid, getauxval, ifuncs: expected)."""
    by_path = {e.member: e for e in elfs}
    loaders: dict[str, str] = {}
    for (member, _lib), found in sorted(where.items()):
        if found and found != member:
            loaders.setdefault(found, member)
    out: list[Finding] = []
    for lib, loader in sorted(loaders.items()):
        e = by_path.get(lib)
        if e is None or e.member in unused or e.isa_needed or e.isa_sample is None:
            continue  # a declared level is the verdict's (platforms.verdict); unsampled: nothing to say
        s = e.isa_sample
        above = [(f, n, at, ins) for f, n, at, ins in s.features if f not in policy.baseline]
        if not above:
            continue
        feature, count, at, ins = above[0]
        names = ", ".join(f for f, *_ in above[:6]) + (f" and {len(above) - 6} more" if len(above) > 6 else "")
        sampled = f"{_size(s.sampled_bytes)} of {_size(s.code_bytes)} of its code decoded"
        what = f"{ins} ({feature}) at {at:#x}, {count} instruction(s); in all: {names}"
        if s.dispatch:
            out.append(
                finding(
                    "isa.graft-dispatch",
                    wheel,
                    lib,
                    f"loaded by {loader}, uses instructions above x86-64 baseline ({what}) and chooses its code at "
                    f"run time ({s.dispatch}); {sampled}",
                    "nothing to fix if every such path is guarded by its CPU check",
                    "info",
                )
            )
            continue
        out.append(
            finding(
                "isa.graft-above-baseline",
                wheel,
                lib,
                f"loaded by {loader}, uses {what}: above the x86-64 baseline the wheel's tag promises, with no ISA "
                f"note to say so and nothing that chooses code at run time; on a CPU without {feature} the import "
                f"dies with Illegal instruction (auditwheel reads ISA notes only); {sampled}",
                "rebuild it for baseline x86-64 (-march=x86-64; a manylinux_2_34 image defaults to x86-64-v2), or "
                "dispatch on the CPU at run time",
                "warning",
            )
        )
    return out
