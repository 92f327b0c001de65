"""Install profiles: the third-party closure of a carrier with extras.

Carriers never go to the resolver by name: kt-kernel, ktransformers and sglang-kt
also exist on PyPI, and a resolver would happily mix their releases with ours.
Instead this walks the carriers' own metadata (from dist/) and hands the resolver
only the third-party requirements they declare.
"""

from __future__ import annotations

from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename

from carriers import wheelio


def carrier_metadata(dist: Path) -> dict[str, list[str]]:
    """carrier name -> Requires-Dist lines, for every wheel in dist/."""
    out: dict[str, list[str]] = {}
    for wheel in sorted(dist.glob("*.whl")):
        out[canonicalize_name(parse_wheel_filename(wheel.name)[0])] = wheelio.read_metadata(wheel)[1]
    return out


def closure(dist: Path, root: str) -> tuple[list[str], list[str]]:
    """(carriers reached, third-party requirement lines) from `root`, e.g. "ktransformers[sft]"."""
    meta = carrier_metadata(dist)
    if not meta:
        raise FileNotFoundError(f"no wheels in {dist}; build them first (nox -s build_all)")
    todo = [Requirement(root)]
    seen: dict[str, set[str]] = {}
    third: list[str] = []
    while todo:
        req = todo.pop()
        name = canonicalize_name(req.name)
        if name not in meta:
            raise KeyError(f"{root}: {name} is not a carrier in {dist}")
        extras = set(req.extras)
        if name in seen and extras <= seen[name]:
            continue
        seen.setdefault(name, set()).update(extras)
        for line in meta[name]:
            dep = Requirement(line)
            marker_ok = dep.marker is None or any(dep.marker.evaluate({"extra": e}) for e in (extras or {""}))
            if dep.marker is not None and "extra" in str(dep.marker) and not marker_ok:
                continue
            if canonicalize_name(dep.name) in meta:
                todo.append(dep)
            else:
                plain = Requirement(line)
                if plain.marker is not None and "extra" in str(plain.marker):
                    plain.marker = None  # the extra already selected it
                third.append(str(plain))
    return sorted(seen), sorted(set(third))
