"""Python source reader: where a module looks a distribution up by a literal name.

``importlib.metadata.version("transformers")``, ``metadata``/``distribution``/``requires``/
``files``, ``pkg_resources.get_distribution``/``require``, transformers' ``require_version`` and
LlamaFactory's ``check_version`` ("peft>=0.5": the name is the requirement's), and the
``is_package_available`` / ``get_package_version``-style helpers projects wrap around them.
A byte pattern picks the files worth parsing; ``ast`` then finds the calls (comments and strings
that merely mention such a call are not calls).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

# Calls whose first argument names a distribution (or a requirement on one).
METADATA_CALLS = frozenset({"version", "metadata", "distribution", "requires", "files"})
PKG_RESOURCES_CALLS = frozenset({"get_distribution", "require"})
HELPER = re.compile(
    r"^(require_version(_core)?|_?check_version|_?is_package_available|_?get_package_version|_?get_version)$"
)
_PREFILTER = re.compile(
    rb"(version|metadata|distribution|requires|files|get_distribution|require|package_available)"
    rb"\(\s*[\"']"
)
_NAME = re.compile(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)")
MAX_SOURCE_BYTES = 4 << 20  # larger .py members (generated tables) are not parsed


@dataclass(frozen=True)
class Lookup:
    """One call that looks a distribution up by a literal name."""

    member: str
    line: int
    call: str  # the called name as written: "importlib.metadata.version", "require_version"
    api: str  # "importlib.metadata", "pkg_resources" or "helper"
    name: str  # the distribution name in the argument (a requirement's name for require_version)


def _dotted(node: ast.expr) -> str:
    """`a.b.c` for a chain of attributes on a name, "" for anything else (iterative: a chain can be long)."""
    attrs: list[str] = []
    while isinstance(node, ast.Attribute):
        attrs.append(node.attr)
        node = node.value
    return ".".join([node.id, *reversed(attrs)]) if isinstance(node, ast.Name) else ""


def _imported_from(tree: ast.Module) -> dict[str, tuple[str, str]]:
    """Local name -> (module, name there): `from importlib.metadata import version as v`."""
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                out[alias.asname or alias.name] = (node.module, alias.name)
        elif isinstance(node, ast.Import):  # `import importlib.metadata as md`: md.version(...)
            for alias in node.names:
                if alias.asname:
                    out[alias.asname] = (alias.name, "")
    return out


def _api(call: str, origin: dict[str, tuple[str, str]]) -> str | None:
    """Which lookup API a called name is, or None when it is no lookup."""
    head, _, last = call.rpartition(".")
    source = head
    if not head and call in origin:
        source, last = origin[call]
    elif head in origin and not origin[head][1]:
        source = origin[head][0]
    if last in METADATA_CALLS and source.split(".")[-1] in ("metadata", "importlib_metadata"):
        return "importlib.metadata"
    if last in PKG_RESOURCES_CALLS and source.split(".")[-1] == "pkg_resources":
        return "pkg_resources"
    if HELPER.match(last):
        return "helper"
    return None


def find_lookups(member: str, data: bytes) -> tuple[Lookup, ...]:
    """Every lookup by a literal distribution name in one Python source file."""
    if len(data) > MAX_SOURCE_BYTES or not _PREFILTER.search(data):
        return ()
    try:
        tree = ast.parse(data, member)
    except (SyntaxError, ValueError):  # not Python 3 (a template, a py2 leftover): nothing to find
        return ()
    except (RecursionError, MemoryError):  # nested past what CPython's parser takes: it cannot import either
        return ()
    origin = _imported_from(tree)
    out = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and node.args):
            continue
        arg = node.args[0]
        if not (isinstance(arg, ast.Constant) and isinstance(arg.value, str)):
            continue
        call = _dotted(node.func)
        api = _api(call, origin) if call else None
        m = _NAME.match(arg.value)
        if api and m:
            out.append(Lookup(member, node.lineno, call, api, m.group(1)))
    return tuple(sorted(out, key=lambda lk: (lk.line, lk.call)))
