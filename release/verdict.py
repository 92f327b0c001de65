"""The release's verdict: PASSED, FAILED or INCOMPLETE, from every check's evidence for exactly this build.

Each check the release makes is an item with a stable name (what `--accept NAME=REASON` names):

- ``dist``: the files of dist/ are the ones SHA256SUMS lists (a mismatch fails the release);
- ``partial``: a partial development release (manifest.json says which Pythons it lacks);
- ``audit``: the wheel audit of these wheels (dist/audit-report.json);
- ``vulnerabilities``: the known-vulnerability check as a whole (skipped, or not run for this build), and
  ``vulnerabilities:NAME==VERSION`` for each pin it could not check; ``vulnerability:NAME==VERSION:ID``
  for each vulnerability found and not waived (a failure);
- ``verify:PROFILE-cp3NN``: each install-verification profile on each Python it runs on (the Python's
  evidence, build/verify-cp3NN.json);
- ``published:FILE``: each install file of dist/install/, installed by hash exactly as published and
  exercised on its own Python (a verification result that names its sha256);
- ``resolve:PROFILE-cp3NN``: normal resolution of each install profile with each Python's own interpreter
  (a simulated one, where none exists, can fail but never pass);
- ``python:3.N``: the interpreter each Python of the matrix ran on (path, exact version, how it was found).

An item is passed, failed (the check ran and found a problem) or missing (it did not run for this build,
or ran and could not check: NOT VERIFIED, NOT CHECKED). The release is FAILED if any item failed,
INCOMPLETE if any is missing, PASSED otherwise. A missing item may be accepted by name (a glob: ``--accept
'vulnerabilities:*=...'``) with a reason, on the command line or in the policy's ``[[accept_incomplete]]``
(with an expiry date); a failed item can never be. An INCOMPLETE release whose every missing item is
accepted may be published, and says so everywhere it is shown.
"""

from __future__ import annotations

import datetime
import fnmatch
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from base import distdir
from base.version import python_tag

from .errors import ReleaseError

PASSED, FAILED, INCOMPLETE = "PASSED", "FAILED", "INCOMPLETE"


@dataclass(frozen=True)
class Item:
    """One check of the release: its name, state ("passed", "failed", "missing") and what it found."""

    name: str
    state: str
    detail: str = ""


@dataclass(frozen=True)
class Acceptance:
    """A missing item accepted by name (or glob) with a reason; from the command line or the policy."""

    pattern: str
    reason: str
    source: str  # "command line", or "policy (until YYYY-MM-DD)"

    def covers(self, item: Item) -> bool:
        return fnmatch.fnmatchcase(item.name, self.pattern)


def parse_accept(values: Iterable[str]) -> list[Acceptance]:
    """`--accept NAME=REASON` values; ReleaseError names a value without a reason."""
    out = []
    for value in values:
        name, sep, reason = value.partition("=")
        if not sep or not name.strip() or not reason.strip():
            raise ReleaseError(
                f"--accept {value!r}: give the item's name and a reason, e.g. "
                "--accept 'python:3.13=no Debian mirror on this site'"
            )
        out.append(Acceptance(name.strip(), reason.strip(), "command line"))
    return out


def from_policy(entries: Iterable[Any], today: datetime.date | None = None) -> list[Acceptance]:
    """The policy's [[accept_incomplete]] entries still in force (an expired one accepts nothing)."""
    today = today or datetime.datetime.now(datetime.UTC).date()
    return [
        Acceptance(e.item, e.reason, f"policy (until {e.expires.isoformat()})") for e in entries if e.expires >= today
    ]


