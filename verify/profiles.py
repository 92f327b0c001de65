"""The install profiles verify_install installs, each a root requirement: the `#:carriers` line of
lockfiles/<profile>.in (its one owner), read when asked, not at import."""

from __future__ import annotations

import functools
from pathlib import Path

from base.paths import LOCKFILES
from carriers import load as load_carriers
from carriers.graph import closure
from locks.read import directive

from .venv import VerifyError


@functools.cache
def root(profile: str) -> str:
    """The profile's one root requirement (`ktransformers[sft]`)."""
    roots = directive(LOCKFILES / f"{profile}.in", "carriers")
    if len(roots) != 1:
        raise VerifyError(f"lockfiles/{profile}.in must name exactly one `#:carriers` root, not {roots}")
    return roots[0]


def core(dist: Path) -> list[str]:
    """The sft-cpu closure without its dependency-only repacks (kind "repack" in carriers.toml):
    sft-cpu installs it first and checks that adding the repacks (peft-kt, trl-kt) leaves its files
    untouched."""
    reached, _ = closure(dist, root("sft-cpu"))
    repacks = {c.name for c in load_carriers().carriers if c.kind == "repack"}
    return [n for n in reached if n not in repacks]
