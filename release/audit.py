"""`nox -s audit`: `python -m release.audit [--dist dist] [--baseline F] [--summary F] [--fresh] [PATH...]`.

Two checks: every wheel (`python -m audits`, each ELF file's undefined symbols resolved against each
published install profile's closure: release/links.py, `--no-links` offline), and the known
vulnerabilities of everything the install files pin (release/vulns.py: pip-audit against the index's
vulnerability data, or `--advisories FILE`, OSV data on disk; the policy's waivers), into
dist/vulnerabilities.json. The index's data changes by the day, so the day is in the key (a file's
sha256, when given). A vulnerability found and not waived fails the audit; a pin that could not be
checked leaves the release INCOMPLETE (release/verdict.py), whether the stage ran or was reused
(vulnerabilities.json, which says so, is one of its hashed outputs).

The audit of exactly these wheels (every file dist/SHA256SUMS lists, re-hashed), with this policy,
this audit code and lock, is reused from its record (base/stages.py says what the key holds); anything
else runs `python -m audits` over dist/ into dist/audit-report.{json,md}. Only a passing audit is
recorded, so a failing one always runs again. Third-party wheels (`nox -s audit -- PATH...`) are
audited directly, never through this cache, into build/audit/ (dist/ holds only the release). In CI the
Markdown summary goes to $GITHUB_STEP_SUMMARY unless --summary names another file.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
from pathlib import Path
from typing import Any

from audits import report
from audits.__main__ import main as audit_main
from audits.policy import VulnerabilityWaiver, load_policy
from base import distdir, paths, stagecache, stages
from base.cli import dist_option, fresh_option
from base.errors import StageError
from base.errors import report as report_error

from . import links, vulns


def main(argv: list[str] | None = None) -> int:
    """0 the audit passed (ran or reused), else the audit's own exit status."""
    p = argparse.ArgumentParser(prog="nox -s audit --")
    dist_option(p)
    p.add_argument("--baseline", type=Path, help="a previous audit-report.json, for size growth")
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    p.add_argument(
        "--summary",
        type=Path,
        default=Path(summary) if summary else None,
        help="append the Markdown summary here (default: $GITHUB_STEP_SUMMARY when set)",
    )
    fresh_option(p, "audit")
    p.add_argument(
        "--no-vulnerabilities",
        action="store_true",
        help="skip the known-vulnerability check (offline); the release is then INCOMPLETE",
    )
    p.add_argument(
        "--advisories",
        type=Path,
        help="OSV advisory data (PyPI's all.zip, a folder of OSV JSON, or one JSON file) instead of the index",
    )
    p.add_argument(
        "--no-links",
        action="store_true",
        help="skip resolving every ELF file against each install profile's closure (offline); NOT CHECKED",
    )
    p.add_argument("paths", nargs="*", type=Path, help="anyone's wheels or folders instead (reports: build/audit/)")
    args = p.parse_args(argv)
    extra = [*(["--baseline", str(args.baseline)] if args.baseline else [])]
    extra += ["--summary", str(args.summary)] if args.summary else []
    if args.paths:  # anyone's wheels: audited as they are, no stage cache
        paths.AUDIT_REPORTS.mkdir(parents=True, exist_ok=True)
        out = [f"--json={paths.AUDIT_REPORTS / 'audit-report.json'}"]
        out += [f"--markdown={paths.AUDIT_REPORTS / 'audit-report.md'}"]
        return audit_main([*map(str, args.paths), *out, *extra])
    if not args.dist.is_dir():
        print(
            f"error: {args.dist} does not exist: run `nox -s build_all` first, or name wheels: nox -s audit -- PATH..."
        )
        return 2
    vulns_json = args.dist / "vulnerabilities.json"
    reports = [args.dist / "audit-report.json", args.dist / "audit-report.md"]
    reports += [] if args.no_vulnerabilities else [vulns_json]
    try:
        fresh = args.fresh or args.summary is not None
        data = "" if args.no_vulnerabilities else f"the index's data of {stagecache.today()}"
        if args.advisories is not None and args.advisories.exists():
            data = f"advisories {stagecache.tree_sha256(args.advisories)}"
        if data:  # a waiver expires at midnight: the set in force today is what the answer rests on
            data += f"; waivers in force: {in_force(load_policy().vulnerability_waivers)}"
        stage = stages.audit(args.dist, reports, args.baseline, vulnerabilities=data, fresh=fresh)
    except distdir.DistError as exc:
        print(f"error: {exc}")
        return 2
    if stage.reuse() is not None:
        result = json.loads(reports[0].read_text())
        print(report.to_terminal(result), end="")
        if not args.no_vulnerabilities:
            print("\n".join(vulns.lines(vulns.Vulnerabilities(**_known(vulns_json)))))
        return 0
    # each published profile's closure, for the link rules (release/links.py); one not had is NOT CHECKED
    scopes_file, unlinked = links.write(args.dist, skip="--no-links" if args.no_links else "")
    extra += ["--link-scopes", str(scopes_file)]
    status = audit_main([str(args.dist), "--json", str(reports[0]), "--markdown", str(reports[1]), *extra])
    for line in unlinked:
        print(line)
    if args.no_vulnerabilities:
        vulns_json.write_text(json.dumps({"not_checked": "--no-vulnerabilities"}, indent=2) + "\n")
        print("vulnerabilities: NOT CHECKED (--no-vulnerabilities)")
    else:
        try:
            waivers = load_policy().vulnerability_waivers
            found = vulns.check(args.dist, waivers, paths.CACHE / "pip-audit", advisories=args.advisories)
        except StageError as exc:
            stage.release()
            return report_error(exc)
        vulns_json.write_text(json.dumps(found.as_dict(), indent=2) + "\n")
        print("\n".join(vulns.lines(found)))
        status = status or (1 if found.found else 0)
    # A run that found nothing is recorded; what it could not check stays in vulnerabilities.json (an
    # output the record hashes), so the release verdict says INCOMPLETE whether it ran or was reused.
    if status == 0:
        stage.done()
    else:
        stage.release()
    return status


def in_force(waivers: tuple[VulnerabilityWaiver, ...], today: datetime.date | None = None) -> list[str]:
    """The vulnerability waivers in force on `today` (UTC): what the audit's key holds of the policy's dates."""
    today = today or datetime.datetime.now(datetime.UTC).date()
    return sorted(f"{w.package}:{w.id} until {w.expires.isoformat()}" for w in waivers if w.expires >= today)


def _known(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data


if __name__ == "__main__":
    raise SystemExit(main())
