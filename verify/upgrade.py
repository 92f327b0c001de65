"""Upgrade verification: a venv holding the predecessor as its users have it, moved to this release the ways
users move (pip and uv, by the published install file and by `install -U` from an index), then compared with
a fresh install of this release.

A move passes when the moved venv holds:
- the same distributions at the same versions as the fresh install (the installers' own pip/setuptools aside);
- every file of every distribution's RECORD, with its size, and the KT distributions' files with their
  sha256 (kt-doctor's integrity check, kernel/python/kt_kernel/doctor.py, read by path);
- no file of the predecessor that no installed distribution owns (bytecode caches aside);
- a clean `pip check`.
A difference names the files, their owner before and after, the move's command and the fix. pip deletes a
file that changes owner when it uninstalls the old owner after installing the new one (pypa/pip#8509); uv
does not; the release's rule for such moves is checked on the wheels by release/diff.py, and here over the
whole installed closure (`owner_changes`).

`nox -s verify_install -- --previous SPEC` runs `upgrade_profile` per published profile on the first Python;
tests/integration/test_upgrade.py runs `check_move` on wheels it builds, with real pip and uv.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename

from base import distdir, paths
from locks.previous import previous_wheels

from .resolution import PUBLIC, index
from .venv import VerifyError, clean_env, fresh_venv, load_by_path

DOCTOR = paths.KERNEL / "python" / "kt_kernel" / "doctor.py"
SEEDS = frozenset({"pip", "setuptools", "wheel"})  # what venv/ensurepip put there, not the release's


def site_packages(venv: Path) -> Path:
    found = sorted(venv.glob("lib/python3*/site-packages"))
    if not found:
        raise VerifyError(f"{venv}: no lib/python3.N/site-packages; not a venv")
    return found[0]


@dataclass
class State:
    """What a venv holds: each distribution's version, the files no RECORD lists, and the damaged ones."""

    dists: dict[str, str]
    unowned: list[str]
    damaged: list[dict[str, Any]]
    owners: dict[str, str] = field(default_factory=dict)  # path (relative to site-packages) -> distribution
    requires: dict[str, list[str]] = field(default_factory=dict)  # distribution -> its Requires-Dist lines


def state(venv: Path) -> State:
    """The venv's state, read from its RECORDs and its files (nothing in it is imported or run)."""
    site = site_packages(venv)
    doctor = load_by_path("kt_doctor_upgrade", DOCTOR)
    damaged, _ = doctor.integrity(site)
    dists: dict[str, str] = {}
    owners: dict[str, str] = {}
    requires: dict[str, list[str]] = {}
    for d in metadata.distributions(path=[str(site)]):
        name = d.metadata["Name"]
        if not name:
            continue
        key = str(canonicalize_name(name))
        dists[key] = d.version
        try:
            requires[key] = list(d.requires or [])
            listed = list(d.files or [])
        except (TypeError, ValueError) as exc:  # a RECORD or METADATA pip could not read either
            raise VerifyError(f"{venv}: {name}'s metadata cannot be read ({exc}); reinstall it") from None
        for f in listed:
            p = Path(os.path.normpath(site / str(f)))
            owners[str(p.relative_to(site)) if p.is_relative_to(site) else str(p)] = key
    unowned = []
    for root, dirs, files in os.walk(site):
        dirs[:] = [x for x in dirs if x != "__pycache__"]
        for fname in files:
            rel = str((Path(root) / fname).relative_to(site))
            if rel not in owners and not fname.endswith(".pyc"):
                unowned.append(rel)
    damage = [
        {"distribution": x.distribution, "version": x.version, "missing": x.missing, "changed": x.changed}
        for x in damaged
    ]
    return State(dists, sorted(unowned), damage, owners, requires)


