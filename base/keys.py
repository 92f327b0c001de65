"""What a stage reads, derived rather than listed: the code it runs, the files it reads, the environment.

- **Code and data**: from a stage's entry modules, the import closure over this repository's packages
  (every ``import`` and ``from ... import`` in a module, at any depth of its body: an import inside a
  function runs too). Each package reached counts whole: every file under its folder, not only ``*.py``
  (policy, schemas, patches, ``.pth``, templates), so a data file a stage opens is in its key without being
  named. ``pyproject.toml``'s ``[tool.importlinter] root_packages`` names the packages (lint's graph too).
- **Environment**: ``ENVIRONMENT`` is the one allowlist of variables that reach compilers, CMake and
  interpreters, each with the stages it reaches; their values go into the key and the record.
- **Toolchain**: the compiler's and CMake's own ``--version`` output, for the kernel's stamp.

Stdlib only: nox imports this before any venv exists.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import json
import os
import shutil
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import tomllib

from . import paths

SKIP_PARTS = frozenset({"__pycache__", ".mypy_cache", ".pytest_cache", ".ruff_cache"})

# The stages, by kind: "kernel" (build_wheel.py's stamp), "assemble" (and its wheel memo), "audit", "verify".
KINDS = ("kernel", "assemble", "audit", "verify")
_PYTHON_STAGES = ("kernel", "assemble", "audit", "verify")

# The one allowlist: each variable that reaches a compiler, CMake or an interpreter a stage runs, with the
# stages it reaches. Its value (or its absence) is an ingredient of exactly those stages' keys.
ENVIRONMENT: Mapping[str, tuple[str, ...]] = {
    # compilers and CMake (the kernel build)
    "CC": ("kernel",),
    "CXX": ("kernel",),
    "CUDAHOSTCXX": ("kernel",),
    "CFLAGS": ("kernel",),
    "CXXFLAGS": ("kernel",),
    "CPPFLAGS": ("kernel",),
    "LDFLAGS": ("kernel",),
    "NVCC_PREPEND_FLAGS": ("kernel",),
    "NVCC_APPEND_FLAGS": ("kernel",),
    "CMAKE_ARGS": ("kernel",),
    "CMAKE_GENERATOR": ("kernel",),
    "CMAKE_BUILD_TYPE": ("kernel",),
    "CUDA_HOME": ("kernel",),
    "CUDA_PATH": ("kernel",),
    "KT_CUDA_ARCHS": ("kernel",),
    # the cuobjdump that describes the CUDA payload (assembly) and judges it (audit): the locked one unless
    # this names another
    "KT_CUOBJDUMP": ("assemble", "audit"),
    # the release's timestamp: wheel dates in the kernel and in every carrier
    "SOURCE_DATE_EPOCH": ("kernel", "assemble"),
    # what the kernel picks at run time (the variant the verification exercises)
    "KT_KERNEL_CPU_VARIANT": ("verify",),
    # the interpreters every stage runs, and the libraries its processes load
    "PYTHONPATH": _PYTHON_STAGES,
    "PYTHONHOME": _PYTHON_STAGES,
    "PYTHONSAFEPATH": _PYTHON_STAGES,
    "LD_PRELOAD": _PYTHON_STAGES,
    "LD_LIBRARY_PATH": _PYTHON_STAGES,
}


def value_sha256(value: object) -> str:
    """The sha256 of a JSON-able value (keys sorted): a key's ingredient that is not a file."""
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()


def file_sha256(path: Path) -> str:
    """The hex sha256 of a file (hashlib reads it in chunks)."""
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def tree_files(*roots: Path, suffixes: Sequence[str] = ()) -> list[Path]:
    """Every file under `roots` (a root may be one file), caches and bytecode left out; only
    `suffixes`, when given. Sorted, so that a digest over them is stable."""
    found = {
        f
        for root in roots
        for f in ([root] if root.is_file() else root.rglob("*"))
        if f.is_file()
        and not SKIP_PARTS & set(f.parts)
        and not f.name.endswith(".pyc")
        and (not suffixes or f.name.endswith(tuple(suffixes)))
    }
    return sorted(found)


@functools.cache
def root_packages(root: Path | None = None) -> tuple[str, ...]:
    """This repository's top-level packages (pyproject.toml, [tool.importlinter] root_packages)."""
    root = root or paths.ROOT
    data = tomllib.loads((root / "pyproject.toml").read_text())
    return tuple(data["tool"]["importlinter"]["root_packages"])