@dataclass
class Verdict:
    """The verdict over every item, and which acceptance covers each missing one."""

    items: list[Item]
    acceptances: list[Acceptance] = field(default_factory=list)

    @property
    def failed(self) -> list[Item]:
        return [i for i in self.items if i.state == "failed"]

    def _acceptance(self, item: Item) -> Acceptance | None:
        return next((a for a in self.acceptances if a.covers(item)), None)

    @property
    def accepted(self) -> list[tuple[Item, Acceptance]]:
        out = []
        for i in self.items:
            if i.state == "missing" and (a := self._acceptance(i)) is not None:
                out.append((i, a))
        return out

    @property
    def missing(self) -> list[Item]:
        """Missing items no acceptance covers."""
        return [i for i in self.items if i.state == "missing" and self._acceptance(i) is None]

    @property
    def verdict(self) -> str:
        if self.failed:
            return FAILED
        if self.missing or self.accepted:
            return INCOMPLETE
        return PASSED

    @property
    def publishable(self) -> bool:
        """PASSED, or INCOMPLETE with every missing item accepted."""
        return not self.failed and not self.missing

    @property
    def badge(self) -> str:
        if self.verdict == INCOMPLETE and self.publishable:
            return f"INCOMPLETE, ACCEPTED ({len(self.accepted)} items)"
        return self.verdict

    def as_dict(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "publishable": self.publishable,
            "failed": [{"item": i.name, "detail": i.detail} for i in self.failed],
            "missing": [{"item": i.name, "detail": i.detail} for i in self.missing],
            "accepted": [
                {"item": i.name, "detail": i.detail, "reason": a.reason, "by": a.source, "pattern": a.pattern}
                for i, a in self.accepted
            ],
            "passed": [i.name for i in self.items if i.state == "passed"],
        }

    def lines(self) -> list[str]:
        """The verdict for people: what failed, what is missing (and the flag that accepts it), what was accepted."""
        n = len(self.items)
        passed = sum(i.state == "passed" for i in self.items)
        out = [f"release verdict: {self.badge} ({passed} of {n} checks passed)"]
        out += [f"  FAILED {i.name}: {i.detail}" for i in self.failed]
        for name, group in _families(self.missing):
            first = group[0]
            if len(group) == 1:
                what = f"{first.name}: {first.detail}"
            else:
                what = f"{name} ({len(group)} items, e.g. {first.name}: {first.detail})"
            out.append(
                f"  missing {what}; run it, or accept it: --accept '{name}=REASON' "
                "(or the policy's [[accept_incomplete]] item, reason, expires)"
            )
        for name, pairs in _families([i for i, _ in self.accepted]):
            acceptance = next(a for i, a in self.accepted if i is pairs[0])
            many = f" ({len(pairs)} items)" if len(pairs) > 1 else f": {pairs[0].detail}"
            out.append(f"  accepted {name}{many} (by {acceptance.source}: {acceptance.reason})")
        return out


FAMILY_AT = 4  # this many missing items of one family (the name before its last ":") are shown as one glob


def _families(items: Sequence[Item]) -> list[tuple[str, list[Item]]]:
    """Items by family (`vulnerabilities:a==1` -> `vulnerabilities:*`) where a family has FAMILY_AT or
    more, else one by one; in their order."""
    counts: dict[str, int] = {}
    for i in items:
        family = i.name.rpartition(":")[0]
        counts[family] = counts.get(family, 0) + 1
    groups: dict[str, list[Item]] = {}
    for i in items:
        family = i.name.rpartition(":")[0]
        key = f"{family}:*" if family and counts[family] >= FAMILY_AT else i.name
        groups.setdefault(key, []).append(i)
    return list(groups.items())


# --- the items, from each check's evidence ------------------------------------------------------------


def dist_items(key: str | None) -> list[Item]:
    """`dist`: the files dist/ holds are the ones SHA256SUMS lists (key None: they are not)."""
    if key is None:
        return [Item("dist", "failed", "dist/ does not match its SHA256SUMS (a file missing or changed); rebuild it")]
    return [Item("dist", "passed")]


def partial_items(manifest: distdir.Manifest) -> list[Item]:
    if not manifest.partial:
        return [Item("partial", "passed", "a whole release: every Python of the matrix")]
    missing = ", ".join(manifest.partial.missing)
    return [Item("partial", "missing", f"a partial development release: no wheels for CPython {missing}")]


def audit_items(audit: Mapping[str, Any]) -> list[Item]:
    """`audit`: this build's report (an empty mapping: none for these wheels)."""
    if not audit:
        return [Item("audit", "missing", "no audit of these wheels (nox -s audit)")]
    errors = sum(f.get("severity") == "error" for f in audit.get("findings", []))
    unlinked = [
        Item(f"links:{scope}", "missing", f"NOT CHECKED: {why}")
        for scope, why in sorted((audit.get("links_not_checked") or {}).items())
    ]
    if not audit.get("passed"):
        return [Item("audit", "failed", f"{errors} error findings (dist/audit-report.md)"), *unlinked]
    return [Item("audit", "passed"), *unlinked]


