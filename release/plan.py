"""The publish plan: the target index's state for every project of the release, read before the first
byte goes up (PEP 691 JSON with PEP 700's sizes, upload times and versions where served; PEP 503 HTML
otherwise, sizes then asked of the files themselves), and everything the index would refuse:

- a file over the index's per-file limit (release/indexes.toml: PyPI's defaults, raised project limits);
- a project whose files would pass its quota;
- a local version (1.0+kt) where the index refuses them;
- a version of ours that already exists there with files the release does not have (someone else's
  build of the same version: an installer could take theirs), unless --add-to-existing is given and
  the index's window for adding files to that release is still open (times from the index's answer);
- a file of ours whose name is there with other bytes.

What is already there with identical bytes is a half-published release: publish uploads the rest."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import tomllib
from packaging.utils import (
    canonicalize_name,
    canonicalize_version,
    parse_wheel_filename,
)

from locks.simple import IndexFile, ProjectState

from .errors import ReleaseError

RULES_FILE = Path(__file__).with_name("indexes.toml")
MIB = 1 << 20


class PlanError(ReleaseError):
    """The index cannot be read, or its rules file is wrong; the message names which and why."""


@dataclass(frozen=True)
class Rules:
    """What one index accepts (release/indexes.toml)."""

    file_limit: int  # bytes
    project_quota: int  # bytes
    add_window: timedelta
    local_versions: bool
    new_project_note: str
    projects: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # raised limits per project

    def file_limit_of(self, project: str) -> int:
        raised = self.projects.get(canonicalize_name(project), {})
        return int(float(raised.get("file_limit_mib", self.file_limit / MIB)) * MIB)

    def quota_of(self, project: str) -> int:
        raised = self.projects.get(canonicalize_name(project), {})
        return int(float(raised.get("project_quota_gib", self.project_quota / (1 << 30))) * (1 << 30))


def load_rules(index_url: str, path: Path = RULES_FILE) -> Rules:
    """The rules for `index_url`: the first [[index]] whose url is a prefix of it, over [default]."""
    try:
        data = tomllib.loads(path.read_text())
        merged = dict(data["default"])
        for entry in data.get("index", []):
            if index_url.startswith(str(entry["url"])):
                merged |= {k: v for k, v in entry.items() if k != "url"}
                break
        return Rules(
            int(float(merged["file_limit_mib"]) * MIB),
            int(float(merged["project_quota_gib"]) * (1 << 30)),
            timedelta(days=float(merged["add_window_days"])),
            bool(merged["local_versions"]),
            str(merged.get("new_project_note", "")),
            {canonicalize_name(k): v for k, v in dict(merged.get("projects", {})).items()},
        )
    except (OSError, tomllib.TOMLDecodeError, KeyError, TypeError, ValueError) as exc:
        raise PlanError(f"{path}: unreadable index rules ({type(exc).__name__}: {exc}); fix the file") from None


@dataclass(frozen=True)
class Row:
    """One file of the release in the plan."""

    filename: str
    project: str
    version: str
    size: int
    limit: int
    state: str  # "upload", "already there, identical", "already there, DIFFERENT bytes"


@dataclass
class Plan:
    """The plan: a row per file, a summary per project, and everything that would fail."""

    index_url: str
    rows: list[Row] = field(default_factory=list)
    projects: list[dict[str, Any]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def uploads(self) -> list[str]:
        return [r.filename for r in self.rows if r.state == "upload"]

    @property
    def present(self) -> list[str]:
        return [r.filename for r in self.rows if r.state.startswith("already there, identical")]


def make_plan(
    files: Mapping[str, tuple[str, int]],
    index_url: str,
    rules: Rules,
    states: Mapping[str, ProjectState],
    *,
    add_to_existing: bool = False,
    now: datetime | None = None,
) -> Plan:
    """The plan for `files` (filename -> (sha256, size)) against the index's `states` (project -> state)."""
    now = now or datetime.now(UTC)
    plan = Plan(index_url)
    by_project: dict[str, list[str]] = {}
    for fname in sorted(files):
        name = canonicalize_name(str(parse_wheel_filename(fname)[0]))
        by_project.setdefault(name, []).append(fname)
    for project, fnames in sorted(by_project.items()):
        state = states[project]
        ours = set(fnames)
        limit = rules.file_limit_of(project)
        new_bytes = 0
        for fname in fnames:
            digest, size = files[fname]
            version = str(parse_wheel_filename(fname)[1])
            there = state.files.get(fname)
            if there is None:
                row_state = "upload"
                new_bytes += size
            elif there.sha256 in (None, digest):
                row_state = "already there, identical" if there.sha256 else "already there (no hash stated)"
            else:
                row_state = "already there, DIFFERENT bytes"
                plan.problems.append(
                    f"{project} {version}: {fname} is already on {index_url} with sha256 {there.sha256}, ours is "
                    f"{digest}; an index never replaces a file: publish a new version"
                )
            plan.rows.append(Row(fname, project, version, size, limit, row_state))
            if row_state == "upload" and size > limit:
                plan.problems.append(
                    f"{project} {version}: {fname} is {size / MIB:.1f} MiB, over {index_url}'s per-file limit of "
                    f"{limit / MIB:.0f} MiB; ask the index to raise {project}'s limit and record it in "
                    f"{RULES_FILE.name}, or cut the payload into more parts"
                )
            if "+" in version and not rules.local_versions:
                plan.problems.append(
                    f"{project} {version}: a local version, which {index_url} refuses; publish a public version "
                    "(a .postN), or publish to an index that takes local versions"
                )
        existing = sum(f.size or 0 for f in state.files.values())
        unknown = [f for f in state.files.values() if f.size is None]
        quota = rules.quota_of(project)
        after = existing + new_bytes
        summary: dict[str, Any] = {
            "project": project,
            "new": not state.exists,
            "files_there": len(state.files),
            "total_after": after,
            "quota": quota,
            "how": state.how,
        }
        if after > quota:
            plan.problems.append(
                f"{project}: {after / 2**30:.2f} GiB after this upload, over {index_url}'s project quota of "
                f"{quota / 2**30:.0f} GiB; delete old releases there, or ask for a larger quota"
            )
        if unknown:
            plan.notes.append(
                f"{project}: {len(unknown)} file(s) on the index state no size; the total counts them as 0"
            )
        if not state.exists and rules.new_project_note:
            plan.notes.append(f"{project} is new on {index_url}: {rules.new_project_note}")
        # Every file of our version on the index is that version, local label or not: pip takes someone's
        # 0.6.1+cu132 for our pin ==0.6.1 (PEP 440 matching ignores the local label).
        mine = {_public(str(parse_wheel_filename(f)[1])): str(parse_wheel_filename(f)[1]) for f in fnames}
        held_by: dict[str, list[IndexFile]] = {}
        for version, held in state.versions().items():
            held_by.setdefault(_public(version), []).extend(held)
        for version, held in sorted(held_by.items()):
            foreign = sorted(f.filename for f in held if f.filename not in ours)
            if not foreign or version not in mine:
                continue
            summary.setdefault("foreign", {})[mine[version]] = foreign
            _foreign(plan, project, mine[version], foreign, held, rules, add_to_existing, now)
        plan.projects.append(summary)
    if plan.present and plan.uploads:
        plan.notes.append(
            f"half-published: {len(plan.present)} of {len(plan.rows)} files are already there with the same bytes; "
            "publish uploads the other "
            f"{len(plan.uploads)}"
        )
    return plan


