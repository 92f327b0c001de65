"""ELF reader (pyelftools): the dynamic section, segments, versions, exports."""

from __future__ import annotations

import io
import re
from bisect import bisect_right
from dataclasses import dataclass, field
from functools import cache
from typing import Any, BinaryIO, cast

from ._dynsym import Dynamic, DynSymbols, bounded_versions, read_tables

# pyelftools is imported where an ELF file is read (90 ms that a wheel without one never needs).

PF_X, PF_W = 0x1, 0x2
SHF_EXECINSTR = 0x4


@dataclass(frozen=True)
class ElfFacts:
    """What the rules need of one ELF file: machine, dynamic section, versions, segments, code."""

    member: str
    machine: str
    needed: tuple[str, ...]
    rpath: tuple[str, ...]
    runpath: tuple[str, ...]
    soname: str
    textrel: bool
    execstack: bool
    rwx_segments: tuple[int, ...]
    exports: tuple[str, ...]
    # library -> version names it needs (e.g. "libc.so.6" -> ("GLIBC_2.34",))
    version_needs: tuple[tuple[str, tuple[str, ...]], ...]
    exec_sections: tuple[tuple[str, int, bytes], ...] = field(repr=False)
    # sorted (address, name) of functions, for naming addresses
    symbols: tuple[tuple[int, str], ...] = field(repr=False)
    elfclass: int = 64
    little_endian: bool = True
    osabi: str = "ELFOSABI_SYSV"
    fatbin_bytes: int = 0  # size of the .nv_fatbin section (embedded CUDA device code), 0 if none
    # The x86-64 ISA level its GNU property note says it needs ("x86_64_v2".."x86_64_v4",
    # "unknown x86_64 ISA", or "" for baseline / no note): auditwheel allows no manylinux tag above baseline.
    isa_needed: str = ""
    # Undefined dynamic symbols that some manylinux policy forbids (auditwheel's "blacklist").
    forbidden_candidates: tuple[str, ...] = ()
    interp: str = ""  # PT_INTERP: the program interpreter an executable names ("" for a library)
    eflags: int = 0  # e_flags: for 32-bit ARM, the EABI version and float ABI
    # A Python extension module: 3 (PyInit_<name> defined), 2 (init<name>, _cffi_pypyinit_<name>), 0 not one.
    py_ext: int = 0
    pyfpe: bool = False  # references PyFPE_jbuf/PyFPE_dummy/PyFPE_counter (fpectl builds only)
    ucs2: bool = False  # references PyUnicodeUCS2_* functions (a narrow-unicode Python 2)
    # An x86-64 library's code sampled for its instruction set (read_elf_stream's isa_budget), or None
    isa_sample: IsaSample | None = field(default=None, repr=False)
    # Its dynamic symbol and version tables (what the loader binds), for a 64-bit little-endian file, or None
    link: DynSymbols | None = field(default=None, repr=False)

    def symbol_at(self, address: int) -> str:
        i = bisect_right(self.symbols, (address, "\uffff")) - 1
        return self.symbols[i][1] if i >= 0 else "?"


_LOADER = re.compile(r"^(ld-linux[\w.-]*\.so\.\d+|ld64\.so\.[12])$")


def is_loader(needed: str) -> bool:
    """The dynamic loader itself (ld-linux-x86-64.so.2, ld-linux-aarch64.so.1, ld64.so.2): always the system's."""
    return bool(_LOADER.match(needed))


def is_elf(data: bytes) -> bool:
    """Whether the bytes start with the ELF magic."""
    return data[:4] == b"\x7fELF"


@dataclass(frozen=True)
class IsaSample:
    """What a sample of a library's code says of the instructions it runs: every CPUID feature the
    sampled bytes use (iced-x86's names) with the first use, how much was sampled of how much code,
    and the evidence that it chooses its code at run time ("" when none was seen)."""

    code_bytes: int
    sampled_bytes: int
    features: tuple[tuple[str, int, int, str], ...]  # (feature, count, first address, first instruction)
    dispatch: str