def vulnerability_items(data: Any, today: datetime.date | None = None) -> list[Item]:
    """dist/vulnerabilities.json: each unwaived vulnerability fails, each unchecked pin is missing. A waiver
    is judged on the day of judging (`today`, UTC), not the day the audit ran: one that has expired since
    (or records no valid date) waives nothing, so publish re-judging old evidence fails it."""
    if not isinstance(data, dict):
        return [Item("vulnerabilities", "missing", "not run for these wheels (nox -s audit)")]
    if isinstance(data.get("not_checked"), str):
        return [Item("vulnerabilities", "missing", f"skipped ({data['not_checked']})")]
    items = [
        Item(
            f"vulnerability:{f['package']}=={f['version']}:{f['id']}",
            "failed",
            f"{f['id']} in {f['package']} {f['version']}"
            + (f", fixed in {', '.join(f['fix_versions'])}" if f.get("fix_versions") else ""),
        )
        for f in data.get("found", [])
    ]
    today = today or datetime.datetime.now(datetime.UTC).date()
    for w in data.get("waived", []):
        until = _date(w.get("expires"))
        if until is None or until < today:
            items.append(
                Item(
                    f"vulnerability:{w['package']}=={w['version']}:{w['id']}",
                    "failed",
                    f"{w['id']} in {w['package']} {w['version']}: its waiver "
                    + (f"expired {until.isoformat()}" if until else f"has no valid date ({w.get('expires')!r})")
                    + "; upgrade it in the lock (nox -s lock), or renew the waiver in the policy and audit again",
                )
            )
    unchecked = data.get("not_checked", {})
    items += [Item(f"vulnerabilities:{pin}", "missing", f"NOT CHECKED: {why}") for pin, why in unchecked.items()]
    source = data.get("source", {})
    via = f" from {source.get('kind', 'the index')}" if source else ""
    checked = int(data.get("asked", 0)) - len(unchecked)
    items.append(Item("vulnerabilities", "passed", f"{checked} pins checked{via}"))
    return items


def _date(value: object) -> datetime.date | None:
    try:
        return datetime.date.fromisoformat(str(value))
    except ValueError:
        return None


NOT_THIS_BUILD = "not verified for this build"


def upgrade_items(evidence: Mapping[str, Mapping[str, Any]], key: str | None) -> list[Item]:
    """`upgrade:PROFILE-cp3NN`: the move from the predecessor (verify_install --previous) of each profile that
    ran; none where no predecessor was named (not a failure)."""
    items = []
    for python, data in sorted(evidence.items()):
        for profile, result in sorted((data.get("upgrade") or {}).items()):
            name = f"upgrade:{profile}-{python_tag(python)}"
            if result.get("problems"):
                items.append(Item(name, "failed", "; ".join(map(str, result["problems"]))))
            else:
                items.append(
                    _run_item(name, result, key, f"nox -s verify_install -- --previous SPEC --python {python}")
                )
    return items


def diff_items(data: Any, key: str | None) -> list[Item]:
    """dist/release-diff.json (release_report --previous): `diff` fails on a path that changes owner unsafely
    for pip; a diff of other wheels is missing; no diff (no predecessor named) is no item, never a failure."""
    if not isinstance(data, dict):
        return []
    if key is None or data.get("dist_sha256") != key:
        return [Item("diff", "missing", f"{NOT_THIS_BUILD}: the release diff judged other wheels (--previous)")]
    errors = [str(e) for e in data.get("errors") or []]
    if errors:
        return [Item("diff", "failed", "; ".join(errors))]
    return [Item("diff", "passed", f"against {data.get('previous')}")]