def compare(moved: State, fresh: State, before: State, how: str) -> list[str]:
    """What differs between the moved venv and a fresh install of the release, each naming the file, its owner
    before and after, the command (`how`) and the fix; [] when the move leaves what a fresh install leaves."""
    problems = []
    a = {k: v for k, v in moved.dists.items() if k not in SEEDS}
    b = {k: v for k, v in fresh.dists.items() if k not in SEEDS}
    left = sorted(set(a) - set(b))
    if left:  # neither pip nor uv removes what nothing requires any more: one line, not one per distribution
        shown = ", ".join(f"{n} {a[n]}" for n in left[:8]) + (f" and {len(left) - 8} more" if len(left) > 8 else "")
        problems.append(
            f"{how}: {len(left)} distributions of the predecessor stay that a fresh install lacks ({shown}); "
            "neither pip nor uv removes a distribution nothing requires any more; fix: name them in the release "
            f"notes for users to remove (pip uninstall {' '.join(left[:3])}{' ...' if len(left) > 3 else ''})"
        )
    for name in sorted(b):
        if a.get(name) != b[name]:
            problems.append(
                f"{how}: {name} is {a.get(name) or 'absent'} after the move, {b[name]} in a fresh install; fix: "
                "install it as the install file pins it"
            )
    for d in moved.damaged:
        files = d["missing"] + d["changed"]
        was = {before.owners.get(f, "nobody") for f in files}
        problems.append(
            f"{how}: {d['distribution']} {d['version']} lacks {len(d['missing'])} and has {len(d['changed'])} "
            f"changed of its files (e.g. {files[0]}; owned before the move by {', '.join(sorted(was))}): pip "
            f"deleted them uninstalling the previous owner after installing the new one (pypa/pip#8509); fix: the "
            f"new owner must require the old owner's new version (see release/diff.py), and users repair it with "
            f"pip install --force-reinstall --no-deps {d['distribution']}=={d['version']}"
        )
    left = sorted(set(moved.unowned) - set(fresh.unowned))
    if left:
        owned_before = sorted({before.owners.get(f, "nobody") for f in left})
        problems.append(
            f"{how}: {len(left)} files of the predecessor no installed distribution owns (e.g. {left[0]}; owned "
            f"before by {', '.join(owned_before)}); fix: the release must replace or remove the distribution that "
            "owned them"
        )
    return problems


def _env() -> dict[str, str]:
    """A user's clean shell: no PIP_/UV_ settings, and no pip configuration file of this machine's."""
    return {**clean_env(), "PIP_CONFIG_FILE": os.devnull}


def owner_changes(before: State, after: State) -> list[dict[str, Any]]:
    """The paths of the whole installed closure whose owner differs between the predecessor's venv and the
    release's, grouped by (before, after), each with whether pip's order keeps it (the new owner requires the
    old owner's new version: carriers.graph.Graph.replaced_first over what is installed)."""
    from carriers.graph import Graph

    graph = Graph(after.requires)
    moved: dict[tuple[str, str], list[str]] = {}
    for path, old in before.owners.items():
        new = after.owners.get(path)
        if new is not None and new != old and not path.endswith(".pyc"):
            moved.setdefault((old, new), []).append(path)
    return [
        {
            "before": old,
            "after": new,
            "paths": len(paths),
            "examples": sorted(paths)[:5],
            "safe_for_pip": old in after.dists and graph.replaced_first(new, old, after.dists[old]),
        }
        for (old, new), paths in sorted(moved.items())
    ]


def run(argv: Sequence[str], what: str, env: Mapping[str, str] | None = None) -> float:
    """`argv` run to completion; its seconds, or VerifyError naming the command and its output."""
    t0 = time.perf_counter()
    got = subprocess.run(list(argv), capture_output=True, text=True, check=False, env=dict(env or _env()))
    if got.returncode != 0:
        raise VerifyError(f"{what} failed (`{' '.join(argv)}`):\n{got.stdout[-1500:]}{got.stderr[-1500:]}")
    return time.perf_counter() - t0


def pip_check(venv: Path) -> str:
    got = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "check"],
        capture_output=True,
        text=True,
        check=False,
        env=clean_env(),
    )
    return "" if got.returncode == 0 else (got.stdout + got.stderr).strip()


@dataclass(frozen=True)
class Move:
    """One way users move: its name (`pip-file`, `uv-upgrade`, ...) and the command, `{python}` standing for
    the venv's interpreter."""

    name: str
    argv: tuple[str, ...]

    def command(self, venv: Path) -> list[str]:
        python = str(venv / "bin" / "python")
        return [a.replace("{python}", python) for a in self.argv]