def _public(version: str) -> str:
    """A version without its local label, normalized: what an installer's `==` pin matches."""
    from packaging.version import InvalidVersion, Version

    try:
        return canonicalize_version(Version(version).public)
    except InvalidVersion:
        return canonicalize_version(version)


def _foreign(
    plan: Plan,
    project: str,
    version: str,
    foreign: list[str],
    there: list[IndexFile],
    rules: Rules,
    add_to_existing: bool,
    now: datetime,
) -> None:
    """A version of ours the index holds with files we do not have: refused, unless --add-to-existing and
    the index's window for that release is open (from the first upload time it states)."""
    shown = ", ".join(foreign[:4]) + (f" and {len(foreign) - 4} more" if len(foreign) > 4 else "")
    if not add_to_existing:
        plan.problems.append(
            f"{project} {version} already exists on {plan.index_url} with files this release does not have "
            f"({shown}): an installer could take theirs. Publish a new version (bump it), or, to add files to "
            "your own release, --add-to-existing"
        )
        return
    times = [f.uploaded for f in there if f.uploaded is not None]
    if not times:
        plan.problems.append(
            f"{project} {version}: --add-to-existing needs the release's upload time, and {plan.index_url} states "
            "none (PEP 700); the window cannot be checked, so nothing is added"
        )
        return
    closes = min(times) + rules.add_window
    if now > closes:
        plan.problems.append(
            f"{project} {version}: the window to add files closed {closes:%Y-%m-%d %H:%M} UTC ({rules.add_window.days} "
            f"days after its first file, {min(times):%Y-%m-%d}); publish a new version (a .postN) with these files"
        )
    else:
        plan.notes.append(
            f"{project} {version}: adding to the existing release ({shown} stay); its window is open until "
            f"{closes:%Y-%m-%d %H:%M} UTC"
        )


def render(plan: Plan) -> str:
    """The plan as a table, then each project's totals, the notes and the problems."""
    lines = [f"publish plan for {plan.index_url}", ""]
    width = max([len(r.filename) for r in plan.rows] + [4])
    lines.append(f"  {'file':<{width}}  {'MiB':>8}  {'limit':>6}  state")
    for r in plan.rows:
        over = " OVER" if r.size > r.limit and r.state == "upload" else ""
        lines.append(f"  {r.filename:<{width}}  {r.size / MIB:>8.1f}  {r.limit / MIB:>6.0f}  {r.state}{over}")
    lines.append("")
    for p in plan.projects:
        status = "new on this index" if p["new"] else f"{p['files_there']} file(s) there ({p['how']})"
        lines.append(
            f"  {p['project']}: {status}; {p['total_after'] / 2**30:.2f} of {p['quota'] / 2**30:.0f} GiB after upload"
            + (f"; other files of {', '.join(p['foreign'])}" if p.get("foreign") else "")
        )
    lines += [f"  note: {n}" for n in plan.notes]
    lines += [f"  REFUSED: {p}" for p in plan.problems]
    verdict = "OK" if plan.ok else f"REFUSED ({len(plan.problems)} problem(s)); nothing is uploaded"
    lines += ["", f"plan: {verdict}: {len(plan.uploads)} to upload, {len(plan.present)} already there"]
    return "\n".join(lines)
