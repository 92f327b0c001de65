"""Python source reader: where a module looks a distribution up by a literal name.

``importlib.metadata.version("transformers")``, ``metadata``/``distribution``/``requires``/
``files``, ``pkg_resources.get_distribution``/``require``, transformers' ``require_version`` and
LlamaFactory's ``check_version`` ("peft>=0.5": the name is the requirement's), and the
``is_package_available`` / ``get_package_version``-style helpers projects wrap around them.
A byte pattern picks the files worth parsing; ``ast`` then finds the calls (comments and strings
that merely mention such a call are not calls). A module over 64 KiB is parsed one top-level statement
at a time, and only the statements that import or match the pattern: an AST costs about 100 times its
source, and a 400 KiB test module parsed whole took 39 MiB (a statement that does not parse on its own is
skipped, as a module that does not parse is).
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
WHOLE_BYTES = 64 << 10  # up to this a module is parsed whole (about 6 MiB of tree); beyond, one statement at a time


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


_CONTINUES = frozenset({"else", "elif", "except", "finally"})  # a clause of the statement before it


def _statements(data: bytes) -> list[tuple[int, int]] | None:
    """(first line, last line) of each top-level statement, a decorated definition and an if/try with its
    clauses whole (tokenize: no tree is built); None where the source does not tokenize."""
    import io
    import tokenize

    spans: list[list[int]] = []
    depth, new_line, decorated = 0, True, False
    try:
        for tok in tokenize.tokenize(io.BytesIO(data).readline):
            if tok.type in (tokenize.ENCODING, tokenize.NL, tokenize.COMMENT, tokenize.ENDMARKER):
                continue
            if tok.type == tokenize.INDENT:
                depth += 1
                continue
            if tok.type == tokenize.DEDENT:
                depth -= 1
                new_line = True
                continue
            if tok.type == tokenize.NEWLINE:
                new_line = True
                if spans:
                    spans[-1][1] = tok.start[0]
                continue
            if new_line and depth == 0:
                line = tok.start[0]
                if spans and (decorated or (tok.type == tokenize.NAME and tok.string in _CONTINUES)):
                    spans[-1][1] = line  # joins the statement before it
                else:
                    spans.append([line, line])
                decorated = tok.type == tokenize.OP and tok.string == "@"
            new_line = False
            if spans:
                spans[-1][1] = max(spans[-1][1], tok.end[0])
    except (tokenize.TokenError, SyntaxError, ValueError):
        return None
    return [(a, b) for a, b in spans]


def _parsed(member: str, lines: list[bytes], span: tuple[int, int]) -> ast.Module | None:
    """One top-level statement parsed, its line numbers those of the file."""
    first, last = span
    try:
        tree = ast.parse(b"".join(lines[first - 1 : last]), member)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    return ast.increment_lineno(tree, first - 1)


def _lookup_alias(origin: tuple[str, str]) -> bool:
    """Whether a local name imported from `origin` (module, name there) can be, or lead to, a lookup call."""
    module, name = origin
    api_module = module.split(".")[-1] in ("metadata", "importlib_metadata", "pkg_resources")
    if not name:  # `import importlib.metadata as md`: md.version(...)
        return api_module
    return (api_module and (name in METADATA_CALLS or name in PKG_RESOURCES_CALLS)) or bool(HELPER.match(name))


def find_lookups(member: str, data: bytes) -> tuple[Lookup, ...]:
    """Every lookup by a literal distribution name in one Python source file."""
    if len(data) > MAX_SOURCE_BYTES or not _PREFILTER.search(data):
        return ()
    # a small module is parsed whole (its tree is small); a large one statement by statement
    spans = [(1, data.count(b"\n") + 1)] if len(data) <= WHOLE_BYTES else _statements(data)
    if spans is None:
        return ()
    lines = data.splitlines(keepends=True)
    texts = [b"".join(lines[a - 1 : b]) for a, b in spans]
    origin: dict[str, tuple[str, str]] = {}
    for span, text in zip(spans, texts, strict=True):
        if re.search(rb"\bimport\b", text) and (tree := _parsed(member, lines, span)) is not None:
            origin.update(_imported_from(tree))
    # a statement is parsed for calls when it holds a lookup's name, or a local name bound to a lookup API
    aliases = [
        re.escape(name.encode()) for name in origin if re.fullmatch(r"\w+", name) and _lookup_alias(origin[name])
    ]
    local = re.compile(rb"\b(" + rb"|".join(aliases) + rb")\s*[.(]") if aliases else None
    wanted = [s for s, t in zip(spans, texts, strict=True) if _PREFILTER.search(t) or (local and local.search(t))]
    out = []
    for node in (n for span in wanted if (t := _parsed(member, lines, span)) for n in ast.walk(t)):
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