def check_move(
    work: Path,
    previous: Sequence[Sequence[str]],
    move: Move,
    fresh: State,
    interpreter: Any = None,
) -> dict[str, Any]:
    """A venv with the predecessor installed (`previous`: commands, `{python}` the venv's interpreter), moved by
    `move`, compared with `fresh` (a fresh install's state): {"move", "seconds", "problems", ...}."""
    venv = fresh_venv(work / move.name, interpreter)
    python = str(venv / "bin" / "python")
    t0 = time.perf_counter()
    for argv in previous:
        run([a.replace("{python}", python) for a in argv], f"installing the predecessor ({move.name})")
    before = state(venv)
    cmd = move.command(venv)
    run(cmd, f"the move {move.name}")
    after = state(venv)
    how = f"{move.name} (`{' '.join(cmd)}`)"
    problems = compare(after, fresh, before, how)
    if wrong := pip_check(venv):
        problems.append(f"{how}: pip check: {wrong}")
    result = {
        "move": move.name,
        "command": " ".join(cmd),
        "seconds": round(time.perf_counter() - t0, 1),
        "files_missing": sum(len(d["missing"]) for d in after.damaged),
        "owner_changes": owner_changes(before, fresh),
        "problems": problems,
    }
    shutil.rmtree(venv, ignore_errors=True)
    return result


def moves(index_url: str, install_file: Path, root: str, version: str, uv: str) -> list[Move]:
    """The ways users move to the release: its published install file, and `install -U` of the profile's root
    at the release's version by normal resolution, each by pip and by uv, from `index_url` (an index serving
    the release, as the one it is published to does: verify.resolution.index, other projects from PyPI)."""
    pinned = f"{root}=={version}"
    pip = ("{python}", "-m", "pip", "install", "--disable-pip-version-check", "-q", "--index-url", index_url)
    # uv takes a project from the first index that has it (`--index` before the default: ours from the
    # release's index), the rest from PyPI
    uv_pip = (uv, "pip", "install", "--python", "{python}", "--index", index_url, "--default-index", PUBLIC)
    return [
        Move("pip-file", (*pip, "--require-hashes", "-r", str(install_file))),
        Move("pip-upgrade", (*pip, "-U", pinned)),
        Move("uv-file", (*uv_pip, "--require-hashes", "-r", str(install_file))),
        Move("uv-upgrade", (*uv_pip, "-U", pinned)),
    ]


def predecessor_install(spec: str, root: str, profile: str, python: str) -> tuple[list[list[str]], str]:
    """How the predecessor's users have the profile: its own published install file where the predecessor is an
    earlier dist/ that has one for this Python, else the profile's root at the predecessor's version by normal
    resolution, its wheels found beside the index. (Commands, `{python}` the venv's interpreter; what it is.)"""
    wheels, how = previous_wheels(spec, python)
    folder = wheels[0].parent if wheels else Path(spec)
    pip = ["{python}", "-m", "pip", "install", "--disable-pip-version-check", "-q", "--find-links", str(folder)]
    if (folder / distdir.MANIFEST).is_file():
        entry = distdir.open_release(folder).manifest.install_file(profile, python)
        if entry is not None:
            return [[*pip, "--require-hashes", "-r", str(folder / entry.file)]], f"{entry.file} of {how}"
    name = canonicalize_name(Requirement(root).name)
    versions = {
        canonicalize_name(parse_wheel_filename(w.name)[0]): str(parse_wheel_filename(w.name)[1]) for w in wheels
    }
    if name not in versions:
        raise VerifyError(
            f"the predecessor ({how}) has no {name}: its users never installed {root}; name one that does"
        )
    return [[*pip, f"{root}=={versions[name]}"]], f"{root}=={versions[name]} from {how}"


def upgrade_profile(
    dist: Path, work: Path, interpreter: Any, spec: str, profile: str, only: Sequence[str] = ()
) -> dict[str, Any]:
    """The profile moved from the predecessor `spec` to the release by every move (or `only` these), each
    compared with a fresh install of the published file: {"previous", "moves": [...], "problems": [...]}."""
    from .profiles import root

    t0 = time.perf_counter()
    release = distdir.open_release(dist)
    install, _ = release.install_file(profile, interpreter.python)
    top = root(profile)
    version = release.manifest.versions()[canonicalize_name(Requirement(top).name)]
    previous, what = predecessor_install(spec, top, profile, interpreter.python)
    with index(dist) as url:
        every = moves(url, install, top, version, shutil.which("uv") or "uv")
        venv = fresh_venv(work / "fresh", interpreter)
        run(every[0].command(venv), "a fresh install of the published file")
        fresh = state(venv)
        shutil.rmtree(venv, ignore_errors=True)
        results = [check_move(work, previous, m, fresh, interpreter) for m in every if not only or m.name in only]
    return {
        "previous": what,
        "moves": results,
        "problems": [p for r in results for p in r["problems"]],
        "seconds": round(time.perf_counter() - t0, 1),
    }
