"""The platform verdict `auditwheel show` gives, for every family auditwheel's policy data knows:
manylinux (glibc), musllinux (musl) and android. Which family and architecture a wheel is judged
for is decided as auditwheel decides it:

- the architecture from the platform tags when they name exactly one, else from the first ELF
  file whose machine auditwheel knows (e_machine, class, byte order; 32-bit ARM must be EABI5
  hard-float to be armv7l); ELF files of another or an unknown machine take no part;
- the C library from the tags when they name exactly one family, else from the first ELF file
  that names one (its interpreter, then a DT_NEEDED libc/loader, then a Python >= 3.11 extension
  suffix: -linux-musl / -linux-gnu), else glibc (auditwheel takes its host's libc; ours is glibc);
- musllinux: the newest musllinux policy only (auditwheel judges against the host's musl, and
  without one, the newest), its `libc.so` read as `libc.musl-<arch>.so.1`;
- android: the policy of the newest API level not above the tag's, named as the tag.

Pure functions of that data and of reader facts."""

from __future__ import annotations

import importlib.util
import json
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from .readers import ElfFacts
from .readers._elf import is_loader

POLICY_FILES = {
    "manylinux": "manylinux-policy.json",
    "musllinux": "musllinux-policy.json",
    "android": "android-policy.json",
}
LIBC = {"manylinux": "glibc", "musllinux": "musl", "android": "Android's libc"}
_LEGACY = {"manylinux1": (2, 5), "manylinux2010": (2, 12), "manylinux2014": (2, 17)}  # PEP 600's aliases

# (e_machine, ELF class, little endian) -> architecture (auditwheel's lddtree._get_platform)
MACHINES = {
    ("EM_386", 32, True): "i686",
    ("EM_X86_64", 64, True): "x86_64",
    ("EM_PPC64", 64, True): "ppc64le",
    ("EM_PPC64", 64, False): "ppc64",
    ("EM_RISCV", 64, True): "riscv64",
    ("EM_AARCH64", 64, True): "aarch64",
    ("EM_S390", 64, False): "s390x",
    ("EM_ARM", 32, True): "armv7l",
    ("EM_LOONGARCH", 64, True): "loongarch64",
}
# platform-tag architecture names auditwheel knows -> the architecture they run (Android's arm64_v8a
# is aarch64; x86_64_v2..v4 are x86-64 with a higher ISA level)
TAG_ARCHS = {
    **{a: a for a in MACHINES.values()},
    "arm64_v8a": "aarch64",
    "x86_64_v2": "x86_64",
    "x86_64_v3": "x86_64",
    "x86_64_v4": "x86_64",
}
# musl's libc soname per architecture (auditwheel's rewrite of the policy's `libc.so`)
MUSL_LIBC = {
    "x86_64": "libc.musl-x86_64.so.1",
    "i686": "libc.musl-x86.so.1",
    "aarch64": "libc.musl-aarch64.so.1",
    "s390x": "libc.musl-s390x.so.1",
    "ppc64le": "libc.musl-ppc64le.so.1",
    "armv7l": "libc.musl-armv7.so.1",
    "riscv64": "libc.musl-riscv64.so.1",
    "loongarch64": "libc.musl-loongarch64.so.1",
}
EF_ARM_EABIMASK, EF_ARM_EABI_VER5, EF_ARM_ABI_FLOAT_HARD = 0xFF000000, 0x05000000, 0x00000400
_LIBPYTHON = re.compile(r"^libpython\d+\.\d+m?\.so(\.\d)*$")
# Platforms outside Linux: their wheels hold Mach-O or PE files, which no auditwheel policy judges.
NON_LINUX = {"macosx": "macOS", "ios": "iOS", "win": "Windows"}


@dataclass(frozen=True)
class Policy:
    """One auditwheel policy for one architecture."""

    name: str  # with the architecture, e.g. manylinux_2_17_x86_64
    priority: int
    symbol_versions: dict[str, frozenset[str]]
    whitelist: frozenset[str]
    blacklist: dict[str, frozenset[str]]

    def admits(self, version: str) -> bool:
        """Whether the policy allows the symbol version, e.g. "GLIBC_2.34"."""
        prefix, _, num = version.partition("_")
        return prefix not in self.symbol_versions or num in self.symbol_versions[prefix]


@dataclass(frozen=True)
class Target:
    """What a wheel is judged for: the libc family, the architecture, and that family's policies."""

    family: str  # manylinux | musllinux | android
    arch: str
    policies: tuple[Policy, ...]  # most portable first, without the plain linux one
    how: str  # how the family was decided, for the report
    assumed: bool = False  # no tag and no ELF file named the C library: glibc by default

    @property
    def linux(self) -> str:
        return f"linux_{self.arch}"