def _run_item(name: str, result: Mapping[str, Any] | None, key: str | None, how: str) -> Item:
    """One run's item from its evidence: obtained on this build (`key`), or missing with why."""
    if not isinstance(result, Mapping):
        return Item(name, "missing", f"not run ({how})")
    if key is None or (result.get("dist_sha256") != key and result.get("installs_from_dist") is not False):
        when = f", produced {result['produced']}" if result.get("produced") else ""
        return Item(name, "missing", f"{NOT_THIS_BUILD} (obtained on other wheels{when}; {how})")
    if result.get("error"):
        return Item(name, "failed", str(result["error"]))
    if result.get("problems"):
        return Item(name, "failed", "; ".join(map(str, result["problems"])))
    if result.get("not_verified"):
        return Item(name, "missing", f"NOT VERIFIED: {result['not_verified']}")
    return Item(name, "passed")


def verify_items(
    expected: Sequence[tuple[str, str]], evidence: Mapping[str, Mapping[str, Any]], key: str | None
) -> list[Item]:
    """`verify:PROFILE-cp3NN`: each venv profile on each Python it runs on (`expected`), from that Python's
    evidence (base.evidence): passed on these wheels, failed, or why it is missing."""
    items = []
    for profile, python in expected:
        result = evidence.get(python, {}).get("profiles", {}).get(profile)
        how = f"nox -s verify_install -- --profile {profile} --python {python}"
        items.append(_run_item(f"verify:{profile}-{python_tag(python)}", result, key, how))
    return items


def resolution_items(
    expected: Sequence[tuple[str, str]], evidence: Mapping[str, Mapping[str, Any]], key: str | None
) -> list[Item]:
    """`resolve:PROFILE-cp3NN`: normal resolution of each (install profile, Python): ok, problems (failed),
    NOT VERIFIED (a simulated one: no interpreter of that Python) or not run (missing)."""
    items = []
    for profile, python in expected:
        result = evidence.get(python, {}).get("resolution", {}).get(profile)
        how = f"nox -s verify_install -- --profile resolve --python {python}"
        items.append(_run_item(f"resolve:{profile}-{python_tag(python)}", result, key, how))
    return items


def python_items(
    pythons: Sequence[str], evidence: Mapping[str, Mapping[str, Any]], key: str | None = None
) -> list[Item]:
    """`python:3.N`: the release exercised on CPython 3.N's own interpreter (its evidence names which: path,
    exact version, how it was found), or NOT VERIFIED naming the sources tried and how to provide one. The
    interpreter's record counts only for the build it was found for (`key`, its `dist_sha256`): another
    build's evidence is missing, as every other item's is."""
    items = []
    for python in pythons:
        found = evidence.get(python, {}).get("interpreter")
        name = f"python:{python}"
        how = f"nox -s verify_install -- --python {python}"
        if not isinstance(found, Mapping):
            items.append(Item(name, "missing", f"not run ({how})"))
            continue
        if key is None or found.get("dist_sha256") != key:
            items.append(Item(name, "missing", f"{NOT_THIS_BUILD} (the interpreter was found for other wheels; {how})"))
            continue
        i = found.get("interpreter")
        if isinstance(i, Mapping):
            where = f" in {i.get('root')}" if i.get("root") else ""
            items.append(
                Item(name, "passed", f"CPython {i.get('version')} from {i.get('source')}: {i.get('path')}{where}")
            )
            continue
        tried = "; ".join(f"{a.get('source')} {a.get('path')}: {a.get('problem')}" for a in found.get("tried") or [])
        searched = "; ".join(map(str, found.get("searched") or []))
        items.append(
            Item(
                name,
                "missing",
                f"NOT VERIFIED: no CPython {python} interpreter ({searched}{'; ' + tried if tried else ''})",
            )
        )
    return items


def published_items(manifest: distdir.Manifest, results: Iterable[Any]) -> list[Item]:
    """`published:FILE`: each install file users get (dist/install/*.txt), exercised as published when a
    verification result of these wheels (on its own Python) installed exactly it (its `install_file` sha256)."""
    exercised = {
        str(r["install_file"].get("sha256"))
        for r in results
        if isinstance(r, dict) and isinstance(r.get("install_file"), dict) and not r.get("error")
    }
    items = []
    for f in manifest.install or ():
        if f.format != "requirements":
            continue
        name = f"published:{Path(f.file).name}"
        if f.sha256 in exercised:
            items.append(Item(name, "passed"))
        else:
            cmd = f"nox -s verify_install -- --profile {f.profile} --python {f.python}"
            items.append(Item(name, "missing", f"not exercised on CPython {f.python} ({cmd})"))
    return items
