"""Reporters: render a report; they never decide anything.

Names and messages come from the wheels, so from anyone: every string is shown through
`printable` (control, format and line-separator characters as escapes, so a member name cannot
move the cursor, recolour the terminal or end a line), and in Markdown also through `md_text` /
`md_code` (no heading, table cell, link or comment can be opened from inside a cell). The JSON
report keeps the exact strings."""

from __future__ import annotations

import html
import json
import unicodedata
from typing import Any

_UNSAFE_CATEGORIES = {"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"}
_MD_SPECIAL = set("\\`*_[]<>#|~!&")


def printable(value: object) -> str:
    """`value` as text with every control, format (bidi overrides), surrogate and line/paragraph
    separator character written as a Python escape: what a terminal shows is what the name is."""
    text = str(value)
    if text.isprintable():
        return text
    out = []
    for ch in text:
        if unicodedata.category(ch) in _UNSAFE_CATEGORIES or ch in "\r\n\t":
            code = ord(ch)
            out.append(f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}")
        else:
            out.append(ch)
    return "".join(out)


def md_text(value: object) -> str:
    """`value` for a Markdown table cell: printable, and Markdown's punctuation backslash-escaped."""
    return "".join(f"\\{c}" if c in _MD_SPECIAL else c for c in printable(value))


def md_code(value: object) -> str:
    """`value` as inline code in a Markdown table cell (an HTML code element: a backtick in the name
    cannot close it, a pipe cannot end the cell)."""
    return "<code>" + html.escape(printable(value)).replace("|", "&#124;") + "</code>"


def to_json(report: dict[str, Any]) -> str:
    """The report as stable, sorted JSON (audits/schemas/audit-report.schema.json)."""
    return json.dumps(report, indent=2, sort_keys=True) + "\n"


def to_terminal(report: dict[str, Any]) -> str:
    """The report as a terminal summary: verdict lines, findings with fixes, CPU and CUDA tables."""
    p = printable
    lines = []
    for w in report["wheels"]:
        lines.append(f"{'FAIL' if w['errors'] else 'ok  '} {p(w['filename'])} ({w['size'] / 2**20:.1f} MiB)")
    for f in report["findings"]:
        lines.append(f"  {f['severity']:<7} {f['rule']:<26} {p(f['wheel'])} {p(f['member'])}")
        lines.append(f"          {p(f['message'])}")
        lines.append(f"          fix: {p(f['fix'])}")
    for wheel, cpu in report["cpu_variants"].items():
        lines.append(f"CPU variants of {p(wheel)}:")
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
    e = printable
    lines = [
        f"CUDA payload ({e(payload['manifest'])}): {payload['archive_bytes'] / 2**20:.1f} MiB in "
        f"{len(payload['parts'])} parts"
    ]
    lines += [
        f"  part {e(p['index'])}: {e(p['distribution'])} {e(p['version'])} ({p['size'] / 2**20:.1f} MiB)"
        for p in payload["parts"]
    ]
    coverage: dict[str, dict[str, str | None]] = payload.get("coverage", {})
    if coverage:
        ccs = sorted({cc for row in coverage.values() for cc in row}, key=lambda c: tuple(map(int, c.split("."))))
        lines.append("  " + f"{'archived binary':<56}" + "".join(f"{cc:>14}" for cc in ccs))
        for name, row in sorted(coverage.items()):
            lines.append(
                "  " + f"{e(name):<56}" + "".join(f"{e(row.get(cc) or '-').replace(' SASS', ''):>14}" for cc in ccs)
            )
    return lines


def _fenced(text: str) -> str:
    """Text safe inside a ``` fence: no backtick can close it."""
    return text.replace("`", "\\u0060").replace("<", "\\u003c")


def to_markdown(report: dict[str, Any]) -> str:
    """The report as Markdown for a CI job summary."""
    out = [
        f"## Audit: {'passed' if report['passed'] else 'FAILED'}",
        "",
        "| wheel | size (MiB) | errors | license | SBOM components |",
        "| --- | ---: | ---: | --- | ---: |",
    ]
    out += [
        f"| {md_code(w['filename'])} | {w['size'] / 2**20:.2f} | {w['errors']} | {md_text(w.get('license') or '-')} | "
        f"{'-' if w.get('sbom_components') is None else w['sbom_components']} |"
        for w in report["wheels"]
    ]
    if report["findings"]:
        out += ["", "| severity | rule | wheel | member | message | fix |", "| --- | --- | --- | --- | --- | --- |"]
        out += [
            f"| {f['severity']} | `{f['rule']}` | {md_text(f['wheel'])} | {md_code(f['member'])} | "
            f"{md_text(f['message'])} | {md_text(f['fix'])} |"
            for f in report["findings"]
        ]
    for wheel, cpu in report["cpu_variants"].items():
        out += [
            "",
            f"### CPU variants: {md_code(wheel)}",
            "",
            "| variant | marker | marker used | forbidden |",
            "| --- | --- | --- | ---: |",
        ]
        out += [
            f"| {md_text(n)} | {md_text(v['marker'])} | {'yes' if v['marker_present'] else '**no**'} | "
            f"{len(v['forbidden'])} |"
            for n, v in cpu.items()
            if n != "loader" and v.get("present")
        ]
    if report.get("payload"):
        out += ["", "### CUDA payload", "", "```", *(_fenced(s) for s in _payload_lines(report["payload"])), "```"]
    for wheel, cuda in report["cuda_architectures"].items():
        # json.dumps escapes control characters; a backtick could still close the fence
        out += [
            "",
            f"### CUDA architectures: {md_code(wheel)}",
            "",
            "```json",
            _fenced(json.dumps(cuda, indent=1)),
            "```",
        ]
    return "\n".join(out) + "\n"
