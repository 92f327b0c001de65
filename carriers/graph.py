"""The carriers' requirement graph: the one answer to "installing X pulls Y".

Carriers never go to the resolver by name: kt-kernel, ktransformers and sglang-kt also exist on
PyPI, and a resolver would happily mix their releases with ours. So the release walks the carriers'
own Requires-Dist (from their wheels, or from the assembly's metadata before the wheels exist) and
hands the resolver only the third-party requirements they declare.

One rule for every question asked of the graph: a requirement whose marker names `extra` applies
when the marker holds for one of the extras selected for the requiring carrier (none selected:
`extra` is ""); any other marker is left to the installer on the target, so the requirement
applies. A carrier reached again with extras it already had is not walked again. The audit keeps
its own copy of the walk (it never imports what it checks); a contract test pins the two together.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename

from . import wheelio
from .errors import ConsistencyError, InputError


@dataclass(frozen=True)
class Walk:
    """What installing one root pulls in: every carrier with the extras selected for it, and the
    third-party requirement lines they declare (the `extra` part of a marker dropped: it selected
    them; other markers kept for the installer)."""

    reached: Mapping[str, frozenset[str]]
    third_party: tuple[str, ...]

    @property
    def carriers(self) -> list[str]:
        return sorted(self.reached)


def _applies(dep: Requirement, extras: frozenset[str]) -> bool:
    """A marker that names `extra` decides by the selected extras; any other marker (python_version,
    sys_platform) is the installer's to evaluate on the target, so the line applies here."""
    if dep.marker is None or "extra" not in str(dep.marker):
        return True
    return any(dep.marker.evaluate({"extra": e}) for e in (extras or {""}))


class Graph:
    """Carrier name -> its Requires-Dist lines."""

    def __init__(self, requires: Mapping[str, Sequence[str]]) -> None:
        self.requires = {str(canonicalize_name(n)): list(lines) for n, lines in requires.items()}

    @classmethod
    def of_dist(cls, dist: Path) -> Graph:
        """The graph of the wheels in `dist` (each distribution's last wheel by name: the per-Python
        wheels of one carrier declare the same requirements)."""
        requires: dict[str, list[str]] = {}
        for wheel in sorted(dist.glob("*.whl")):
            requires[str(parse_wheel_filename(wheel.name)[0])] = wheelio.read_metadata(wheel)[1]
        if not requires:
            raise InputError(f"no wheels in {dist}; build them first (nox -s build_all)")
        return cls(requires)

    def __contains__(self, name: str) -> bool:
        return str(canonicalize_name(name)) in self.requires

    def walk(self, root: str) -> Walk:
        """Everything installing `root` ("name" or "name[extra,...]") pulls in; ConsistencyError if
        `root` is not a carrier."""
        first = Requirement(root)
        if first.name not in self:
            raise ConsistencyError(f"{root}: {canonicalize_name(first.name)} is not a carrier of this release")
        todo = [first]
        seen: dict[str, frozenset[str]] = {}
        third: set[str] = set()
        while todo:
            req = todo.pop()
            name = str(canonicalize_name(req.name))
            extras = frozenset(req.extras)
            if name in seen and extras <= seen[name]:
                continue
            seen[name] = seen.get(name, frozenset()) | extras
            for line in self.requires[name]:
                dep = Requirement(line)
                if not _applies(dep, extras):
                    continue
                if dep.name in self:
                    todo.append(dep)
                    continue
                if dep.marker is not None and "extra" in str(dep.marker):
                    dep.marker = None  # the extra already selected it
                third.add(str(dep))
        return Walk(seen, tuple(sorted(third)))

    def replaced_first(self, after: str, before: str, version: str) -> bool:
        """Whether installing `after` makes pip replace `before` with `version` first: a chain of requirements
        that apply without an extra leads from `after` to one on `before` that `version` satisfies (pip installs
        dependencies first, then uninstalls the old version of what it replaced: pypa/pip#8509)."""
        from packaging.version import InvalidVersion, Version

        target = str(canonicalize_name(before))
        try:
            wanted = Version(version)
        except InvalidVersion:
            return False
        seen, todo = {str(canonicalize_name(after))}, [str(canonicalize_name(after))]
        while todo:
            for line in self.requires.get(todo.pop(), []):
                dep = Requirement(line)
                if not _applies(dep, frozenset()):
                    continue
                name = str(canonicalize_name(dep.name))
                if name == target and dep.specifier.contains(wanted, prereleases=True):
                    return True
                if name != target and name in self and name not in seen:
                    seen.add(name)
                    todo.append(name)
        return False

    def reach(self, root: str) -> set[str]:
        """The carriers installing `root` pulls in (none if `root` is not a carrier)."""
        return set(self.walk(root).reached) if Requirement(root).name in self else set()

    def upload_order(self) -> list[str]:
        """Every carrier after each carrier it requires under any extra. A cycle (sglang-kt requires
        sglang-kernel-kt, which requires every payload part carrier, sglang-kt among them) is one group,
        after everything the group requires; names sort among equals, so the order is deterministic."""
        import graphlib

        import networkx as nx

        g: nx.DiGraph[str] = nx.DiGraph()
        g.add_nodes_from(self.requires)
        for name, lines in self.requires.items():
            g.add_edges_from(
                (name, d) for d in {str(canonicalize_name(Requirement(r).name)) for r in lines} if d in self
            )
        g.remove_edges_from(nx.selfloop_edges(g))
        groups = {n: min(c) for c in nx.strongly_connected_components(g) for n in c}  # a group is named by its least
        condensed: dict[str, set[str]] = {groups[n]: set() for n in g}
        for a, b in g.edges:
            if groups[a] != groups[b]:
                condensed[groups[a]].add(groups[b])
        sorter = graphlib.TopologicalSorter(condensed)
        order: list[str] = []
        sorter.prepare()
        while sorter.is_active():
            ready = sorted(sorter.get_ready())
            for group in ready:
                order += sorted(n for n in g if groups[n] == group)
            sorter.done(*ready)
        return order


def closure(dist: Path, root: str) -> tuple[list[str], list[str]]:
    """(carriers reached, third-party requirement lines) from `root`, e.g. "ktransformers[sft]", over
    the wheels in `dist`."""
    walk = Graph.of_dist(dist).walk(root)
    return walk.carriers, list(walk.third_party)
