"""Known vulnerabilities in what the release installs: pip-audit over every published install file.

Every distribution `dist/install/*.txt` pins is asked about once (pip-audit, `--no-deps --disable-pip`,
against the package index's vulnerability data, PyPI's). A fork or repack of the release is asked about
as its upstream (transformers-kt 5.19.0.post1 as transformers 5.19.0, from manifest.json's inputs): the
upstream's advisories are the fork's; kt-kernel and ktransformers are this project's and have none in the
index. A vulnerability is an error unless the audit policy's `[[vulnerability_waivers]]` names it (its id
or an alias) for that package, with a reason, until a date; an expired waiver waives nothing.
"""

from __future__ import annotations

import datetime
import json
import re
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name

from audits.policy import VulnerabilityWaiver
from base import distdir, progress
from locks.read import parse_lock

from . import osv
from .errors import ReleaseError


@dataclass
class Vulnerabilities:
    """What pip-audit found, what the policy waived, and what it could not ask about."""

    asked: int = 0
    found: list[dict[str, Any]] = field(default_factory=list)  # each: package, version, id, aliases, files, fix
    waived: list[dict[str, Any]] = field(default_factory=list)  # the same, with the waiver's reason and date
    not_asked: dict[str, str] = field(default_factory=dict)  # package -> why (the project's own)
    not_checked: dict[str, str] = field(default_factory=dict)  # "name==version" -> why pip-audit could not ask
    seconds: float = 0.0
    source: dict[str, Any] = field(default_factory=lambda: {"kind": "the index (pip-audit)"})

    def as_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "asked": self.asked,
            "found": self.found,
            "waived": self.waived,
            "not_asked": self.not_asked,
            "not_checked": self.not_checked,
            "seconds": round(self.seconds, 1),
        }


def queries(dist: Path) -> tuple[dict[tuple[str, str], list[str]], dict[str, str]]:
    """((package, version) -> the install files that pin it, as the index knows it; package -> why not asked)."""
    manifest = distdir.open_release(dist).manifest
    upstream = {w.name: (canonicalize_name(w.inputs[0].name), w.inputs[0].version) for w in manifest.wheels if w.inputs}
    ours = {w.name for w in manifest.wheels} - set(upstream)
    asked: dict[tuple[str, str], list[str]] = {}
    files = sorted(dist / f.file for f in manifest.install or () if f.format == "requirements")
    if not files:
        raise ReleaseError(f"{dist / 'install'}: no install files; build the release first (nox -s build_all)")
    for f in files:
        for name, pin in parse_lock(f).items():
            key = canonicalize_name(name)
            if key in ours:
                continue
            asked.setdefault(upstream.get(key, (key, str(pin.version))), []).append(f.name)
    return asked, dict.fromkeys(sorted(ours), "this release's own distribution: no advisory data in the index")


def pip_audit(pins: list[tuple[str, str]], cache: Path) -> list[dict[str, Any]]:
    """pip-audit's dependencies (name, version, vulns) for exactly these pins. A requirements file holds
    each name once, and the Pythons of the matrix pin some at other versions: one file per layer of names."""
    layers: list[dict[str, str]] = []
    for name, version in pins:
        layer = next((la for la in layers if name not in la), None)
        if layer is None:
            layer = {}
            layers.append(layer)
        layer[name] = version
    return [dep for layer in layers for dep in _pip_audit(sorted(layer.items()), cache)]


def _pip_audit(pins: list[tuple[str, str]], cache: Path) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory() as tmp:
        req = Path(tmp) / "pins.txt"
        req.write_text("".join(f"{n}=={v}\n" for n, v in pins))
        cmd = [sys.executable, "-m", "pip_audit", "-r", str(req), "--no-deps", "--disable-pip"]
        cmd += ["--format", "json", "--progress-spinner", "off", "--cache-dir", str(cache)]
        proc = progress.run_quiet(cmd, "vulnerabilities")
    try:
        data = json.loads(proc.stdout)
    except ValueError:
        raise ReleaseError(
            f"pip-audit failed (exit {proc.returncode}): {proc.stderr.strip()[-800:] or proc.stdout[-800:]}; the "
            "vulnerability data comes from the package index (pypi.org): check the network"
        ) from None
    deps: list[dict[str, Any]] = data.get("dependencies", [])
    return deps


def _waiver(
    package: str, ids: set[str], waivers: tuple[VulnerabilityWaiver, ...], today: datetime.date
) -> tuple[VulnerabilityWaiver | None, VulnerabilityWaiver | None]:
    """(the waiver in force, an expired one) for this advisory of this package."""
    matching = [w for w in waivers if w.package == package and w.id in ids]
    live = next((w for w in matching if w.expires >= today), None)
    return live, None if live else next(iter(matching), None)