# What a library that chooses its code at run time calls or contains (GCC's __builtin_cpu_supports,
# glibc's getauxval and CPU features, an ifunc resolved by the loader, the CPUID instruction itself).
_DISPATCH_NAMES = (
    "__cpu_indicator_init",
    "__cpu_model",
    "__cpu_features2",
    "getauxval",
    "__x86_get_cpuid_feature_leaf",
)
_R_X86_64_IRELATIVE = 37
SAMPLE_WINDOW = 64 << 10  # bytes decoded from one place; x86 decoding finds instruction boundaries within a few
CPUID_SCAN = 256 << 20  # code searched for a CPUID instruction when the sample met none (candidates: in budget)
_SCAN_CHUNK = 4 << 20
_CPUID = b"\x0f\xa2"
_SYNC = 32  # bytes decoded before a candidate: x86 decoding falls into step with the instructions by then


def _cpuid_anywhere(stream: BinaryIO, merged: list[tuple[int, int, int]], budget: int) -> str:
    """A CPUID instruction anywhere in the code (the first CPUID_SCAN bytes): its bytes found by a byte
    search, each candidate decoded from a little before it, so bytes 0f a2 inside another instruction do
    not count. A library's dispatch (OpenBLAS's DYNAMIC_ARCH, libgcc's __cpu_indicator_init linked in
    statically) runs once, from a few bytes a sample rarely meets. The candidates decoded are inside the
    sample's `budget` (bytes decoded), so code crafted of 0f a2 pairs costs no more than the sample does."""
    iced_x86, _ = iced()
    left = CPUID_SCAN
    for offset, size, address in merged:
        pos = 0
        while pos < size and left > 0 and budget > 0:
            start = max(0, pos - _SYNC)
            n = min(size - start, _SCAN_CHUNK + _SYNC)
            stream.seek(offset + start)
            chunk = stream.read(n)
            left -= len(chunk)
            j = chunk.find(_CPUID, pos - start)
            while j != -1 and budget > 0:
                lo = max(0, j - _SYNC)
                budget -= j + 2 - lo
                want = address + start + j
                for ins in iced_x86.Decoder(64, chunk[lo : j + 2], ip=address + start + lo):
                    if ins.ip == want and ins.mnemonic == iced_x86.Mnemonic.CPUID:
                        return f"executes cpuid ({ins} at {want:#x})"
                    if ins.ip >= want:
                        break
                j = chunk.find(_CPUID, j + 1)
            pos = start + len(chunk)
    return ""


def _irelative(stream: BinaryIO, rela: list[tuple[int, int]]) -> bool:
    """Whether any dynamic relocation is R_X86_64_IRELATIVE (an ifunc: the loader picks an implementation).
    Each byte of the file is read at most once, whatever the section headers say (65535 headers over one
    relocation table once re-read it 65535 times): the tables' ranges are merged first, each entry aligned to
    its own table's start. `rela`: (file offset, size) of each SHT_RELA section of 24-byte entries."""
    stream.seek(0, io.SEEK_END)
    end = stream.tell()
    covered = 0
    for offset, size in sorted(rela):
        start, stop = max(offset, covered), min(offset + size, end)
        if start >= stop:
            continue
        start += -(start - offset) % 24  # the first whole entry of this table not read yet
        stream.seek(start)
        data = stream.read(max(0, stop - start))
        covered = max(covered, stop)
        types = data[8::24]  # the low byte of each entry's r_info (its type's), one C-level slice
        j = types.find(_R_X86_64_IRELATIVE)
        while j != -1:
            if data[8 + 24 * j + 1 : 8 + 24 * j + 4] == b"\0\0\0":
                return True
            j = types.find(_R_X86_64_IRELATIVE, j + 1)
    return False


@cache
def iced() -> tuple[Any, dict[int, str]]:
    """The disassembler and its CPUID feature names, imported on first disassembly (60 ms that a
    wheel without CPU variants never needs)."""
    import iced_x86

    names = {v: k for k, v in vars(iced_x86.CpuidFeature).items() if not k.startswith("_") and isinstance(v, int)}
    return iced_x86, names


