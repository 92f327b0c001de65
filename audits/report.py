"""Reporters: render a report; they never decide anything."""

from __future__ import annotations

import json
from typing import Any


def to_json(report: dict[str, Any]) -> str:
    """The report as stable, sorted JSON (audits/schemas/audit-report.schema.json)."""
    return json.dumps(report, indent=2, sort_keys=True) + "\n"


def to_terminal(report: dict[str, Any]) -> str:
    """The report as a terminal summary: verdict lines, findings with fixes, CPU and CUDA tables."""
    lines = []
    for w in report["wheels"]:
        lines.append(f"{'FAIL' if w['errors'] else 'ok  '} {w['filename']} ({w['size'] / 2**20:.1f} MiB)")
    for f in report["findings"]:
        lines.append(f"  {f['severity']:<7} {f['rule']:<26} {f['wheel']} {f['member']}")
        lines.append(f"          {f['message']}")
        lines.append(f"          fix: {f['fix']}")
    for wheel, cpu in report["cpu_variants"].items():
        lines.append(f"CPU variants of {wheel}:")
        for name, v in cpu.items():
            if name == "loader":
                lines.append(f"  loader: above baseline: {v['above_baseline'] or 'nothing'}")
            elif v.get("present"):
                lines.append(
                    f"  {name:<12} marker {v['marker']}: {'yes' if v['marker_present'] else 'NO'}; "
                    f"forbidden: {len(v['forbidden'])}"
                )
    lines += _payload_lines(report.get("payload") or {})
    errors = sum(f["severity"] == "error" for f in report["findings"])
    lines.append(
        f"{'PASSED' if report['passed'] else 'FAILED'}: {len(report['wheels'])} wheels, {errors} errors, "
        f"{len(report['findings']) - errors} other findings, {report['elapsed_s']:.1f}s"
    )
    return "\n".join(lines) + "\n"


def _payload_lines(payload: dict[str, Any]) -> list[str]:
    """The lazy CUDA archive: its parts, and per binary what runs on each compute capability."""
    if not payload:
        return []
    lines = [
        f"CUDA payload ({payload['manifest']}): {payload['archive_bytes'] / 2**20:.1f} MiB in "
        f"{len(payload['parts'])} parts"
    ]
    lines += [
        f"  part {p['index']}: {p['distribution']} {p['version']} ({p['size'] / 2**20:.1f} MiB)"
        for p in payload["parts"]
    ]
    coverage: dict[str, dict[str, str | None]] = payload.get("coverage", {})
    if coverage:
        ccs = sorted({cc for row in coverage.values() for cc in row}, key=lambda c: tuple(map(int, c.split("."))))
        lines.append("  " + f"{'archived binary':<56}" + "".join(f"{cc:>14}" for cc in ccs))
        for name, row in sorted(coverage.items()):
            lines.append(
                "  " + f"{name:<56}" + "".join(f"{(row.get(cc) or '-').replace(' SASS', ''):>14}" for cc in ccs)
            )
    return lines


def to_markdown(report: dict[str, Any]) -> str:
    """The report as Markdown for a CI job summary."""
    out = [
        f"## Audit: {'passed' if report['passed'] else 'FAILED'}",
        "",
        "| wheel | size (MiB) | errors |",
        "| --- | ---: | ---: |",
    ]
    out += [f"| `{w['filename']}` | {w['size'] / 2**20:.2f} | {w['errors']} |" for w in report["wheels"]]
    if report["findings"]:
        out += ["", "| severity | rule | wheel | member | message | fix |", "| --- | --- | --- | --- | --- | --- |"]
        out += [
            f"| {f['severity']} | `{f['rule']}` | {f['wheel']} | `{f['member']}` | {f['message']} | {f['fix']} |"
            for f in report["findings"]
        ]
    for wheel, cpu in report["cpu_variants"].items():
        out += [
            "",
            f"### CPU variants: `{wheel}`",
            "",
            "| variant | marker | marker used | forbidden |",
            "| --- | --- | --- | ---: |",
        ]
        out += [
            f"| {n} | {v['marker']} | {'yes' if v['marker_present'] else '**no**'} | {len(v['forbidden'])} |"
            for n, v in cpu.items()
            if n != "loader" and v.get("present")
        ]
    if report.get("payload"):
        out += ["", "### CUDA payload", "", "```", *_payload_lines(report["payload"]), "```"]
    for wheel, cuda in report["cuda_architectures"].items():
        out += ["", f"### CUDA architectures: `{wheel}`", "", "```json", json.dumps(cuda, indent=1), "```"]
    return "\n".join(out) + "\n"