@cache
def forbidden_symbols() -> frozenset[str]:
    """Every symbol some policy of any family forbids a library to use (auditwheel's "blacklist")."""
    return frozenset(
        s for f in POLICY_FILES for p in _data(f) for syms in p.get("blacklist", {}).values() for s in syms
    )


@cache
def _data(family: str) -> tuple[dict[str, Any], ...]:
    """auditwheel's policy data for one family."""
    return tuple(json.loads(policy_file(POLICY_FILES[family]).read_text()))


def policy_file(name: str) -> Path:
    """One of auditwheel's policy JSON files, found without importing auditwheel.policy (whose
    package imports auditwheel's ELF and lddtree modules: 80 ms the audit does not use)."""
    spec = importlib.util.find_spec("auditwheel")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("auditwheel is not installed: the platform verdict reads its policy data")
    return Path(next(iter(spec.submodule_search_locations))) / "policy" / name


def family_of(platform: str) -> str | None:
    """The family a platform tag names: manylinux (the legacy aliases too), musllinux, android,
    a non-Linux platform (macosx, ios, win), or None (linux_*, any)."""
    if glibc_of(platform) is not None:
        return "manylinux"
    for prefix in ("musllinux", "android", *NON_LINUX):
        if platform.startswith(prefix + "_") or platform == prefix:
            return prefix
    return None


def glibc_of(platform: str) -> tuple[int, int] | None:
    """The glibc (major, minor) a manylinux platform tag (or policy name) names, or None for other tags."""
    for legacy, ver in _LEGACY.items():
        if platform.startswith(legacy + "_"):
            return ver
    m = re.match(r"manylinux_(\d+)_(\d+)_", platform)
    return (int(m.group(1)), int(m.group(2))) if m else None


def wheel_glibc(filename: str) -> tuple[int, int] | None:
    """The newest glibc a wheel's filename tags name (its glibc floor), or None for a wheel with no manylinux tag."""
    from packaging.utils import parse_wheel_filename

    return max((g for t in parse_wheel_filename(filename)[3] if (g := glibc_of(t.platform))), default=None)


def tag_archs(platform: str) -> set[str]:
    """The architectures one platform tag names, as auditwheel reads them (x86_64, aarch64, ...)."""
    return {arch for name, arch in TAG_ARCHS.items() if platform.endswith("_" + name)}


def tag_arch(platforms: list[str]) -> str | None:
    """The one architecture the platform tags name (auditwheel's reading), or None when they name
    none it knows, several, or also one it does not."""
    found: set[str] = set()
    for p in platforms:
        if p == "any":
            continue
        hits = tag_archs(p)
        if not hits:
            return None
        found |= hits
    return found.pop() if len(found) == 1 else None


def elf_arch(e: ElfFacts) -> tuple[str | None, str]:
    """(the architecture auditwheel gives the ELF file, or None and why it knows none)."""
    arch = MACHINES.get((e.machine, e.elfclass, e.little_endian))
    endian = "little" if e.little_endian else "big"
    if arch is None:
        return None, f"{e.machine} ELF{e.elfclass} {endian}-endian, an architecture no auditwheel policy knows"
    if arch == "armv7l":
        if e.eflags & EF_ARM_EABIMASK != EF_ARM_EABI_VER5:
            return None, f"32-bit ARM of EABI version {e.eflags >> 24} (armv7l needs EABI5)"
        if not e.eflags & EF_ARM_ABI_FLOAT_HARD:
            return None, "32-bit ARM with the soft-float ABI (armv5l/armv6l code; armv7l needs hard-float)"
    return arch, ""


def elf_libc(e: ElfFacts) -> tuple[str | None, str]:
    """(the family whose C library the ELF file names, how), as auditwheel's lddtree reads it."""
    if e.interp:
        base = e.interp.rsplit("/", 1)[-1]
        return ("musllinux" if base.startswith("ld-musl-") else "manylinux"), f"its interpreter {e.interp}"
    for lib in e.needed:
        if lib.startswith(("libc.musl-", "ld-musl-")):
            return "musllinux", f"DT_NEEDED {lib}"
        if lib == "libc.so.6" or lib.startswith(("ld-linux-", "ld64.so.")):
            return "manylinux", f"DT_NEEDED {lib}"
    name = e.member.rsplit("/", 1)[-1]
    if name.endswith(("-arm-linux-musleabihf.so", "-linux-musl.so")):
        return "musllinux", "its extension suffix"
    if name.endswith(("-arm-linux-gnueabihf.so", "-linux-gnu.so")):
        # Before Python 3.11 musl builds used the -linux-gnu suffix too.
        m = re.search(r"\.cpython-3(\d+)", name)
        if m and int(m.group(1)) >= 11:
            return "manylinux", "its extension suffix"
    return None, ""