def _sample_isa(
    stream: BinaryIO, ranges: list[tuple[int, int, str, int]], budget: int, dispatch: str, baseline: frozenset[str]
) -> IsaSample:
    """At most `budget` bytes of the executable ranges decoded, in windows spread evenly over them; where
    they met a feature outside `baseline` (the policy's) and no dispatch, the code searched for cpuid."""
    stream.seek(0, io.SEEK_END)
    end = stream.tell()
    merged: list[tuple[int, int, int]] = []  # (offset, size, address), each byte once
    covered = 0
    for offset, size, _, address in sorted(ranges):
        start, stop = max(offset, covered), min(offset + size, end)
        if start < stop:
            merged.append((start, stop - start, address + (start - offset)))
            covered = stop
    total = sum(size for _, size, _ in merged)
    windows: list[tuple[int, int, int]] = []
    if total <= budget:
        windows = merged
    elif total:
        count = max(1, budget // SAMPLE_WINDOW)
        step = total / count
        for k in range(count):
            at = int(k * step)  # a position in the concatenated code, mapped back to its range
            for offset, size, address in merged:
                if at < size:
                    n = min(SAMPLE_WINDOW, size - at)
                    windows.append((offset + at, n, address + at))
                    break
                at -= size
    iced_x86, names = iced()
    counts: dict[str, int] = {}
    first: dict[str, tuple[int, str]] = {}
    sampled = 0
    for offset, size, address in windows:
        stream.seek(offset)
        code = stream.read(size)
        sampled += len(code)
        for ins in iced_x86.Decoder(64, code, ip=address):
            if ins.is_invalid or ins.mnemonic == iced_x86.Mnemonic.TZCNT:  # tzcnt runs as bsf without BMI1
                continue
            for f in ins.cpuid_features():
                name = names.get(f, str(f))
                counts[name] = counts.get(name, 0) + 1
                if name not in first:
                    first[name] = (ins.ip, str(ins))
    if not dispatch and "CPUID" in counts:
        dispatch = f"executes cpuid ({first['CPUID'][1]} at {first['CPUID'][0]:#x})"
    if not dispatch and set(counts) - baseline:
        dispatch = _cpuid_anywhere(stream, merged, budget)
    features = tuple((n, counts[n], first[n][0], first[n][1]) for n in sorted(counts))
    return IsaSample(total, sampled, features, dispatch)


def read_elf(member: str, data: bytes) -> ElfFacts | None:
    """Facts about one ELF file, or None if `data` is not ELF."""
    if not is_elf(data):
        return None
    return read_elf_stream(member, io.BytesIO(data))


class _Bounded(io.RawIOBase):
    """A seekable stream whose reads never ask for more than is left of it: a size field of a
    damaged ELF (2**63 bytes) becomes a short read, not a huge allocation."""

    def __init__(self, inner: BinaryIO) -> None:
        self._inner = inner
        self._size = inner.seek(0, io.SEEK_END)
        inner.seek(0)
        self._tell = inner.tell
        self._read = inner.read

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        return self._inner.seek(offset, whence)  # past the end is harmless: reads are clamped

    def tell(self) -> int:
        return self._tell()

    def read(self, n: int | None = -1) -> bytes:
        left = self._size - self._tell()
        return self._read(left if n is None or n < 0 or n > left else n)

    def readinto(self, buf: Any) -> int:
        data = self.read(len(buf))
        buf[: len(data)] = data
        return len(data)


def _isa_needed(elf: Any, seg: Any) -> str:
    """auditwheel's reading of GNU_PROPERTY_X86_ISA_1_NEEDED (bit 0 baseline, 1 v2, 2 v3, 3 v4),
    from one PT_NOTE segment."""
    if elf["e_machine"] != "EM_X86_64":
        return ""
    for note in seg.iter_notes():
        if note["n_type"] != "NT_GNU_PROPERTY_TYPE_0" or note["n_name"] != "GNU":
            continue
        for prop in note["n_desc"]:
            if prop.pr_type != "GNU_PROPERTY_X86_ISA_1_NEEDED" or prop.pr_datasz != 4:
                continue
            data = prop.pr_data & ~1
            for bit, level in ((8, "x86_64_v4"), (4, "x86_64_v3"), (2, "x86_64_v2")):
                if data & bit:
                    return level
            return "unknown x86_64 ISA" if data else ""
    return ""


def _forbidden_candidates(by_name: dict[str, Any], strings: bytes | None, forbidden: frozenset[str]) -> tuple[str, ...]:
    """The undefined dynamic symbols named in `forbidden` that the loader must resolve: a weak reference
    (STB_WEAK) is optional, the library works without it, and is no use (as auditwheel's blacklist check
    sees it). Only names that are whole strings of .dynstr (`strings`) can be symbols; of those, one the
    hash table finds is defined here, so the symbol table is walked only for what remains (libtorch: one
    section read, no walk)."""
    from elftools.elf.sections import SymbolTableSection

    dynsym = by_name.get(".dynsym")
    if not forbidden or strings is None or not isinstance(dynsym, SymbolTableSection):
        return ()
    named = sorted(n for n in forbidden if b"\0" + n.encode() + b"\0" in strings)
    table = _hash_table(by_name)
    if table is not None:  # .gnu.hash holds defined symbols only; SysV .hash holds undefined ones too
        named = [n for n in named if (s := table.get_symbol(n)) is None or s.entry.st_shndx == "SHN_UNDEF"]
    if not named:
        return ()
    wanted = set(named)
    return tuple(
        sorted(
            {
                s.name
                for s in dynsym.iter_symbols()
                if s.entry.st_shndx == "SHN_UNDEF" and s.entry.st_info.bind != "STB_WEAK" and s.name in wanted
            }
        )
    )


def _hash_table(by_name: dict[str, Any]) -> Any:
    """The dynamic symbol hash table (.gnu.hash, else .hash), which finds a defined symbol without a walk."""
    from elftools.elf.hash import ELFHashSection, GNUHashSection

    table = by_name.get(".gnu.hash") or by_name.get(".hash")
    return table if isinstance(table, GNUHashSection | ELFHashSection) else None


_PYFPE = ("PyFPE_jbuf", "PyFPE_dummy", "PyFPE_counter")


def _python_facts(member: str, by_name: dict[str, Any], strings: bytes | None) -> tuple[int, bool, bool]:
    """(extension version, PyFPE use, UCS2 use) as auditwheel reads them from the dynamic symbol table (what
    the loader sees: an init function only .symtab names cannot be found by dlsym, and a static executable's
    .symtab of 145,000 symbols is never walked): an extension defines its init function (PyInit_<module>: 3;
    init<module> or _cffi_pypyinit_<module>: 2); a use is an undefined function (or untyped) symbol. Where
    .dynstr (`strings`) names no such symbol nothing is read; where it names only init functions, the hash
    table answers; else the table is walked."""
    from elftools.elf.sections import SymbolTableSection

    table = by_name.get(".dynsym")
    if not isinstance(table, SymbolTableSection):
        return 0, False, False
    modname = member.rsplit("/", 1)[-1].rsplit("!", 1)[-1].split(".", 1)[0]
    inits = {f"PyInit_{modname}": 3, f"init{modname}": 2, f"_cffi_pypyinit_{modname}": 2}
    hashed = _hash_table(by_name)
    if strings is not None:
        named = [n for n in inits if n.encode() + b"\0" in strings]  # a suffix: linkers merge string tails
        uses = any(n.encode() + b"\0" in strings for n in _PYFPE) or b"PyUnicodeUCS2_" in strings
        if not named and not uses:
            return 0, False, False
        if not uses and hashed is not None:
            found = [hashed.get_symbol(n) for n in named]
            defined = [
                inits[n]
                for n, sym in zip(named, found, strict=True)
                if sym is not None and sym.entry.st_shndx != "SHN_UNDEF" and sym.entry.st_info.type == "STT_FUNC"
            ]
            return (defined[0] if defined else 0), False, False
    ext, fpe, ucs2 = 0, False, False
    for s in table.iter_symbols():
        name = s.name
        if not name.startswith(("Py", "init", "_cffi_pypyinit_")):
            continue
        e = s.entry
        kind = e.st_info.type
        if name in inits and e.st_shndx != "SHN_UNDEF" and kind == "STT_FUNC":
            ext = ext or inits[name]
        elif e.st_shndx == "SHN_UNDEF" and name in _PYFPE and kind in ("STT_FUNC", "STT_NOTYPE"):
            fpe = True
        elif e.st_shndx == "SHN_UNDEF" and "PyUnicodeUCS2_" in name and kind == "STT_FUNC":
            ucs2 = True
    return ext, fpe, ucs2


def _code_once(stream: BinaryIO, ranges: list[tuple[int, int, str, int]]) -> tuple[tuple[str, int, bytes], ...]:
    """The executable sections' bytes, each byte of the file read (and later disassembled) at most once:
    section headers that share or overlap bytes (65535 headers over one 1 MiB of code cost 64 GiB read one by
    one) are merged into one range, at the address of the first header that reaches it. Bounded by the file."""
    stream.seek(0, io.SEEK_END)
    end_of_file = stream.tell()
    out: list[tuple[str, int, bytes]] = []
    covered = 0  # the file offset up to which bytes were taken
    for offset, size, name, address in sorted(ranges):
        start, stop = max(offset, covered), min(offset + size, end_of_file)
        if start >= stop:
            continue
        stream.seek(start)
        out.append((name, address + (start - offset), stream.read(stop - start)))
        covered = stop
    return tuple(out)


def read_elf_stream(
    member: str,
    stream: BinaryIO,
    *,
    code: bool = True,
    exports: bool = True,
    forbidden: frozenset[str] = frozenset(),
    isa_budget: int = 0,
    isa_baseline: frozenset[str] = frozenset(),
) -> ElfFacts:
    """Facts about the ELF file on a seekable stream; bounded reads only. Without `code`, the
    executable sections and the symbol table are skipped (large CUDA binaries: the dynamic
    section, versions and segments are all the rules need); without `exports`, the dynamic
    symbol table is not walked (hundreds of thousands of symbols in libtorch). With `isa_budget`, an
    x86-64 library that is no Python extension has at most that many bytes of its code decoded for
    its instruction set (IsaSample), without holding its code; `isa_baseline`: the features that need no
    search for a dispatch (the policy's baseline).

    Raises ValueError for any file pyelftools cannot walk: on a damaged ELF it raises ELFError,
    struct and construct errors, KeyError, IndexError, TypeError, OverflowError, RecursionError...
    all of them a verdict on the bytes, never a crash of the audit."""
    from elftools.elf.dynamic import DynamicSection
    from elftools.elf.elffile import ELFFile
    from elftools.elf.gnuversions import GNUVerNeedSection
    from elftools.elf.sections import SymbolTableSection
    from elftools.elf.segments import InterpSegment, NoteSegment

    try:
        # BytesIO already clamps a read to what is left; a file must be told (a read of 2**62 bytes
        # would allocate them first).
        elf = ELFFile(stream if isinstance(stream, io.BytesIO) else cast(BinaryIO, _Bounded(stream)))
        needed: list[str] = []
        rpath: list[str] = []
        runpath: list[str] = []
        soname = ""
        textrel = False
        # One pass over the sections (pyelftools builds each section object it yields; libtorch's
        # hash tables alone cost milliseconds each).
        needs: list[tuple[str, tuple[str, ...]]] = []
        exec_ranges: list[tuple[int, int, str, int]] = []  # (file offset, size, name, address) of code
        rela: list[tuple[int, int]] = []  # (file offset, size) of relocation tables with addends
        by_name: dict[str, object] = {}
        sections = []
        for sec in elf.iter_sections():
            sections.append(sec)
            if sec.name in (".dynsym", ".symtab", ".dynstr", ".gnu.hash", ".hash", ".nv_fatbin"):
                by_name.setdefault(sec.name, sec)
            if sec["sh_flags"] & SHF_EXECINSTR and sec["sh_type"] == "SHT_PROGBITS" and sec["sh_size"]:
                exec_ranges.append((sec["sh_offset"], sec["sh_size"], sec.name, sec["sh_addr"]))
            if sec["sh_type"] == "SHT_RELA" and sec["sh_entsize"] == 24 and sec["sh_size"]:
                rela.append((sec["sh_offset"], sec["sh_size"]))
            if isinstance(sec, GNUVerNeedSection):
                for verneed, auxs in bounded_versions(sec):
                    needs.append((str(verneed.name), tuple(str(a.name) for a in auxs)))
            if isinstance(sec, DynamicSection):
                dyn = Dynamic.of(sec)
                needed += dyn.needed
                rpath += dyn.rpath
                runpath += dyn.runpath
                soname = dyn.soname or soname
                textrel = textrel or dyn.textrel
        execstack = False
        rwx: list[int] = []
        isa = ""
        interp = ""
        for i, seg in enumerate(elf.iter_segments()):
            if isinstance(seg, NoteSegment) and not isa:
                isa = _isa_needed(elf, seg)
            if isinstance(seg, InterpSegment) and not interp:
                interp = seg.get_interp_name()
            flags = seg["p_flags"]
            if seg["p_type"] == "PT_GNU_STACK" and flags & PF_X:
                execstack = True
            if seg["p_type"] == "PT_LOAD" and flags & PF_W and flags & PF_X:
                rwx.append(i)
        exported: list[str] = []
        dynsym = by_name.get(".dynsym")
        if exports and isinstance(dynsym, SymbolTableSection):
            for s in dynsym.iter_symbols():
                e = s.entry
                if (
                    e.st_shndx != "SHN_UNDEF"
                    and e.st_info.bind in ("STB_GLOBAL", "STB_WEAK", "STB_GNU_UNIQUE")
                    and e.st_other.visibility in ("STV_DEFAULT", "STV_PROTECTED")
                    and s.name
                ):
                    exported.append(s.name)
        exec_secs = _code_once(stream, exec_ranges) if code else ()
        dynstr: Any = by_name.get(".dynstr")
        strings = b"\0" + dynstr.data() if dynstr is not None else None  # read once, searched by both
        py_ext, pyfpe, ucs2 = _python_facts(member, by_name, strings)
        sample = None
        if isa_budget and not code and not py_ext and not interp and elf["e_machine"] == "EM_X86_64" and exec_ranges:
            named = [n for n in _DISPATCH_NAMES if strings is not None and b"\0" + n.encode() + b"\0" in strings]
            dispatch = f"calls {named[0]}" if named else ("has ifunc relocations" if _irelative(stream, rela) else "")
            sample = _sample_isa(stream, exec_ranges, isa_budget, dispatch, isa_baseline)
        fatbin: Any = by_name.get(".nv_fatbin")
        table = by_name.get(".symtab") or dynsym
        syms: list[tuple[int, str]] = []
        if code and isinstance(table, SymbolTableSection):
            syms = sorted(
                (s["st_value"], s.name) for s in table.iter_symbols() if s["st_info"]["type"] == "STT_FUNC" and s.name
            )
        return ElfFacts(
            member=member,
            machine=elf["e_machine"],
            needed=tuple(needed),
            rpath=tuple(rpath),
            runpath=tuple(runpath),
            soname=soname,
            textrel=textrel,
            execstack=execstack,
            rwx_segments=tuple(rwx),
            exports=tuple(sorted(set(exported))),
            version_needs=tuple(needs),
            exec_sections=exec_secs,
            symbols=tuple(syms),
            elfclass=elf.elfclass,
            little_endian=elf.little_endian,
            osabi=str(elf["e_ident"]["EI_OSABI"]),
            fatbin_bytes=fatbin["sh_size"] if fatbin is not None else 0,
            isa_needed=isa,
            forbidden_candidates=_forbidden_candidates(by_name, strings, forbidden),
            interp=interp,
            eflags=elf["e_flags"],
            py_ext=py_ext,
            pyfpe=pyfpe,
            ucs2=ucs2,
            isa_sample=sample,
            link=read_tables(member, elf, sections, (needed, rpath, runpath, soname))
            if elf.elfclass == 64 and elf.little_endian
            else None,
        )
    except Exception as exc:  # any of them is a verdict on the bytes (see the docstring)
        raise ValueError(f"{member}: malformed ELF: {type(exc).__name__}: {exc}") from exc