def _module_file(name: str, root: Path) -> Path | None:
    """The file of module `name` under `root` (a package's __init__.py), or None."""
    base = root.joinpath(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _imports(path: Path, module: str) -> frozenset[str]:
    """Every module `module` (at `path`) imports, by absolute name, anywhere in its body."""
    st = path.stat()
    return _parsed(path, module, st.st_mtime_ns, st.st_size, st.st_ino)


@functools.lru_cache(maxsize=4096)
def _parsed(path: Path, module: str, mtime_ns: int, size: int, ino: int) -> frozenset[str]:
    """_imports, parsed once per version of the file (its stat: an edit is parsed anew)."""
    tree = ast.parse(path.read_bytes(), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1])
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module or ""
            found.add(target)
            found.update(f"{target}.{a.name}" for a in node.names)  # `from pkg import module`
    return frozenset(found)


def import_closure(entries: Iterable[str], root: Path | None = None) -> list[str]:
    """The repository's modules `entries` run: the entries, what they import, transitively (each
    module's parent packages too: importing a.b runs a/__init__.py). Third-party and stdlib left out."""
    root = root or paths.ROOT
    ours = set(root_packages(root))
    seen: set[str] = set()
    todo = list(entries)
    while todo:
        name = todo.pop()
        if name in seen or name.split(".")[0] not in ours:
            continue
        path = _module_file(name, root)
        if path is None:
            continue  # `from pkg import function`: the name is not a module
        seen.add(name)
        parts = name.split(".")
        todo.extend(".".join(parts[:i]) for i in range(1, len(parts)))
        todo.extend(_imports(path, name))
    return sorted(seen)


def packages_read(entries: Iterable[str], root: Path | None = None) -> list[str]:
    """The top-level packages a stage's entries reach: each is read whole (its code and its data files)."""
    return sorted({m.split(".")[0] for m in import_closure(entries, root)})


def environment(kind: str) -> dict[str, str | None]:
    """The allowlisted variables that reach stages of `kind`, with their values (None: unset)."""
    if kind not in KINDS:
        raise ValueError(f"unknown stage kind {kind!r} (one of {', '.join(KINDS)})")
    return {name: os.environ.get(name) for name, kinds in ENVIRONMENT.items() if kind in kinds}


def _version_of(argv: Sequence[str]) -> str:
    """The tool's own version text (not its path: each nox venv has its own copy of cmake)."""
    exe = shutil.which(argv[0])
    if exe is None:
        return "not found"
    try:
        got = subprocess.run([exe, *argv[1:]], capture_output=True, text=True, check=False, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"failed: {type(exc).__name__}"
    return (got.stdout or got.stderr).strip()


# Launchers that run the compiler named after them (CC="ccache gcc"): the key asks the compiler itself.
LAUNCHERS = frozenset({"ccache", "sccache", "distcc", "icecc", "buildcache", "env"})


def compiler(value: str) -> str:
    """The real compiler a CC/CXX value runs, past any launcher and VAR=value words (`ccache gcc-12` -> gcc-12)."""
    import shlex

    try:
        words = shlex.split(value)
    except ValueError:
        words = value.split()
    for word in words:
        if Path(word).name in LAUNCHERS or ("=" in word and not word.startswith(("/", "."))):
            continue
        return word
    return words[0] if words else value


@functools.cache
def toolchain(nvcc: str = "") -> dict[str, str]:
    """The C and C++ compilers' and CMake's own `--version` output (the ones CC and CXX name behind any
    launcher, else cc and c++), and nvcc's where a CUDA build names it: a compiler upgraded in place, or
    another toolkit behind the same CUDA_HOME, changes the kernel's key."""
    found = {
        "cc": _version_of([compiler(os.environ.get("CC") or "cc"), "--version"]),
        "cxx": _version_of([compiler(os.environ.get("CXX") or "c++"), "--version"]),
        "cmake": _version_of(["cmake", "--version"]),
    }
    if nvcc:
        found["nvcc"] = _version_of([nvcc, "--version"])
    return found


class Digests:
    """File digests memoized for one process (a no-op release hashes each file once)."""

    def __init__(self) -> None:
        self._files: dict[Path, str] = {}

    def file(self, path: Path) -> str:
        if path not in self._files:
            self._files[path] = file_sha256(path)
        return self._files[path]

    def forget(self, path: Path) -> None:
        self._files.pop(path, None)

    def files(self, files: Iterable[Path], root: Path | None = None) -> str:
        """One digest over these files' paths (relative to `root`) and contents, in sorted order."""
        root = root or paths.ROOT
        h = hashlib.sha256()
        for f in sorted(set(files)):
            rel = f.relative_to(root) if f.is_relative_to(root) else f
            h.update(f"{rel}\0{self.file(f)}\n".encode())
        return h.hexdigest()

    def tree(self, *roots: Path, root: Path | None = None, suffixes: Sequence[str] = ()) -> str:
        return self.files(tree_files(*roots, suffixes=suffixes), root)