def policies(family: str, arch: str, platform: str = "") -> tuple[Policy, ...]:
    """The family's policies for `arch`, most portable first (the plain linux one left out):
    musllinux the newest only, android the one for the tag's API level named as the tag."""
    out = []
    for p in _data(family):
        if p["name"] == "linux" or arch not in p["symbol_versions"]:
            continue
        white = frozenset(p["lib_whitelist"])
        if family == "musllinux" and "libc.so" in white:
            # auditwheel reads the policy's libc.so as musl's soname; musl's loader also answers to
            # libc.so itself (grafted libgcc_s builds need it), so both are the system's.
            white |= {MUSL_LIBC[arch]}
        out.append(
            Policy(
                f"{p['name']}_{arch}",
                p["priority"],
                {k: frozenset(v) for k, v in p["symbol_versions"][arch].items()},
                white,
                {k: frozenset(v) for k, v in p["blacklist"].items()},
            )
        )
    out.sort(key=lambda p: p.priority, reverse=True)
    if family == "musllinux":  # the newest: auditwheel judges against its host's musl, else the newest
        return tuple(out[-1:])
    if family == "android":
        m = re.match(r"android_(\d+)_", platform)
        level = int(m.group(1)) if m else 0
        fits = [p for p in out if int(p.name.split("_")[1]) <= level]
        best = max(fits, key=lambda p: int(p.name.split("_")[1]), default=None)
        return (Policy(platform, best.priority, best.symbol_versions, best.whitelist, best.blacklist),) if best else ()
    return tuple(out)


def host_elfs(elfs: list[ElfFacts]) -> list[ElfFacts]:
    """The ELF files that run on the CPU (GPU code objects ride as data)."""
    return [e for e in elfs if e.machine not in ("EM_CUDA", "EM_AMDGPU")]


def target(platforms: list[str], elfs: list[ElfFacts]) -> tuple[Target | None, str]:
    """(what the wheel is judged for, or None and why nothing is)."""
    families = {f for p in platforms if (f := family_of(p))}
    if families and families <= set(NON_LINUX):
        names = " and ".join(sorted(NON_LINUX[f] for f in families))
        return None, f"a wheel for {names}: auditwheel's policies judge Linux ELF files only"
    read = [(e, *elf_arch(e)) for e in host_elfs(elfs)]
    unknown = next((f"{e.member}: {why}" for e, got, why in read if got is None), "")
    arch = tag_arch(platforms) or next((got for _, got, _ in read if got is not None), None)
    usable = [e for e, got, _ in read if arch is not None and got == arch]
    if not usable:
        if unknown:
            return None, f"no ELF file of an architecture auditwheel knows ({unknown})"
        return None, ""
    assert arch is not None
    linux = families - set(NON_LINUX)
    assumed = False
    if len(linux) == 1:
        family = linux.pop()
        how = "its platform tags"
    else:
        family, how = next(((f, f"{e.member}: {h}") for e in usable for f, h in [elf_libc(e)] if f), ("", ""))
        if not family:
            family, assumed = "manylinux", True
            named = " and ".join(sorted(linux)) if linux else "no C library"
            how = f"its tags name {named} and no ELF file names its C library: glibc, as auditwheel on a glibc host"
    platform = next((p for p in platforms if family_of(p) == family), "")
    return Target(family, arch, policies(family, arch, platform), how, assumed), ""


def claimed_policy(t: Target, platforms: list[str]) -> tuple[Policy | None, str]:
    """(the policy of the most portable tag of the target's family the wheel claims, that tag): for manylinux
    the newest policy not above the claimed glibc (legacy aliases and tags auditwheel has no policy for, such
    as manylinux_2_33, included); (None, "") when it claims none."""
    claimed = sorted(p for p in platforms if family_of(p) == t.family)
    if t.family == "manylinux":
        floors = sorted((g, p) for p in claimed if (g := glibc_of(p)))
        if not floors:
            return None, ""
        pols = [p for p in t.policies if (glibc_of(p.name) or (0, 0)) <= floors[0][0]][-1:]
        return (pols[0] if pols else None), floors[0][1]
    named = [p for p in t.policies if p.name in claimed]
    return (named[0], named[0].name) if named else (None, claimed[0] if claimed else "")


