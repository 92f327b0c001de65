"""The release verdict judged from the evidence on disk, for exactly one build: the one function behind
`nox -s release_report` (which writes it into manifest.json and the report) and `nox -s publish` (which
judges again, at upload time, the bytes it is about to send, and never trusts a stored verdict).

The evidence: dist/audit-report.json and dist/vulnerabilities.json (the audit stage's, valid only when the
report judged exactly these wheels), and each Python's verification evidence (base.evidence,
build/verify-cp3NN.json). The acceptances: the command line's, and the policy's [[accept_incomplete]]
entries in force on `today`.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from audits.policy import load_policy
from base import distdir, evidence, paths

from . import diff
from . import verdict as verdicts
from .errors import ReleaseError

AUDIT_REPORT = "audit-report.json"
VULNERABILITIES = "vulnerabilities.json"
DIFF = diff.DIFF  # dist/release-diff.json, with --previous


@dataclass
class Evidence:
    """Everything the verdict reads, for the build whose key is `key` (None: dist/ does not match SHA256SUMS)."""

    manifest: distdir.Manifest
    key: str | None
    audit: dict[str, Any] = field(default_factory=dict)  # empty: none for these wheels
    audit_stale: bool = False  # a report exists but judged other wheels
    vulnerabilities: Any = None
    pythons: dict[str, dict[str, Any]] = field(default_factory=dict)  # base.evidence, by Python
    diff: Any = None  # dist/release-diff.json (release.diff), where a predecessor was named

    def runs(self) -> dict[str, dict[str, Any]]:
        """Every venv run's result in the evidence (`sft-cp312` -> result), this build's or not, Python by
        Python in the registry's order."""
        from verify.registry import VENV, run_name

        pythons = sorted(self.pythons, key=lambda v: tuple(int(x) for x in v.split(".")))
        order = {p: i for i, p in enumerate(VENV)}
        return {
            run_name(profile, python): result
            for python in pythons
            for profile, result in sorted(
                self.pythons[python].get("profiles", {}).items(), key=lambda kv: order.get(kv[0], len(order))
            )
        }

    def this_build(self) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
        """(the runs obtained on exactly these wheels, {run: why not} for the others)."""
        current: dict[str, dict[str, Any]] = {}
        other: dict[str, str] = {}
        for name, result in self.runs().items():
            if self.key is not None and (
                result.get("dist_sha256") == self.key or result.get("installs_from_dist") is False
            ):
                current[name] = result
            else:
                when = f", produced {result['produced']}" if result.get("produced") else ""
                other[name] = f"{verdicts.NOT_THIS_BUILD} (obtained on other wheels{when})"
        return current, other


def _json(path: Path) -> Any:
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ReleaseError(f"{path}: cannot be read as JSON ({exc}); run the stage that writes it again") from None


def audit_for_build(audit: Mapping[str, Any], manifest: distdir.Manifest) -> bool:
    """The audit report judged exactly the wheels manifest.json lists (every filename with its sha256)."""
    judged = {w.get("filename"): w.get("sha256") for w in audit.get("wheels", []) if isinstance(w, Mapping)}
    return bool(judged) and all(judged.get(w.filename) == w.sha256 for w in manifest.wheels)


def collect(
    dist: Path, key: str | None, build: Path | None = None, manifest: distdir.Manifest | None = None
) -> Evidence:
    """The evidence for the build `key` names (the caller hashed the bytes it judges)."""
    manifest = manifest or distdir.read_manifest(dist / distdir.MANIFEST)
    audit = _json(dist / AUDIT_REPORT)
    audit = audit if isinstance(audit, dict) else {}
    stale = bool(audit) and not audit_for_build(audit, manifest)
    audit = {} if stale else audit
    vulnerabilities = _json(dist / VULNERABILITIES) if audit else None  # the audit stage writes both
    ev = Evidence(manifest, key, audit, stale, vulnerabilities, evidence.load_all(build or paths.BUILD))
    ev.diff = _json(dist / DIFF)
    return ev


def judge(ev: Evidence, accept: Iterable[str] = (), today: datetime.date | None = None) -> verdicts.Verdict:
    """Every check's item for the build, and the acceptances of the command line and of the policy in force
    on `today` (default: today, UTC)."""
    from locks.read import install_profiles
    from verify.registry import venv_runs

    pythons = list(ev.manifest.pythons)
    current, _ = ev.this_build()
    items = [
        *verdicts.dist_items(ev.key),
        *verdicts.partial_items(ev.manifest),
        *verdicts.audit_items(ev.audit),
        *verdicts.vulnerability_items(ev.vulnerabilities, today),
        *verdicts.python_items(pythons, ev.pythons, ev.key),
        *verdicts.verify_items(venv_runs(pythons), ev.pythons, ev.key),
        *verdicts.resolution_items([(p, v) for v in pythons for p in install_profiles()], ev.pythons, ev.key),
        *verdicts.published_items(ev.manifest, current.values()),
        *verdicts.diff_items(ev.diff, ev.key),
        *verdicts.upgrade_items(ev.pythons, ev.key),
    ]
    accepted = verdicts.parse_accept(accept) + verdicts.from_policy(load_policy().incomplete_acceptances, today)
    return verdicts.Verdict(items, accepted)
