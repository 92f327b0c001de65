"""Who owns what in an installed venv: the forks (not upstream) provide each upstream import package,
every installed path has one owner, renamed upstreams answer lookups by their own name."""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name

from carriers import load as load_carriers

from .venv import VerifyError, run_probe


@functools.cache
def upstream() -> tuple[str, ...]:
    """The upstream projects the forks and repacks replace (carriers/carriers.toml, their one owner)."""
    return tuple(sorted(str(canonicalize_name(u)) for u in load_carriers().by_upstream()))


def accepted_collisions() -> dict[str, frozenset[str]]:
    """path -> the distributions the audit policy accepts writing it (`[[installed_collision]]` of
    audits/policy/default.toml, read by the policy's own loader)."""
    from audits.policy import load_policy

    return {p: frozenset(_norm(b) for b in between) for p, between in load_policy().installed_collisions.items()}


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def path_collisions(
    owners: dict[str, dict[str, str]], accepted: dict[str, frozenset[str]] | None = None
) -> tuple[list[str], list[str]]:
    """(conflicts, shared) among installed distributions: paths two of them write with different
    bytes (whichever installed last won, uninstalling either breaks the other), and paths they
    write with identical bytes or that the policy accepts (reported, not failed).
    `owners`: distribution -> {installed path: RECORD hash}."""
    accepted = accepted or {}
    seen: dict[str, tuple[str, str]] = {}
    conflicts: list[str] = []
    shared: list[str] = []
    for dist in sorted(owners):
        for path, digest in sorted(owners[dist].items()):
            if path not in seen:
                seen[path] = (dist, digest)
                continue
            first, first_digest = seen[path]
            line = f"{path}: {first} and {dist}"
            ok = (digest and digest == first_digest) or {_norm(first), _norm(dist)} <= accepted.get(path, frozenset())
            (shared if ok else conflicts).append(line)
    return conflicts, shared


def check_collisions(venv: Path) -> list[str]:
    """Every installed path has one owner (or identical bytes); returns the shared ones."""
    owners = run_probe(venv, "installed-path owners", "owners")
    conflicts, shared = path_collisions(owners, accepted_collisions())
    if conflicts:
        shown = "\n  ".join(conflicts[:10]) + (f"\n  ... and {len(conflicts) - 10} more" if len(conflicts) > 10 else "")
        raise VerifyError(f"distributions in {venv} write the same paths with different bytes:\n  {shown}")
    return shared


def fork_status(venv: Path, names: tuple[str, ...]) -> dict[str, str]:
    """upstream name -> the distribution providing it ("<name>-kt" when the fork does)."""
    status: dict[str, str] = run_probe(venv, "fork check", "forks", *names)
    return status


def dist_names(venv: Path) -> dict[str, Any]:
    """verify/probes/dist_names.py in the venv: lookups by upstream name and the sites that use them."""
    found: dict[str, Any] = run_probe(venv, "lookups by distribution name", "dist_names")
    return found


def closure_lookups(venv: Path, renamed: set[str]) -> list[str]:
    """file:line of every lookup of a renamed upstream by the installed closure's own code (the
    release's wheels are scanned by the audit; these are the third-party ones a profile pulls in)."""
    from audits.readers import find_lookups  # the audit's own reader of lookups by name (ast only)

    site = next(venv.glob("lib/python*/site-packages"))
    ours = {f"{c.import_package}/" for c in load_carriers().carriers}
    out = []
    for f in sorted(site.rglob("*.py")):
        rel = f.relative_to(site).as_posix()
        if rel.startswith(tuple(ours)):
            continue
        out += [
            f"{rel}:{lk.line} {lk.call}({lk.name!r}) [{lk.api}]"
            for lk in find_lookups(rel, f.read_bytes())
            if str(canonicalize_name(lk.name)) in renamed
        ]
    return out


def dist_name_problems(found: dict[str, Any]) -> list[str]:
    """What dist_names found wrong: a renamed upstream not answering as itself, or a site that still misses."""
    wrong = [
        f"version({n!r}) gives {v['got']}, not {v['want']}"
        for n, v in found["lookups"].items()
        if v["got"] != v["want"]
    ]
    sites = found["sites"]
    want_trl = found["lookups"].get("trl", {}).get("want", [None, None])[1]
    if sites["trl.__version__"] != want_trl:
        wrong.append(f"trl.__version__ is {sites['trl.__version__']!r}, not {want_trl!r}")
    wrong += [f"{k} is {v}" for k, v in sites.items() if v is False]
    wrong += [
        f"{site}: pkg_resources never asks the alias" for site in found.get("closure", []) if "[pkg_resources]" in site
    ]
    return wrong