def system_libraries_of_tags(platforms: list[str]) -> frozenset[str]:
    """The system libraries of the most portable of these platform tags (their one Linux family, else
    manylinux; their architecture, else x86_64) and that architecture's loader: what the release payload's
    libraries may need from outside it."""
    families = {f for p in platforms if (f := family_of(p)) in POLICY_FILES}
    family = families.pop() if len(families) == 1 else "manylinux"
    arch = tag_arch(platforms) or "x86_64"
    t = Target(family, arch, policies(family, arch), "its tags")
    loader = {"x86_64": "ld-linux-x86-64.so.2", "aarch64": "ld-linux-aarch64.so.1"}.get(arch)
    return system_libraries(t, platforms) | ({loader} if loader else set())


def system_libraries(t: Target | None, platforms: list[str]) -> frozenset[str]:
    """The libraries outside the wheel that the most portable claimed tag of the target's family lets an
    ELF file need: that tag's policy (claimed_policy), else the family's most permissive policy."""
    if t is None:
        return frozenset()
    pol = claimed_policy(t, platforms)[0] or (t.policies[-1] if t.policies else None)
    libs = set(pol.whitelist) if pol else set()
    if t.family == "musllinux":
        libs.add(MUSL_LIBC.get(t.arch, ""))
    return frozenset(libs)


def verdict(
    t: Target | None,
    elfs: list[ElfFacts],
    where: Mapping[tuple[str, str], str | None] | None = None,
    unused: Collection[str] = (),
) -> tuple[str | None, str]:
    """(the most portable tag of the target's family the ELF files allow, what keeps a more portable
    one out), by auditwheel's rules: every library outside the wheel is a system library of the
    policy, every symbol version needed is allowed (also one a library inside the wheel provides: a
    SONAME the system has too resolves to the copy already loaded, as auditwheel counts them), no
    forbidden symbol is used, no ISA level above baseline is declared, no extension references
    PyFPE_jbuf or UCS2 functions. `where`: elf_rules.load_chains (None: every DT_NEEDED counts as
    outside); `unused`: ELF files nothing loads (elf_rules.Chains.unused), which decide nothing.

    The ISA level is read from every ELF file the wheel loads, where auditwheel reads its roots and the
    system libraries only: a grafted library declaring x86-64-v2 runs on the user's CPU as the extension
    does (a deliberate difference, docs/audit-platforms.md)."""
    if t is None:
        return None, ""
    elfs = [
        e
        for e in host_elfs(elfs)
        if elf_arch(e)[0] == t.arch and elf_libc(e)[0] in (None, t.family) and e.member not in unused
    ]
    isa = next((e for e in elfs if e.isa_needed), None)
    if isa is not None:  # auditwheel's machine policy: no portable tag for an ISA extension level
        return t.linux, f"{isa.member} declares {isa.isa_needed} in its GNU property note (ISA_1_NEEDED)"
    fpe = next((e for e in elfs if e.py_ext and e.pyfpe), None)
    if fpe is not None:
        return t.linux, f"{fpe.member} references PyFPE_jbuf, which only fpectl builds of Python define"
    ucs2 = next((e for e in elfs if e.py_ext == 2 and e.ucs2), None)
    if ucs2 is not None:
        return t.linux, f"{ucs2.member} is built for a narrow-unicode (UCS2) Python"
    where = where or {}

    def outside(lib: str) -> bool:
        return not is_loader(lib) and not (t.family == "android" and _LIBPYTHON.match(lib))

    ext = [(e.member, lib) for e in elfs for lib in e.needed if where.get((e.member, lib)) is None and outside(lib)]
    versions = [(e.member, lib, v) for e in elfs for lib, vs in e.version_needs if not is_loader(lib) for v in vs]
    reason = ""
    for pol in t.policies:
        bad_lib = next(((m, lib) for m, lib in ext if lib not in pol.whitelist), None)
        bad_sym = next(((m, lib, v) for m, lib, v in versions if not pol.admits(v)), None)
        bad_use = next(
            (
                (e.member, lib, s)
                for e in elfs
                for lib in e.needed
                for s in e.forbidden_candidates
                if s in pol.blacklist.get(lib, ())
            ),
            None,
        )
        if bad_lib is None and bad_sym is None and bad_use is None:
            return pol.name, reason
        name = pol.name.rsplit("_" + t.arch, 1)[0]
        # Kept from the last failure before the verdict: what the next more portable tag lacks.
        if bad_lib is not None:
            reason = f"{bad_lib[1]} (needed by {bad_lib[0]}) is neither in the wheel nor a system library of {name}"
        elif bad_sym is not None:
            reason = f"{bad_sym[2]} from {bad_sym[1]} (needed by {bad_sym[0]}) is newer than {name} allows"
        elif bad_use is not None:
            reason = f"{bad_use[0]} uses {bad_use[2]} of {bad_use[1]}, which {name} forbids"
    return t.linux, reason
