"""Rule 7: the size budget per wheel, and growth against a baseline."""

from __future__ import annotations

from typing import Any

from ..model import Finding
from ..policy import Policy
from ..readers import WheelFacts
from ._common import finding


def size(w: WheelFacts, policy: Policy, baseline: dict[str, Any] | None) -> tuple[list[Finding], dict[str, Any]]:
    """The wheel against its byte budget and, with a baseline, its growth; plus the size breakdown."""
    out: list[Finding] = []
    total = w.size  # bytes of the wheel file, read by the reader
    members = sorted(((m.name, m.size) for m in w.members), key=lambda x: -x[1])
    breakdown: dict[str, Any] = {
        "wheel_bytes": total,
        "installed_bytes": sum(s for _, s in members),
        "members": dict(members[:25]),
    }
    variants = {v.name: m.size for v in policy.variants if (m := w.member(v.member)) is not None}
    if variants:
        breakdown["cpu_variants"] = variants
    if total > policy.wheel_budget_bytes:
        top = ", ".join(f"{n} ({s / 2**20:.1f} MiB)" for n, s in members[:3])
        out.append(
            finding(
                "size.wheel-budget",
                w.filename,
                "",
                f"{total / 2**20:.1f} MiB is over the {policy.wheel_budget_bytes / 2**20:.0f} MiB budget; "
                f"largest: {top}",
                "shrink the largest members (compress the CUDA payload, drop debug info) or raise the budget "
                f"in {policy.source.name} with a reason",
            )
        )
    if baseline is not None:
        old = baseline.get(str(w.name))
        if old:
            growth = 100.0 * (total - old) / old
            breakdown["growth_pct"] = growth
            if growth > policy.growth_threshold_pct:
                out.append(
                    finding(
                        "size.growth",
                        w.filename,
                        "",
                        f"grew {growth:.1f}% ({old} -> {total} bytes), above {policy.growth_threshold_pct}%",
                        "find the member that grew in the report's size breakdown; update the baseline if intended",
                    )
                )
    return out, breakdown
