"""Lookups by distribution name across the release: code that asks for ``version("peft")`` where
the release installs PEFT as ``peft-kt`` (issue: trl's ``__version__ == "unknown"``, accelerate's
"is peft available" False).

Pure: facts in, findings out. What is renamed comes from the wheels themselves: each fork and
repack records its upstream in ``<dist-info>/kt_upstream.json``; the alias that answers such
lookups (``carriers/alias``) is recognised by its two top-level files.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from packaging.utils import canonicalize_name

from ..model import Finding
from ..readers._json import KT_UPSTREAM, load
from ..readers._python import Lookup
from ._common import finding

UPSTREAM_FILE = "kt_upstream.json"
ALIAS_FILES = ("_kt_dist_alias.py", "_kt_dist_alias.pth")


@dataclass(frozen=True)
class DistNames:
    """What one wheel says about distribution names: its lookups, its upstream, whether it ships the alias."""

    wheel: str
    dist: str
    lookups: tuple[Lookup, ...]
    upstream: str | None  # kt_upstream.json's text, None when the wheel has none
    ships_alias: bool


def _renamed(wheels: Sequence[DistNames]) -> tuple[dict[str, tuple[str, str]], list[Finding]]:
    """upstream name -> (carrier, upstream version), from the wheels' kt_upstream.json; and the
    findings of a renamed wheel (`*-kt`) of a KT release whose record is missing or unreadable."""
    out: dict[str, tuple[str, str]] = {}
    bad = []
    # Only a KT release (some wheel records an upstream or ships the alias) is held to its naming:
    # anyone else's wheel may end in -kt without being a renamed fork.
    release = any(w.upstream is not None or w.ships_alias for w in wheels)
    for w in wheels:
        if w.upstream is None:
            if release and w.dist.endswith("-kt"):
                bad.append(
                    finding(
                        "dist.upstream-record",
                        w.wheel,
                        "",
                        f"{w.dist} looks renamed but has no .dist-info/{UPSTREAM_FILE}: lookups by its upstream "
                        "name cannot be answered",
                        "assemble it with the release's carriers (carriers/transform.py writes the record)",
                    )
                )
            continue
        up, problem = load(w.upstream, KT_UPSTREAM)
        if problem:
            bad.append(
                finding(
                    "dist.upstream-record",
                    w.wheel,
                    UPSTREAM_FILE,
                    f"{UPSTREAM_FILE}: {problem}",
                    "assemble it with the release's carriers",
                )
            )
            continue
        out[canonicalize_name(up["name"])] = (w.dist, up["version"])
    return out, bad


def name_lookups(wheels: Sequence[DistNames]) -> list[Finding]:
    """One finding per lookup of a renamed upstream (file and line): info when the alias answers it,
    an error when nothing does (pkg_resources, or no wheel ships the alias)."""
    renamed, out = _renamed(wheels)
    hosts = sorted(w.dist for w in wheels if w.ships_alias)
    for w in wheels:
        for lk in w.lookups:
            hit = renamed.get(canonicalize_name(lk.name))
            if hit is None:
                continue
            carrier, version = hit
            where = f"{lk.member}:{lk.line}"
            said = f"{lk.call}({lk.name!r}) looks up {lk.name}, which this release installs as {carrier}"
            if lk.api == "pkg_resources":
                out.append(
                    finding(
                        "dist.name-lookup",
                        w.wheel,
                        where,
                        f"{said}; pkg_resources reads its own working set and never asks the alias finder",
                        f"patch the site to use importlib.metadata (carriers/patches/{w.dist}/)",
                    )
                )
            elif hosts:
                out.append(
                    finding(
                        "dist.name-lookup",
                        w.wheel,
                        where,
                        f"{said}; answered as {lk.name} {version} by the alias {hosts[0]} ships (carriers/alias)",
                        "nothing to do",
                        severity="info",
                    )
                )
            else:
                out.append(
                    finding(
                        "dist.name-lookup",
                        w.wheel,
                        where,
                        f"{said}; no wheel of the release ships the alias, so the lookup finds nothing",
                        "set dist_alias = true on the fork every KT environment holds (carriers/carriers.toml)",
                    )
                )
    return out
