"""The release candidate on one screen, and as Markdown/HTML with a size chart.

Reads dist/manifest.json (carriers), dist/audit-report.json (verdicts) and
build/verify.json (install verification); writes dist/release-report.md and
dist/release-report.html (an inline SVG bar chart: wheel sizes, and the
kt-kernel wheel broken down into CPU variants, CUDA payload and the rest).
"""

from __future__ import annotations

import argparse
import html
import json
import sys
import zipfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def _load(path: Path) -> Any:
    return json.loads(path.read_text()) if path.exists() else None


def kernel_breakdown(dist: Path, manifest: dict[str, Any]) -> dict[str, int]:
    kt = next((w for w in manifest["wheels"] if w["name"] == "kt-kernel"), None)
    if kt is None:
        return {}
    out = {"CPU variants": 0, "CUDA payload": 0, "baseline core": 0, "other": 0}
    with zipfile.ZipFile(dist / kt["filename"]) as zf:
        for i in zf.infolist():
            key = (
                "CPU variants"
                if "/cpu/" in i.filename
                else "CUDA payload"
                if "cuda_archive" in i.filename
                else "baseline core"
                if "_core." in i.filename
                else "other"
            )
            out[key] += i.compress_size
    return out


def svg_bars(items: list[tuple[str, int]], title: str) -> str:
    width, bar_h, label_w = 720, 22, 300
    top = max((v for _, v in items), default=1) or 1
    rows = []
    for i, (label, value) in enumerate(items):
        y = 30 + i * (bar_h + 6)
        w = max(1, int((width - label_w - 90) * value / top))
        rows.append(
            f'<text x="0" y="{y + 15}" font-size="12">{html.escape(label)}</text>'
            f'<rect x="{label_w}" y="{y}" width="{w}" height="{bar_h}" fill="#4a7bd0"/>'
            f'<text x="{label_w + w + 6}" y="{y + 15}" font-size="12">{value / 2**20:.2f} MiB</text>'
        )
    h = 40 + len(items) * (bar_h + 6)
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{h}" font-family="sans-serif">'
        f'<text x="0" y="16" font-size="14" font-weight="bold">{html.escape(title)}</text>{"".join(rows)}</svg>'
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="nox -s release_report --")
    p.add_argument("--dist", type=Path, default=ROOT / "dist")
    p.add_argument("--verify", type=Path, default=ROOT / "build" / "verify.json")
    args = p.parse_args(argv)
    manifest = _load(args.dist / "manifest.json")
    if manifest is None:
        print(f"error: {args.dist}/manifest.json is missing; run nox -s build_all", file=sys.stderr)
        return 1
    audit = _load(args.dist / "audit-report.json") or {}
    verify = _load(args.verify) or {}
    errors: dict[str, int] = {w["filename"]: w["errors"] for w in audit.get("wheels", [])}
    lines = [f"KT release {manifest['kt_version']}  (torch {manifest['torch']})", ""]
    md = [
        f"# KT release {manifest['kt_version']}",
        "",
        f"torch: `{manifest['torch']}`",
        "",
        "| carrier | version | kind | size (MiB) | sha256 | audit |",
        "| --- | --- | --- | ---: | --- | --- |",
    ]
    width = max(len(w["name"]) for w in manifest["wheels"])
    for w in manifest["wheels"]:
        verdict = "pass" if errors.get(w["filename"]) == 0 else ("FAIL" if w["filename"] in errors else "not audited")
        lines.append(
            f"{w['name']:<{width}}  {w['version']:<14} {w['kind']:<8} {w['size'] / 2**20:7.2f} MiB  "
            f"{w['sha256'][:16]}  audit: {verdict}"
        )
        md.append(
            f"| {w['name']} | {w['version']} | {w['kind']} | {w['size'] / 2**20:.2f} | `{w['sha256'][:16]}` "
            f"| {verdict} |"
        )
    lines.append("")
    pl = manifest.get("payload")
    if pl:
        parts = ", ".join(f"{p['distribution']} {p['size'] / 2**20:.1f}" for p in pl["parts"])
        line = (f"CUDA payload: {pl['files']} files, {pl['extracted_size'] / 2**20:.0f} MiB -> "
                f"{pl['archive_size'] / 2**20:.1f} MiB zstd in {len(pl['parts'])} parts (MiB: {parts})")  # fmt: skip
        lines.append(line)
        md.append(f"\n- {line}")
    lines.append(
        f"audit: {'PASSED' if audit.get('passed') else 'FAILED or missing'} "
        f"({len(audit.get('findings', []))} findings, {audit.get('elapsed_s', '?')}s)"
    )
    for prof, res in verify.items():
        detail = ", ".join(f"{k}={v}" for k, v in res.items() if k in ("install_s", "resolved", "elapsed_s"))
        lines.append(f"verify_install {prof}: ok ({detail})")
        md.append(f"\n- verify_install **{prof}**: ok ({detail})")
    if not verify:
        lines.append("verify_install: not run")
    sizes = [(w["name"], int(w["size"])) for w in manifest["wheels"]]
    breakdown = [(f"kt-kernel: {k}", v) for k, v in kernel_breakdown(args.dist, manifest).items()]
    chart = svg_bars(sorted(sizes, key=lambda x: -x[1]), "Wheel sizes") + svg_bars(breakdown, "kt-kernel, compressed")
    (args.dist / "release-report.md").write_text("\n".join(md) + "\n\n" + chart + "\n")
    (args.dist / "release-report.html").write_text(
        f"<!doctype html><meta charset=utf-8><title>KT release {manifest['kt_version']}</title>"
        f"<pre>{html.escape(chr(10).join(lines))}</pre>{chart}\n"
    )
    print("\n".join(lines))
    print(f"\nreport: {args.dist / 'release-report.html'}")
    return 0 if audit.get("passed") else 1


if __name__ == "__main__":
    raise SystemExit(main())
