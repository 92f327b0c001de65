"""The carrier set agrees with itself: exact cross-pins (compared as versions,
never substrings), rewritten bounds that admit the forks, one torch, and no
upstream project the forks replace."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from .graph import Graph
from .model import CarrierSet


@dataclass(frozen=True)
class Report:
    """The carrier set's consistency problems, its torch intersection and payload closure roots."""

    problems: tuple[str, ...]
    torch: str  # the intersection of every carrier's torch specifiers
    torch_candidates: tuple[str, ...]
    # install roots ("sglang-kt", "ktransformers[serve]") that can import the payload's package
    payload_roots: tuple[str, ...] = ()


def payload_closure(cs: CarrierSet, requires: Mapping[str, list[str]]) -> tuple[list[str], list[str]]:
    """(problems, roots that reach the provider): every install that can import the payload's
    package (it pulls the provider) must pull every part carrier too."""
    provider = cs.payload_provider
    if provider is None:
        return [], []
    parts = {c.name for c in cs.part_carriers}
    roots = [c.name for c in cs.carriers] + [f"{c.name}[{e}]" for c in cs.carriers for e, _ in c.extras]
    graph = Graph(requires)
    problems, reaching = [], []
    for root in roots:
        got = graph.reach(root)
        if provider.name not in got:
            continue
        reaching.append(root)
        missing = sorted(parts - got)
        if missing:
            problems.append(
                f"installing {root} pulls {provider.name} (it can import the CUDA payload) but not the "
                f"part carrier(s) {missing}; make {provider.name} require them exactly"
            )
    return problems, reaching


def check(cs: CarrierSet, metadata: Mapping[str, tuple[str, list[str]]]) -> Report:
    """metadata: carrier -> (version, Requires-Dist lines) as read back from the built wheels."""
    problems: list[str] = []
    versions = {n: Version(v) for n, (v, _) in metadata.items()}
    carriers = {c.name: c for c in cs.carriers}
    torch_specs: list[tuple[str, SpecifierSet]] = []
    replaced = cs.by_upstream()
    for name, (_, requires) in sorted(metadata.items()):
        kind = carriers[name].kind if name in carriers else "?"
        for line in requires:
            req = Requirement(line)
            dep = canonicalize_name(req.name)
            where = f"{name}: Requires-Dist {line!r}"
            if dep in replaced:
                problems.append(f"{where} still names upstream {dep}; rewrite it to {replaced[dep]}")
            if dep == "torch" and req.specifier:
                torch_specs.append((name, req.specifier))
            if dep not in versions:
                continue
            sibling = versions[dep]
            pins = [s for s in req.specifier if s.operator in ("==", "===")]
            if kind == "umbrella" or pins:
                # Exact pins compare as versions: 5.6.0.post2 never equals 5.6.0.post20.
                try:
                    exact = len(pins) == 1 and len(req.specifier) == 1 and Version(pins[0].version) == sibling
                except InvalidVersion:
                    exact = False
                if not exact:
                    problems.append(f"{where} must pin {dep}=={sibling} exactly (the version {dep} is built at)")
            elif not req.specifier.contains(sibling, prereleases=True):
                problems.append(
                    f"{where}: the bound no longer admits {dep} {sibling}; the repack would be "
                    "uninstallable beside its sibling"
                )
    combined = SpecifierSet(",".join(str(s) for _, s in torch_specs))
    candidates = sorted(
        {
            Version(sp.version.replace(".*", ""))
            for _, s in torch_specs
            for sp in s
            if sp.operator in ("==", ">=", "~=", "===")
        }
    )
    ok = tuple(str(v) for v in candidates if combined.contains(v, prereleases=True))
    if torch_specs and not ok:
        owners = "; ".join(f"{n}: torch{s}" for n, s in torch_specs)
        problems.append(f"the carriers' torch requirements have no common version ({owners})")
    closure_problems, roots = payload_closure(cs, {n: r for n, (_, r) in metadata.items()})
    problems += closure_problems
    return Report(tuple(problems), str(combined) or "(unconstrained)", ok, tuple(roots))


def torch_summary(spec: str, candidates: list[str] | None = None) -> str:
    """The torch requirement every carrier allows, simplified: an exact pin that satisfies the
    whole intersection stands for it ("==2.14.1" rather than "==2.14.1,>=1.10.0,>=2.4,...")."""
    from packaging.specifiers import InvalidSpecifier, SpecifierSet

    try:
        specs = SpecifierSet(spec)
    except InvalidSpecifier:
        return spec
    pins = [s.version for s in specs if s.operator == "=="]
    if len(pins) == 1 and specs.contains(pins[0], prereleases=True):
        return f"=={pins[0]}"
    return str(specs) or "any"
