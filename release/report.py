"""The release candidate on one screen, and as Markdown/HTML with a size chart.

Reads dist/manifest.json (carriers), dist/audit-report.json (verdicts) and
build/verify-cp3NN.json (each Python's install verification, base.evidence); writes dist/release-report.md and
dist/release-report.html (an inline SVG bar chart: wheel sizes, and the
kt-kernel wheel broken down into CPU variants, CUDA payload and the rest).
"""

from __future__ import annotations

import argparse
import html
import json
import subprocess
import time
import zipfile
from pathlib import Path
from typing import Any

from packaging.utils import parse_wheel_filename

from audits.errors import AuditError
from audits.policy import load_policy
from audits.report import printable
from base import distdir, evidence, progress, stagecache
from base.cli import dist_option
from base.errors import StageError, report
from base.paths import BENCH_JSON, BUILD, KERNEL_OUT, ROOT, STAGE_CACHE, TIMINGS
from base.version import VersionFileError, release_date
from carriers.consistency import torch_summary
from carriers.model import PART_DIR

from . import judge as judging
from . import verdict as verdicts


def supply_chain(audit: dict[str, Any]) -> dict[str, str]:
    """wheel filename -> "LICENSE-EXPRESSION, N SBOM components", from the audit report's wheel entries."""
    out = {}
    for w in audit.get("wheels", []):
        count = w.get("sbom_components")
        out[w["filename"]] = f"{w.get('license') or 'no license stated'}, " + (
            "no SBOM" if count is None else f"{count} SBOM components"
        )
    return out


def _e(value: object) -> str:
    """Text for the page: wheel, member and finding strings come from the wheels, so control and
    bidi characters are shown escaped (audits.report.printable), then HTML-escaped."""
    return html.escape(printable(value))


def _load(path: Path) -> Any:
    return json.loads(path.read_text()) if path.exists() else None


def kernel_breakdown(dist: Path, manifest: distdir.Manifest) -> dict[str, int]:
    """kt-kernel's compressed bytes by kind: CPU variants, CUDA payload, core, other."""
    kt = next((w for w in manifest.wheels if w.name == "kt-kernel"), None)
    if kt is None:
        return {}
    out = {"CPU variants": 0, "CUDA payload": 0, "baseline core": 0, "other": 0}
    with zipfile.ZipFile(dist / kt.filename) as zf:
        for i in zf.infolist():
            key = (
                "CPU variants"
                if "/cpu/" in i.filename
                else "CUDA payload"
                if "cuda_archive" in i.filename or f"/{PART_DIR}/" in i.filename
                else "baseline core"
                if "_core." in i.filename
                else "other"
            )
            out[key] += i.compress_size
    return out


def svg_bars(items: list[tuple[str, int]], title: str) -> str:
    """A horizontal bar chart as inline SVG."""
    width, bar_h, label_w = 720, 22, 300
    top = max((v for _, v in items), default=1) or 1
    rows = []
    for i, (label, value) in enumerate(items):
        y = 30 + i * (bar_h + 6)
        w = max(1, int((width - label_w - 90) * value / top))
        rows.append(
            f'<text x="0" y="{y + 15}" font-size="12">{_e(label)}</text>'
            f'<rect x="{label_w}" y="{y}" width="{w}" height="{bar_h}" fill="#4a7bd0"/>'
            f'<text x="{label_w + w + 6}" y="{y + 15}" font-size="12">{value / 2**20:.2f} MiB</text>'
        )
    h = 40 + len(items) * (bar_h + 6)
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{h}" font-family="sans-serif">'
        f'<text x="0" y="16" font-size="14" font-weight="bold">{_e(title)}</text>{"".join(rows)}</svg>'
    )


def _git_commit() -> str:
    proc = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, check=False)
    return proc.stdout.strip() if proc.returncode == 0 else "unknown (not a git checkout)"


def _release_date() -> str:
    try:
        return release_date().isoformat()
    except (OSError, ValueError, VersionFileError):
        return "unknown"


CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:2em auto;max-width:1200px;color:#222}
h1{margin-bottom:.2em} .meta{color:#555} table{border-collapse:collapse;margin:.6em 0 1.4em}
th,td{border:1px solid #ccc;padding:3px 8px;text-align:left;vertical-align:top} th{background:#f3f3f3}
td.num{text-align:right;font-variant-numeric:tabular-nums} code{font-size:12px}
.pass{background:#d9f2d9;color:#14571a} .fail{background:#f9d6d5;color:#8a1410} .warn{background:#fff1c9;color:#6b4e00}
.info{color:#555} .none{color:#aaa} .badge{display:inline-block;padding:2px 10px;border-radius:4px;font-weight:bold}
.bar{background:#4a7bd0;height:10px;display:inline-block} .over{background:#c0392b}
table.findings td:nth-child(3){max-width:330px;word-break:break-all} table.findings td:nth-child(4){min-width:360px}
"""


def installed_torch(verify: dict[str, Any]) -> list[tuple[str, str]]:
    """(profile, the torch it installed) for each verified profile that says: a version, or for an
    upgrade "before -> after" (one version when it did not change); profiles that do not say are left out."""
    out = []
    for prof, result in verify.items():
        torch = result.get("torch") if isinstance(result, dict) else None
        if isinstance(torch, dict):
            before, after = torch.get("before"), torch.get("after")
            torch = after if before == after else f"{before} -> {after}"
        if torch and torch != "?":
            out.append((prof, str(torch)))
    return out


def doctor_line(result: dict[str, Any]) -> str | None:
    """`kt-doctor --run` in one verified profile: each check's state, the time."""
    run = result.get("doctor_run") or result.get("doctor") or {}
    if "checks" not in run:
        return None
    states = ", ".join(f"{name} {state}" for name, state in run["checks"].items())
    deep = f", --deep {run['deep_seconds']} s" if "deep_seconds" in run else ""
    return f"kt-doctor --run: {states} ({run['seconds']} s{deep})"


def serving_line(verify: dict[str, Any]) -> str | None:
    """What the serve profile ran on CPU through SGLang on each Python: the Kimi-style tokenizer and
    JSON-schema grammars."""
    runs = {n.rpartition("-")[2]: r for n, r in sorted(verify.items()) if n.startswith("serve-cp")}
    shown = {tag: (r.get("tokenizer"), r.get("json_schema")) for tag, r in runs.items()}
    shown = {tag: pair for tag, pair in shown.items() if pair[0] and pair[1]}
    if not shown:
        return None
    tok, grammar = next(iter(shown.values()))
    same = "equals tiktoken" if all(t["native_equal"] for t, _ in shown.values()) else "DIFFERS from tiktoken"
    return (
        f"serving on CPU ({', '.join(shown)}): a Kimi-style tokenizer through SGLang's get_tokenizer {same} "
        f"({tok['ids_compared']} ids, {tok['corpus_texts']} texts, {tok['special_tokens']} special tokens); "
        f"JSON-schema grammar: {grammar['accepted']} valid accepted, {grammar['rejected']} invalid rejected, "
        f"strict thinking {grammar['strict_thinking']}"
    )


def pythons_line(manifest: distdir.Manifest) -> str:
    """The Pythons the release serves, and a partial development release said plainly."""
    line = f"Pythons: {', '.join(manifest.pythons) or 'unknown'}; {len(manifest.install or ())} install files"
    if manifest.partial:
        line += f". PARTIAL DEVELOPMENT RELEASE: no wheels for {', '.join(manifest.partial.missing)}; not a release"
    return line


def glibc_floor(dist: Path, manifest: distdir.Manifest, audit: dict[str, Any]) -> str:
    """The oldest glibc the release installs on, one line: per install profile on the first Python (its whole
    closure, the pylock's wheels and ours: the wheel that sets it, and for one of ours the ELF file, from the
    audit's verdict), and the release's own wheels alone."""
    from audits.platforms import wheel_glibc
    from locks.read import LockError, read_pylock

    def floor(filename: str) -> tuple[int, int]:
        return wheel_glibc(filename) or (0, 0)

    why = {
        w["filename"]: f"{n['elf']} needs {n['version']}"
        for w in audit.get("wheels", [])
        if (n := w.get("glibc_needed"))
    }
    python = manifest.pythons[0] if manifest.pythons else "3.11"
    ours = [w.filename for w in manifest.wheels if python in w.pythons]
    parts = []
    for entry in [f for f in manifest.install or () if f.python == python and f.format == "pylock"]:
        try:
            lock = read_pylock(dist / entry.file)
        except LockError:
            continue
        names = {p.name for p in lock.packages}
        files = [w.filename for p in lock.packages for w in p.wheels or ()]
        files += [f for f in ours if parse_wheel_filename(f)[0] in names]
        top = max(files, key=lambda f: (floor(f), f in why), default="")  # a tie: ours, whose ELF is named
        if top and floor(top) > (0, 0):
            said = f" ({why[top]})" if why.get(top) else ""
            parts.append(f"{entry.profile} {'.'.join(map(str, floor(top)))} (set by {top}{said})")
    own = max(ours, key=floor, default="")
    mine = [f for f in ours if parse_wheel_filename(f)[0] == "kt-kernel"]
    kernel = f"; kt-kernel's own binaries: {mine[0]} ({why.get(mine[0], '')})" if mine else ""
    if not parts and not own:
        return "glibc floor: unknown (no install file, no manylinux wheel)"
    return (
        f"glibc floor (the oldest glibc each install profile installs on): {'; '.join(parts) or 'no pylock'}; "
        f"the release's wheels alone: {'.'.join(map(str, floor(own)))} (set by {own}){kernel}"
    )


def _cls(verdict: str) -> str:
    if verdict.startswith("INCOMPLETE"):
        return "warn"
    return {
        "pass": "pass",
        "PASSED": "pass",
        "FAIL": "fail",
        "FAILED": "fail",
        "error": "fail",
        "warning": "warn",
        "info": "info",
    }.get(verdict, "none")


def performance(anchor: dict[str, Any] | None) -> tuple[str, list[list[str]]]:
    """The performance table from `nox -s bench -- --only anchor` (build/bench/anchor.json): a caption
    saying when and where it was measured (a bench run, not this build's wheels), and its rows."""
    if not anchor or not anchor.get("rows"):
        return "", []
    caption = (
        f"CPU MoE against {anchor.get('anchor', 'the anchor')}: measured {anchor.get('produced', '?')} on "
        f"{anchor.get('cpu', '?')} by nox -s bench -- --only anchor (the kernel sources of that run, not "
        "necessarily this build's); ratio = its time / ours"
    )
    rows = [
        [
            str(r["variant"]),
            str(r["format"]),
            str(r["tokens"]),
            str(r["threads"]),
            f"{r['ours_ms']:.2f}",
            f"{r['kt_ms']:.2f}",
            f"{r['ratio']:.2f}x",
            f"{r['bandwidth_fraction']:.0%}" if int(r["tokens"]) <= 8 else "",
        ]
        for r in anchor["rows"]
    ]
    return caption, rows


PERFORMANCE_HEADER = ["variant", "format", "tokens", "threads", "ours ms", "kt-kernel ms", "ratio", "ours of read BW"]


def render_html(
    manifest: distdir.Manifest,
    audit: dict[str, Any],
    verify: dict[str, Any],
    baseline: distdir.Manifest | None,
    dist: Path,
    *,
    notes: list[str] | None = None,
    stages: list[str] | None = None,
    anchor: dict[str, Any] | None = None,
    judged: verdicts.Verdict | None = None,
) -> str:
    """The release candidate as one self-contained page (no network, no script)."""
    e = _e
    errors: dict[str, int] = {w["filename"]: w["errors"] for w in audit.get("wheels", [])}
    judged = judged or verdicts.Verdict(verdicts.audit_items(audit))
    verdict = judged.badge
    budget = load_policy().wheel_budget_bytes  # the audit policy owns it ([size] wheel_budget_mib)
    parts = {p.distribution: p.size for p in manifest.payload.parts} if manifest.payload else {}
    old = {parse_wheel_filename(w.filename)[0]: w.size for w in baseline.wheels} if baseline else {}
    out = [
        f"<!doctype html><html lang=en><meta charset=utf-8><title>KT release {e(manifest.kt_version)}</title>",
        f"<style>{CSS}</style><body>",
        f"<h1>KT release {e(manifest.kt_version)}</h1>",
        f"<p class=meta>commit <code>{e(_git_commit())}</code> &middot; release date {e(_release_date())} &middot; "
        f"report {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}</p>",
        f'<p id=verdict><span class="badge {_cls(verdict)}">{verdict}</span> audit: '
        f"{'passed' if audit.get('passed') else 'failed or missing'}, "
        f"{sum(f.get('severity') == 'error' for f in audit.get('findings', []))} errors; install verification: "
        f"{', '.join(verify) or 'not run'}</p>",
        *(f"<p class=verdict-item>{e(line.strip())}</p>" for line in judged.lines()[1:]),
        f"<p id=pythons>{e(pythons_line(manifest))}</p>",
        *(f"<p class=note>{e(n)}</p>" for n in notes or []),
        *(f"<p id=serving>{e(line)}</p>" for line in [serving_line(verify)] if line),
        *(f"<p class=doctor>{e(p)}: {e(line)}</p>" for p, r in verify.items() if (line := doctor_line(r))),
        f"<p>torch: the carriers allow <code>{e(torch_summary(manifest.torch))}</code>"
        + "".join(f"; {e(p)} installed <code>{e(t)}</code>" for p, t in installed_torch(verify))
        + "</p>",
    ]
    out.append(
        "<h2 id=wheels>Wheels</h2><table><tr><th>wheel</th><th>version</th><th>kind</th><th>size</th>"
        "<th>of which CUDA payload part</th><th>budget</th><th>change</th><th>sha256</th><th>audit</th>"
        "<th>license, SBOM</th></tr>"
    )
    supply = supply_chain(audit)
    for w in manifest.wheels:
        v = "pass" if errors.get(w.filename) == 0 else "FAIL" if w.filename in errors else "not audited"
        share = w.size / budget
        prev = old.get(parse_wheel_filename(w.filename)[0])
        change = f"{100 * (w.size - prev) / prev:+.1f}%" if prev else "new" if baseline else ""
        part = f"{parts[w.name] / 2**20:.1f} MiB" if w.name in parts else ""
        over = " over" if share > 1 else ""
        out.append(
            f"<tr><td><a href='{e(w.filename)}'>{e(w.name)}</a></td><td>{e(w.version)}</td>"
            f"<td>{e(w.kind)}</td><td class=num>{w.size / 2**20:.2f} MiB</td>"
            f"<td class=num>{part}</td>"
            f"<td><span class='bar{over}' style='width:{min(share, 1) * 120:.0f}px'></span> "
            f"{100 * share:.0f}%</td><td class=num>{change}</td>"
            f"<td title='{e(w.sha256)}'><code>{e(w.sha256[:16])}</code></td><td class={_cls(v)}>{v}</td>"
            f"<td>{e(supply.get(w.filename, 'not audited'))}</td></tr>"
        )
    out.append("</table>")
    findings = audit.get("findings", [])
    out.append(f"<h2 id=findings>Findings ({len(findings)})</h2>")
    loud = [f for f in findings if f.get("severity") in ("error", "warning")]
    quiet = [f for f in findings if f not in loud]
    out.append(_findings_table(loud) if loud else "<p>no errors or warnings</p>")
    if quiet:  # waived, or information the policy keeps visible: folded
        out.append(
            f"<details><summary>{len(quiet)} info finding(s): waived or by policy, with the reason"
            f"</summary>{_findings_table(quiet)}</details>"
        )
    caption, perf = performance(anchor)
    if perf:
        out.append(f"<h2 id=performance>Performance</h2><p>{e(caption)}</p><table><tr>")
        out.append("".join(f"<th>{e(h)}</th>" for h in PERFORMANCE_HEADER) + "</tr>")
        out += ["<tr>" + "".join(f"<td>{e(c)}</td>" for c in row) + "</tr>" for row in perf]
        out.append("</table>")
    out.append(_cpu_matrix(audit))
    out.append(_cuda_matrix(audit))
    sizes = [(w.name, w.size) for w in manifest.wheels]
    breakdown = [(f"kt-kernel: {k}", v) for k, v in kernel_breakdown(dist, manifest).items()]
    out.append(
        "<h2 id=sizes>Sizes</h2>"
        + svg_bars(sorted(sizes, key=lambda x: -x[1]), "Wheel sizes")
        + svg_bars(breakdown, "kt-kernel, compressed")
    )
    if stages:
        out.append("<h2 id=stages>Stages</h2><ul>" + "".join(f"<li>{e(r)}</li>" for r in stages) + "</ul>")
    links = ["SHA256SUMS", "manifest.json", "audit-report.json", "audit-report.md", "release-report.md"]
    out.append(
        "<h2 id=artifacts>Artifacts</h2><ul>"
        + "".join(
            f"<li><a href='{e(n)}'>{e(n)}</a>{'' if (dist / n).exists() or n == 'release-report.md' else MISSING}</li>"
            for n in links
        )
        + "</ul></body></html>\n"
    )
    return "".join(out)


MISSING = " (missing)"


def _findings_table(findings: list[dict[str, Any]]) -> str:
    e = _e
    order = {"error": 0, "warning": 1, "info": 2}
    rows = [
        "<table class=findings><tr><th>severity</th><th>rule</th><th>wheel / member</th><th>message</th>"
        "<th>fix</th></tr>"
    ]
    for f in sorted(findings, key=lambda f: (order.get(f.get("severity", ""), 3), f.get("rule", ""))):
        g = {k: str(f.get(k, "")) for k in ("severity", "rule", "wheel", "member", "message", "fix")}
        rows.append(
            f"<tr class={_cls(g['severity'])}><td>{e(g['severity'])}</td><td><code>{e(g['rule'])}</code>"
            f"</td><td>{e(g['wheel'])}<br><code>{e(g['member'])}</code></td><td>{e(g['message'])}</td>"
            f"<td>{e(g['fix'])}</td></tr>"
        )
    return "".join(rows) + "</table>"


def _cpu_matrix(audit: dict[str, Any]) -> str:
    """CPU variant x ISA feature: instructions used (count), the marker, anything forbidden."""
    e = _e
    rows = []
    for wheel, variants in audit.get("cpu_variants", {}).items():
        names = [n for n in variants if n != "loader"]
        features = sorted(
            {f for n in names for f in variants[n].get("features_used", {})}
            - {"INTEL8086", "INTEL186", "INTEL286", "INTEL386", "X64", "CMOV", "SSE", "SSE2", "FPU", "MULTIBYTENOP"}
        )
        head = "".join(f"<th>{e(f)}</th>" for f in features)
        rows.append(f"<h3>{e(wheel)}</h3><table><tr><th>variant</th><th>marker</th>{head}<th>forbidden</th></tr>")
        for n in names:
            v = variants[n]
            used = v.get("features_used", {})
            cells = "".join(
                f"<td class='num {'pass' if f == v.get('marker') and f in used else ''}'>{used.get(f, '')}</td>"
                for f in features
            )
            marker = f"{v.get('marker')} {'yes' if v.get('marker_present') else 'NO'}"
            rows.append(
                f"<tr><td>{e(n)}</td><td class={'pass' if v.get('marker_present') else 'fail'}>{e(marker)}"
                f"</td>{cells}<td class={'fail' if v.get('forbidden') else 'pass'}>"
                f"{len(v.get('forbidden', []))}</td></tr>"
            )
        rows.append("</table>")
    return "<h2 id=cpu-matrix>CPU variants x ISA features</h2>" + ("".join(rows) or "<p>no kt-kernel wheel</p>")


def _cuda_matrix(audit: dict[str, Any]) -> str:
    """Archived CUDA binary x compute capability: the SASS or PTX that runs there."""
    e = _e
    coverage = (audit.get("payload") or {}).get("coverage") or {}
    if not coverage:
        return "<h2 id=cuda-matrix>CUDA coverage</h2><p>no CUDA payload in this release</p>"
    targets = sorted({t for by in coverage.values() for t in by}, key=lambda t: tuple(int(x) for x in t.split(".")))
    out = [
        "<h2 id=cuda-matrix>CUDA binaries x compute capability</h2><table><tr><th>archived binary</th>"
        + "".join(f"<th>{e(t)}</th>" for t in targets)
        + "</tr>"
    ]
    for binary, by in sorted(coverage.items()):
        cells = "".join(f"<td class={'pass' if by.get(t) else 'none'}>{e(by.get(t) or '-')}</td>" for t in targets)
        out.append(f"<tr><td><code>{e(binary)}</code></td>{cells}</tr>")
    return "".join(out) + "</table>"


NOT_THIS_BUILD = verdicts.NOT_THIS_BUILD
KERNEL_STAMP = ".kt-kernel-inputs.sha256"  # kernel/tools/build_wheel.py's key beside its wheel


def build_key(dist: Path) -> str | None:
    """The key of exactly the files dist/ lists (re-hashed), or None when dist/ does not match its SHA256SUMS."""
    try:
        return distdir.key(dist)
    except distdir.DistError:
        return None


def other_checks(ev: judging.Evidence) -> list[str]:
    """One line per Python: the interpreter it ran on, and its normal resolutions for this build."""
    lines = []
    for python in ev.manifest.pythons:
        data = ev.pythons.get(python)
        if data is None:
            lines.append(f"CPython {python}: not verified here (nox -s verify_install -- --python {python})")
            continue
        found = data.get("interpreter") or {}
        i = found.get("interpreter")
        where = f"CPython {i['version']} from {i['source']} ({i['path']})" if i else "NOT VERIFIED: no interpreter"
        results = list(evidence.for_build(data, "resolution", ev.key).values())
        ok = sum(bool(r.get("ok")) for r in results)
        simulated = sum(bool(r.get("simulated")) for r in results)
        lines.append(
            f"CPython {python}: {where}; resolve: {ok} of {len(results)} install profiles as the release"
            + (f" ({simulated} simulated)" if simulated else "")
        )
    return lines


def vulnerabilities_line(data: Any) -> str | None:
    """dist/vulnerabilities.json in one line: found, waived, and what could not be checked (never a pass)."""
    if not isinstance(data, dict):
        return None
    if "not_checked" in data and isinstance(data["not_checked"], str):
        return f"vulnerabilities: NOT CHECKED ({data['not_checked']})"
    found, waived, unchecked = data.get("found", []), data.get("waived", []), data.get("not_checked", {})
    line = f"vulnerabilities: {len(found)} found, {len(waived)} waived, in {data.get('asked', 0)} pinned distributions"
    line += "".join(f"; {f['package']} {f['version']} {f['id']}" for f in found)
    line += "".join(f"; waived {w['package']} {w['id']} until {w['expires']}" for w in waived)
    if unchecked:
        line += f"; NOT CHECKED: {len(unchecked)} (the index gave no vulnerability data for them)"
    return line


def stage_outcomes(cache: Path, kernel_out: Path, since: float | None) -> list[str]:
    """Each stage of this release run (since its start; every recorded one without it): ran or reused."""
    rows = []
    stamp = kernel_out / KERNEL_STAMP
    if stamp.is_file():
        mtime = stamp.stat().st_mtime
        fresh = since is not None and mtime >= since
        when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(mtime))
        rows.append(f"kt-kernel: {'ran' if fresh else 'reused'} (key {stamp.read_text().split()[0][:16]}, {when})")
    for name, last in stagecache.last_outcomes(cache).items():
        if since is not None and float(last.get("at", 0)) < since:
            continue
        rows.append(f"{name}: {last.get('outcome')} (key {str(last.get('key'))[:16]}, produced {last.get('produced')})")
    return rows


def release_start(directory: Path) -> float | None:
    """When the last `nox -s release` started (its .release-start stamp), if one did."""
    start_file = directory / ".release-start"
    try:
        return float(start_file.read_text())
    except (OSError, ValueError):
        return None


def release_timings(directory: Path) -> list[tuple[str, float]]:
    """The stages `nox -s release` ran this time (started after its .release-start stamp)."""
    start = release_start(directory)
    if start is None:
        return []
    rows = []
    for name in ("build_all", "audit", "verify_install"):
        data = _load(directory / f"{name}.json")
        if data and data["start"] >= start:
            rows.append((name, float(data["seconds"])))
    return rows


def _main(argv: list[str] | None) -> int:
    """Write dist/release-report.{html,md} and print the one-screen summary; 1 unless the audit passed."""
    p = argparse.ArgumentParser(prog="nox -s release_report --")
    dist_option(p)
    p.add_argument("--evidence", type=Path, default=BUILD, help="where build/verify-cp3NN.json lie")
    p.add_argument("--baseline", type=Path, help="a previous release's manifest.json, for the size change per wheel")
    p.add_argument(
        "--previous",
        metavar="SPEC",
        help="the previous release for the release diff (dist/release-diff.json): an earlier dist/, a folder of "
        "wheels, or INDEX_URL::NAME==VERSION,...",
    )
    p.add_argument("--timings", type=Path, default=TIMINGS, help=argparse.SUPPRESS)
    p.add_argument("--stages", type=Path, default=STAGE_CACHE, help=argparse.SUPPRESS)
    p.add_argument("--kernel-out", type=Path, default=KERNEL_OUT, help=argparse.SUPPRESS)
    p.add_argument("--anchor", type=Path, default=BENCH_JSON["anchor"], help=argparse.SUPPRESS)
    p.add_argument(
        "--accept",
        action="append",
        default=[],
        metavar="ITEM=REASON",
        help="accept a missing (NOT VERIFIED, NOT CHECKED, not run) item by name or glob, with a reason",
    )
    args = p.parse_args(argv)
    manifest = distdir.read_manifest(args.dist / distdir.MANIFEST)  # read whole even when a file differs
    baseline = distdir.read_manifest(args.baseline) if args.baseline else None
    key = build_key(args.dist)  # every result shown must have been obtained on exactly these wheels
    changes = None
    if args.previous:
        from . import diff

        changes = diff.make(args.dist, args.previous)
        if changes is not None:
            diff.write(args.dist, changes)
    ev = judging.collect(args.dist, key, args.evidence, manifest)
    audit, vulnerabilities = ev.audit, ev.vulnerabilities
    notes = [] if key else [f"dist/ does not match its SHA256SUMS: nothing is {NOT_THIS_BUILD}; rebuild it"]
    if ev.audit_stale:
        notes.append("audit: the report in dist/ judged other wheels than these; run nox -s audit")
    verify, stale = ev.this_build()
    notes += [f"verify_install {prof}: {why}" for prof, why in stale.items()]
    notes += other_checks(ev)
    notes += [line for line in [vulnerabilities_line(vulnerabilities)] if line]
    judged = judging.judge(ev, args.accept)
    errors: dict[str, int] = {w["filename"]: w["errors"] for w in audit.get("wheels", [])}
    torch = torch_summary(manifest.torch)
    floor = glibc_floor(args.dist, manifest, audit)
    lines = [f"KT release {manifest.kt_version}  (torch {torch})", pythons_line(manifest), floor, ""]
    md = [
        f"# KT release {manifest.kt_version}",
        "",
        pythons_line(manifest),
        "",
        floor,
        "",
        f"torch: `{torch}`" + "".join(f"; {p} installed `{t}`" for p, t in installed_torch(verify)),
        "",
        "| carrier | version | kind | size (MiB) | sha256 | audit | license, SBOM |",
        "| --- | --- | --- | ---: | --- | --- | --- |",
    ]
    supply = supply_chain(audit)
    width = max(len(w.name) for w in manifest.wheels)
    for w in manifest.wheels:
        verdict = "pass" if errors.get(w.filename) == 0 else ("FAIL" if w.filename in errors else "not audited")
        lines.append(
            f"{w.name:<{width}}  {w.version:<14} {w.kind:<8} {w.size / 2**20:7.2f} MiB  "
            f"{w.sha256[:16]}  audit: {verdict}" + (f"  ({supply[w.filename]})" if w.filename in supply else "")
        )
        md.append(
            f"| {w.name} | {w.version} | {w.kind} | {w.size / 2**20:.2f} | `{w.sha256[:16]}` "
            f"| {verdict} | {supply.get(w.filename, 'not audited')} |"
        )
    lines.append("")
    pl = manifest.payload
    if pl:
        parts = ", ".join(f"{p.distribution} {p.size / 2**20:.1f}" for p in pl.parts)
        line = (
            f"CUDA payload: {pl.files} files, {pl.extracted_size / 2**20:.0f} MiB -> "
            f"{pl.archive_size / 2**20:.1f} MiB zstd in {len(pl.parts)} parts (MiB: {parts})"
        )
        lines.append(line)
        md.append(f"\n- {line}")
    lines.append(
        f"audit: {'PASSED' if audit.get('passed') else 'FAILED or missing'} "
        f"({len(audit.get('findings', []))} findings, {audit.get('elapsed_s', '?')}s)"
    )
    for prof, res in verify.items():
        detail = ", ".join(f"{k}={v}" for k, v in res.items() if k in ("install_s", "resolved", "elapsed_s"))
        forks = res.get("distributions") or {}
        if forks:  # what actually provides each module (trl comes from trl-kt)
            detail += "; " + ", ".join(f"{m}: {d}" for m, d in forks.items())
        reused = f", reused: produced {res.get('produced')}" if res.get("outcome") == "reused" else ""
        lines.append(f"verify_install {prof}: ok ({detail}){reused}")
        md.append(f"\n- verify_install **{prof}**: ok ({detail}){reused}")
        if doctor := doctor_line(res):
            lines.append(f"  {doctor}")
            md.append(f"  - {doctor}")
    if serving := serving_line(verify):
        lines.append(serving)
        md.append(f"\n{serving}")
    if not verify:
        lines.append("verify_install: not run" if not stale else f"verify_install: {NOT_THIS_BUILD}")
    lines += notes
    md += [f"\n- {n}" for n in notes]
    if args.previous:
        from . import diff

        said = diff.summary(changes)
        lines += ["", *said]
        md += ["\n## Release diff\n", *(f"- {ln.strip()}" for ln in said)]
    since = release_start(args.timings)
    stages = stage_outcomes(args.stages, args.kernel_out, since)
    sizes = [(w.name, w.size) for w in manifest.wheels]
    breakdown = [(f"kt-kernel: {k}", v) for k, v in kernel_breakdown(args.dist, manifest).items()]
    chart = svg_bars(sorted(sizes, key=lambda x: -x[1]), "Wheel sizes") + svg_bars(breakdown, "kt-kernel, compressed")
    md += ["\n## Stages\n", *(f"- {row}" for row in stages)] if stages else []
    anchor = _load(args.anchor)
    caption, perf = performance(anchor)
    if perf:
        md += ["\n## Performance\n", caption, "", "| " + " | ".join(PERFORMANCE_HEADER) + " |"]
        md += ["|" + " --- |" * len(PERFORMANCE_HEADER), *("| " + " | ".join(row) + " |" for row in perf)]
        lines.append(f"performance: {len(perf)} points in {args.anchor} (release-report.md, Performance)")
    md[1:1] = ["", f"**{judged.badge}**", "", *(f"- {line.strip()}" for line in judged.lines()[1:])]
    (args.dist / "release-report.md").write_text("\n".join(md) + "\n\n" + chart + "\n")
    page = render_html(
        manifest, audit, verify, baseline, args.dist, notes=notes, stages=stages, anchor=anchor, judged=judged
    )
    (args.dist / "release-report.html").write_text(page)
    record_verdict(args.dist, judged, key)
    print("\n".join(lines))
    timings = release_timings(args.timings)
    if timings:
        print("\n" + progress.table(timings, "this release's stages"))
    if stages:
        print("\n" + ("ran or reused this run:" if since is not None else "stages:"))
        print("\n".join(f"  {row}" for row in stages))
    print(f"\nreport: {args.dist / 'release-report.html'}")
    print("\n" + "\n".join(judged.lines()))
    if judged.publishable:
        return 0
    return 1 if judged.verdict == verdicts.FAILED else 2


def record_verdict(dist: Path, judged: verdicts.Verdict, key: str | None) -> None:
    """The verdict into manifest.json's `release` member (which no stage key includes: the verdict is this
    stage's output), with the key of the dist/ it judged (base.distdir writes it whole)."""
    judged_at = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    distdir.record_verdict(dist, {**judged.as_dict(), "dist_sha256": key, "judged": judged_at})


def main(argv: list[str] | None = None) -> int:
    """The CLI: errors a user can fix are one `error:` line and exit 1, never a traceback."""
    try:
        return _main(argv)
    except (StageError, AuditError, OSError, ValueError) as exc:
        return report(exc)


if __name__ == "__main__":
    raise SystemExit(main())