def check(
    dist: Path,
    waivers: tuple[VulnerabilityWaiver, ...],
    cache: Path,
    today: datetime.date | None = None,
    *,
    advisories: Path | None = None,
) -> Vulnerabilities:
    """Every pinned distribution of dist/install/ asked about (pip-audit against the index, or the OSV
    advisories of a file: `advisories`); found and waived sorted."""
    import time

    t0 = time.perf_counter()
    today = today or datetime.datetime.now(datetime.UTC).date()
    asked, not_asked = queries(dist)
    out = Vulnerabilities(asked=len(asked), not_asked=not_asked)
    if advisories is not None:
        data = osv.load(advisories)
        out.source = data.source
        progress.say("vulnerabilities", f"{len(asked)} pinned distributions against {advisories} ...")
        deps = data.dependencies(sorted(asked))
    else:
        progress.say("vulnerabilities", f"pip-audit: {len(asked)} pinned distributions of {dist / 'install'} ...")
        deps = pip_audit(sorted(asked), cache)
    for dep in deps:
        package, version = canonicalize_name(dep["name"]), dep.get("version", "")
        if "skip_reason" in dep:  # the index had no vulnerability data to give: not a pass
            reason = str(dep["skip_reason"])
            named = re.search(r"\(([^()]+)\)\s*$", reason)  # pip-audit names the version in its reason
            version = version or (named.group(1) if named else "")
            out.not_checked[f"{package}=={version}" if version else package] = reason
            continue
        if dep.get("not_evaluated"):  # some advisory could not be evaluated for this pin: not clean
            out.not_checked[f"{package}=={version}"] = str(dep["not_evaluated"])
        for v in dep.get("vulns", []):
            ids = {v["id"], *v.get("aliases", [])}
            entry = {
                "package": package,
                "version": version,
                "id": v["id"],
                "aliases": sorted(v.get("aliases", [])),
                "fix_versions": v.get("fix_versions", []),
                "files": sorted(set(asked.get((package, version), []))),
            }
            live, expired = _waiver(package, ids, waivers, today)
            if live is not None:
                out.waived.append({**entry, "reason": live.reason, "expires": live.expires.isoformat()})
            else:
                if expired is not None:
                    entry["expired_waiver"] = expired.expires.isoformat()
                out.found.append(entry)
    out.seconds = time.perf_counter() - t0
    return out


def lines(v: Vulnerabilities) -> list[str]:
    """The verdict for people: each vulnerability found (an error) and waived, with its fix."""
    src = v.source
    data = f"; data: {src['file']} sha256 {src['sha256'][:16]}, as of {src['date']}" if "file" in src else ""
    if src.get("withdrawn"):
        shown = ", ".join(src["withdrawn"][:5]) + (", ..." if len(src["withdrawn"]) > 5 else "")
        data += f"; {len(src['withdrawn'])} withdrawn advisories ignored ({shown})"
    out = [
        f"vulnerabilities: {len(v.found)} found, {len(v.waived)} waived, in {v.asked - len(v.not_checked)} of "
        f"{v.asked} pinned distributions ({v.seconds:.0f}s; not asked: {', '.join(v.not_asked) or 'none'}{data})"
    ]
    if v.not_checked:
        first = next(iter(v.not_checked.values()))
        out.append(
            f"  INCOMPLETE: {len(v.not_checked)} of {v.asked} pins NOT CHECKED: no vulnerability data for them (e.g. "
            f"{first}); where pypi.org's JSON API answers, `nox -s audit` checks them; offline, give OSV data: "
            "`nox -s audit -- --advisories FILE` (OSV's PyPI all.zip, a folder of OSV JSON, or one JSON file)"
        )
    for f in v.found:
        fix = f"fixed in {', '.join(f['fix_versions'])}" if f["fix_versions"] else "no fixed version yet"
        expired = f"; its waiver expired {f['expired_waiver']}" if "expired_waiver" in f else ""
        out.append(
            f"  error: {f['package']} {f['version']}: {f['id']} ({fix}{expired}) in {', '.join(f['files'])}; "
            "upgrade it in the lock (nox -s lock), or waive it in the policy's [[vulnerability_waivers]] "
            "with a reason and an expiry date"
        )
    for w in v.waived:
        out.append(f"  waived: {w['package']} {w['version']}: {w['id']} until {w['expires']} ({w['reason']})")
    return out
