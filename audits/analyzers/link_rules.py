"""Link-level truth: what the dynamic loader binds, judged from the dynamic symbol and version tables alone.

- `abi3.limited-api`: an abi3 extension may use only the stable ABI of the oldest Python its tag names (cp311-abi3:
  3.11); the data is abi3info's (the CPython limited API and stable ABI by version, MIT), the same data
  abi3audit judges with.
- `torch.abi-pin`: an ELF that binds torch's C++ symbols (libtorch*/libc10*: namespaces c10, at, torch, caffe2,
  whose ABI changes with every torch release) works only beside the torch it was built against, so its wheel
  must require torch exactly (`==`). PyTorch's stable ABI is C: `aoti_torch_*` and `torch_*` functions
  (torch/csrc/stable, the AOTInductor shim), never mangled; an ELF that binds only those (torchaudio 2.11's
  extensions) may take a range.
- `link.unresolved` / `link.provider-missing` (with providers: `kt-audit --link DIR`): every non-weak undefined
  symbol, with its version, is looked up as ld.so looks it up (`resolve`); one that nothing defines is an error
  naming the symbol demangled, the library its version names and the fix; a needed library found nowhere is one
  finding, never a list of the thousand symbols it would have provided.

How the process is modelled (`resolve`): the object's own scope is itself, then its DT_NEEDED breadth first, each
found inside the wheel (elf_rules.load_chains: RPATH/RUNPATH and $ORIGIN) or by its name among the providers'
libraries, then theirs; that is also how a library already loaded by `import torch` (torch loads
libtorch_global_deps with RTLD_GLOBAL, then its own extension; sgl_kernel's libraries carry no RPATH) is found:
by its soname, the assumption docs/audit.md states. System libraries (the manylinux policy's) are not read: their
symbols are versioned (GLIBC_, GLIBCXX_, CXXABI_, GCC_), which the tag rules judge; the NVIDIA driver's
libcuda.so.1 is never in a wheel, and the driver API symbols (cu*) are taken as its. Symbols the Python
interpreter defines (Py*, _Py*) are the abi3 rule's.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import fnmatch
import functools
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from ..model import Finding
from ..readers import ElfFacts, WheelFacts
from ..readers._dynsym import DynSymbols, read_dynsym
from ._common import finding

# torch's C++ namespaces, as a mangled nested name starts (c10::, at::, torch::, caffe2::)
TORCH_CXX = re.compile(r"^_ZN[rVKRO]*(?:3c10|2at|5torch|6caffe2)")
TORCH_STABLE = re.compile(r"^(?:aoti_torch_|torch_)")  # PyTorch's stable C ABI
DRIVER = "libcuda.so.1"
SHOWN = 5


@functools.cache
def _demangler() -> object | None:
    name = ctypes.util.find_library("stdc++") or "libstdc++.so.6"
    try:
        lib = ctypes.CDLL(name)
        fn = lib.__cxa_demangle
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_void_p
    fn.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_int)]
    return fn


def demangle(name: str) -> str:
    """A C++ symbol as people read it (libstdc++'s own __cxa_demangle); the name as it is where that fails."""
    fn = _demangler()
    if fn is None or not name.startswith("_Z"):
        return name
    status = ctypes.c_int()
    ptr = fn(name.encode(), None, None, ctypes.byref(status))  # type: ignore[operator]
    if status.value != 0 or not ptr:
        return name
    try:
        return ctypes.string_at(ptr).decode("utf-8", "replace")
    finally:
        libc = ctypes.CDLL(None)
        libc.free(ctypes.c_void_p(ptr))


def _shown(names: Sequence[str]) -> str:
    out = "; ".join(demangle(n) for n in names[:SHOWN])
    return out + (f"; and {len(names) - SHOWN} more" if len(names) > SHOWN else "")


# --- abi3 -----------------------------------------------------------------------------------------


@functools.cache
def _stable_abi() -> dict[str, tuple[int, int]]:
    """symbol -> the Python version that added it to the stable ABI (functions and data)."""
    import abi3info  # type: ignore[import-untyped]

    out: dict[str, tuple[int, int]] = {}
    for table in (abi3info.FUNCTIONS, abi3info.DATAS):
        for sym, item in table.items():
            out[sym.linux] = (item.added.major, item.added.minor)
    return out


def _abi3_floor(w: WheelFacts) -> tuple[int, int] | None:
    """The oldest Python an abi3 wheel's tags name (cp311-abi3: 3.11), or None for a wheel that is not abi3."""
    found = [t.interpreter for t in w.tags if t.abi == "abi3" and re.fullmatch(r"cp3\d+", t.interpreter)]
    return min(((3, int(i[3:])) for i in found), default=None)


def abi3(w: WheelFacts, elfs: Iterable[ElfFacts]) -> list[Finding]:
    """Every *.abi3.so of an abi3 wheel uses only the stable ABI, and only what its oldest Python has."""
    floor = _abi3_floor(w)
    if floor is None:
        return []
    table = _stable_abi()
    out = []
    for e in elfs:
        if not e.member.endswith(".abi3.so") or e.link is None:
            continue
        python = sorted({n for n, _, _ in e.link.undefined if n.startswith(("Py", "_Py"))})
        outside = [n for n in python if n not in table]
        late = [f"{n} (3.{table[n][1]})" for n in python if n in table and table[n] > floor]
        if outside:
            out.append(
                finding(
                    "abi3.limited-api",
                    w.filename,
                    e.member,
                    f"uses {len(outside)} symbols outside the stable ABI: {', '.join(outside[:SHOWN])}"
                    + (f" and {len(outside) - SHOWN} more" if len(outside) > SHOWN else "")
                    + f"; an abi3 wheel promises every CPython from 3.{floor[1]} on, and these change between them",
                    "build with Py_LIMITED_API set to the tag's version and replace them (or ship a cp3NN-cp3NN "
                    "wheel per Python)",
                )
            )
        if late:
            out.append(
                finding(
                    "abi3.limited-api",
                    w.filename,
                    e.member,
                    f"uses {', '.join(late[:SHOWN])}, newer than the 3.{floor[1]} its tag names as the oldest Python: "
                    f"CPython 3.{floor[1]} has no such symbol and the import fails there",
                    f"raise the tag to the newest of them (and Py_LIMITED_API with it), or keep to 3.{floor[1]}'s API",
                )
            )
    return out


# --- torch's C++ ABI ------------------------------------------------------------------------------


def _requirement(w: WheelFacts, name: str) -> Requirement | None:
    from .wheel_rules import _headers

    _, msg = _headers(w, "METADATA")
    for line in msg.get_all("Requires-Dist", []) if msg is not None else []:
        try:
            req = Requirement(line)
        except InvalidRequirement:
            continue
        if canonicalize_name(req.name) == name and not (req.marker is not None and "extra" in str(req.marker)):
            return req
    return None


def torch_cxx(
    e: ElfFacts, torch_libs: Sequence[str], where: Mapping[tuple[str, str], str | None] | None = None
) -> list[str]:
    """The torch C++ symbols `e` binds (unversioned, in torch's namespaces) where it needs a torch library from
    outside its wheel (`where`: elf_rules.load_chains; torch's own wheel ships the libraries it binds)."""
    outside = [lib for lib in e.needed if (where or {}).get((e.member, lib)) is None]
    if e.link is None or not any(fnmatch.fnmatch(lib, p) for lib in outside for p in torch_libs):
        return []
    return sorted({n for n, v, _ in e.link.undefined if not v and TORCH_CXX.match(n)})


def torch_pin(
    w: WheelFacts,
    elfs: Iterable[ElfFacts],
    torch_libs: Sequence[str],
    where: Mapping[tuple[str, str], str | None] | None = None,
) -> list[Finding]:
    """A wheel whose ELF files bind torch's C++ ABI from outside it requires torch exactly."""
    users = [(e.member, syms) for e in elfs if (syms := torch_cxx(e, torch_libs, where))]
    if not users:
        return []
    req = _requirement(w, "torch")
    specs = list(req.specifier) if req is not None else []
    if len(specs) == 1 and specs[0].operator in ("==", "===") and "*" not in specs[0].version:
        return []
    member, syms = users[0]
    said = f"requires torch{req.specifier}" if req is not None and specs else "does not require torch"
    if req is not None and not specs:
        said = "requires torch at any version"
    return [
        finding(
            "torch.abi-pin",
            w.filename,
            member,
            f"binds {len(syms)} symbols of torch's C++ ABI ({_shown(syms)})"
            + (f", as {len(users) - 1} more of its ELF files do" if len(users) > 1 else "")
            + f", which changes with every torch release, but the wheel {said}: beside another torch the import "
            "fails with `undefined symbol`",
            "require torch==VERSION, the torch it was built against (or build on PyTorch's stable C ABI, "
            "torch/csrc/stable, which a range may serve)",
        )
    ]


# --- resolution against providers --------------------------------------------------------------------


@dataclass
class Providers:
    """Libraries outside the wheel that an install provides (torch/lib, nvidia/*/lib of an installed environment
    or an unpacked tree), found by file name; each is read (its dynamic tables only) when a load scope first
    reaches it, so a closure of hundreds of libraries costs what the release's ELF files reach."""

    roots: tuple[Path, ...]
    paths: dict[str, Path] = field(default_factory=dict)
    read: dict[str, DynSymbols] = field(default_factory=dict)
    unreadable: list[str] = field(default_factory=list)

    @classmethod
    def scan(cls, roots: Sequence[Path]) -> Providers:
        p = cls(tuple(roots))
        for root in roots:
            for dirpath, dirs, files in os.walk(root):
                dirs[:] = sorted(d for d in dirs if d != "__pycache__")
                for fname in sorted(files):
                    if ".so" in fname and not fname.endswith((".py", ".pyc")):
                        p.paths.setdefault(fname, Path(dirpath) / fname)
        return p

    def version_of(self, dist: str) -> str:
        """The version of a distribution installed under the roots (its .dist-info), or ""."""
        for root in self.roots:
            for di in sorted(root.glob(f"{dist}-*.dist-info")):
                return di.name[len(dist) + 1 : -len(".dist-info")]
        return ""

    def get(self, lib: str) -> DynSymbols | None:
        """The library a DT_NEEDED names, read once; None where no provider holds it (or it is not ELF)."""
        if lib in self.read:
            return self.read[lib]
        path = self.paths.get(lib)
        if path is None:
            return None
        try:
            with path.open("rb") as fh:
                d = read_dynsym(str(path), fh) if fh.read(4) == b"\x7fELF" else None
        except (OSError, ValueError) as exc:
            self.unreadable.append(f"{path}: {exc}")
            d = None
        if d is not None:
            self.read[lib] = d
        return d


SYSTEM_DIRS = ("/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64", "/usr/lib64", "/lib", "/usr/lib")


@functools.cache
def system_names(lib: str) -> frozenset[str] | None:
    """The names a system library defines, read from this host's copy (None where it has none). Names only: a
    reference to a system library is versioned at link time, and its version is what the tag rules judge; an
    unversioned one (dlopen through an old libdl stub) binds by name to whatever glibc the user has."""
    for folder in SYSTEM_DIRS:
        path = Path(folder) / lib
        if path.is_file():
            try:
                with path.open("rb") as fh:
                    d = read_dynsym(str(path), fh)
            except (OSError, ValueError):
                return None
            return d.names | {v.split("@", 1)[0] for v in d.versioned}
    return None


@dataclass
class Resolution:
    """One ELF file's undefined symbols, looked up: how many bound, which did not, which libraries were found
    nowhere, and how many were left to the system libraries or the driver."""

    member: str
    bound: int = 0
    unresolved: list[tuple[str, str, str]] = field(default_factory=list)  # (name, version, the version's file)
    missing: list[str] = field(default_factory=list)
    unreadable: list[str] = field(default_factory=list)  # providers' files found but not read (path: why)
    assumed: int = 0


def resolve(
    obj: DynSymbols,
    inside: Mapping[str, DynSymbols],
    providers: Providers,
    system: frozenset[str],
    driver: frozenset[str] = frozenset({DRIVER}),
) -> Resolution:
    """`obj`'s non-weak undefined symbols looked up in its load scope (the module docstring's model). `inside`:
    the wheel's own ELF files by the name a DT_NEEDED resolves to (load chains)."""
    from ..readers._elf import is_loader

    res = Resolution(obj.member)
    scope: list[DynSymbols] = [obj]
    seen: set[str] = set()
    queue = [(lib, True) for lib in obj.needed]  # (library, needed by this object or a library of the wheel)
    outside: set[str] = set()  # needed libraries whose symbols are not read (system, driver)
    while queue:
        lib, ours = queue.pop(0)
        if lib in seen:
            continue
        seen.add(lib)
        mine = inside.get(lib)
        found = mine or providers.get(lib)
        if found is not None:
            scope.append(found)
            queue.extend((x, mine is not None) for x in found.needed)
        elif lib in system or lib in driver or is_loader(lib):
            outside.add(lib)
        elif ours:  # a provider's own dependency is the provider's to bring (its lock), not this object's finding
            res.missing.append(lib)
            if lib in providers.paths:  # there, but not a readable ELF file: named as such
                res.unreadable.append(next((u for u in providers.unreadable if lib in u), str(providers.paths[lib])))
    for name, version, where in obj.undefined:
        if name.startswith(("Py", "_Py")):
            continue  # the interpreter's (the abi3 rule)
        if any(d.defines(name, version) for d in scope):
            res.bound += 1
        elif where and (where in outside or where in res.missing):
            res.assumed += where in outside  # the tag rules judge system versions; a missing library is its finding
        elif not version and (res.missing or (name.startswith("cu") and outside & driver)):
            res.assumed += 1  # a library found nowhere is its own finding; the driver API is the driver's
        elif not version and any(name in names for lib in outside if (names := system_names(lib)) is not None):
            res.assumed += 1  # an unversioned reference a system library answers by name
        else:
            res.unresolved.append((name, version, where))
    return res


@dataclass(frozen=True)
class Scope:
    """What a set of wheels is resolved against: a name (the install profile and Python, or "given"), the
    providers, and the wheels it applies to (None: every wheel audited)."""

    name: str
    providers: Providers
    wheels: frozenset[str] | None = None

    def applies(self, filename: str) -> bool:
        return self.wheels is None or filename in self.wheels


def unresolved(filename: str, results: Sequence[Resolution], scope: Scope) -> list[Finding]:
    """The findings of `resolve` for one wheel in one scope."""
    out = []
    providers = scope.providers
    roots = f"{scope.name}: " + ", ".join(str(r) for r in providers.roots)
    for r in results:
        if r.unreadable:
            out.append(
                finding(
                    "link.provider-missing",
                    filename,
                    r.member,
                    f"needs a library the providers hold but the audit cannot read: {'; '.join(r.unreadable)}",
                    "reinstall the distribution that provides it (its file is damaged), or report the file",
                )
            )
        if set(r.missing) - {u.rsplit("/", 1)[-1].split(":", 1)[0] for u in r.unreadable}:
            out.append(
                finding(
                    "link.provider-missing",
                    filename,
                    r.member,
                    f"needs {', '.join(r.missing)}, which neither the wheel nor the providers ({roots}) hold",
                    "lock the distribution that provides it in the install profile (torch, nvidia-*), or give the "
                    "folder that holds it to --link",
                )
            )
        if r.unresolved:
            names = [n for n, _, _ in r.unresolved]
            versions = sorted({f"{v} ({w})" for _, v, w in r.unresolved if v})
            torch = providers.version_of("torch")
            there = f" ({scope.name}{f', torch {torch}' if torch else ''})"
            out.append(
                finding(
                    "link.unresolved",
                    filename,
                    r.member,
                    f"{len(names)} undefined symbols bind nowhere in its load scope{there}: {_shown(names)}"
                    + (f"; versions asked: {', '.join(versions[:SHOWN])}" if versions else "")
                    + f" ({r.bound} bound)",
                    "build it against the libraries the release pins (for torch's C++ ABI, the exact torch "
                    "version), or pin the providers it was built against",
                )
            )
    return out
