"""The dynamic symbol and version tables of one ELF file, and nothing else: what the loader binds.

Only the section headers, the dynamic section and the bytes of .dynsym, its string table and the GNU version
sections are read (libtorch_cuda.so is over 1 GB; its tables are a few MB). The symbol table is unpacked with
`struct` in one pass (pyelftools builds an object per symbol: seconds for libtorch's hundreds of thousands);
the version tables, tens of entries, through pyelftools.
"""

from __future__ import annotations

import io
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO

STB_GLOBAL, STB_WEAK, STB_GNU_UNIQUE = 1, 2, 10
VERSYM_HIDDEN = 0x8000


@dataclass(frozen=True)
class DynSymbols:
    """What one ELF file offers the loader and asks of it.

    `names`: the global symbols it defines that an unversioned reference binds to (unversioned, or at their
    default version); `versioned`: "name@VERSION" for every version of a symbol it defines (hidden ones too:
    a reference naming that version binds to it); `unversioned`: it carries no version definitions (a reference
    with any version binds to its symbol by name, as glibc's loader allows); `undefined`: (name, version,
    the file the version belongs to) of each undefined global symbol that is not weak ("" where unversioned)."""

    member: str
    soname: str
    needed: tuple[str, ...]
    rpath: tuple[str, ...]
    runpath: tuple[str, ...]
    names: frozenset[str]
    versioned: frozenset[str]
    unversioned: bool
    undefined: tuple[tuple[str, str, str], ...]

    def defines(self, name: str, version: str) -> bool:
        if not version:
            return name in self.names
        return f"{name}@{version}" in self.versioned or (self.unversioned and name in self.names)


DF_TEXTREL = 0x4
# Version entries (and their auxiliaries) one section may hold: glibc's libc.so.6 defines about 40, and a
# damaged count (sh_info, vn_cnt) with a zero `next` offset would have pyelftools yield the same entry billions
# of times.
MAX_VERSION_ENTRIES = 1 << 14


def bounded_versions(sec: Any) -> Iterator[tuple[Any, list[Any]]]:
    """pyelftools' (entry, auxiliaries) of a GNU version section, at most MAX_VERSION_ENTRIES in all (a
    ValueError beyond: the section is damaged)."""
    seen = 0
    for entry, auxs in sec.iter_versions():
        listed = []
        for aux in auxs:
            seen += 1
            if seen > MAX_VERSION_ENTRIES:
                break
            listed.append(aux)
        seen += 1
        if seen > MAX_VERSION_ENTRIES:
            raise ValueError(f"{sec.name}: more than {MAX_VERSION_ENTRIES} version entries (a damaged count)")
        yield entry, listed


@dataclass
class Dynamic:
    """The entries of a dynamic section the rules read."""

    needed: list[str]
    rpath: list[str]
    runpath: list[str]
    soname: str = ""
    textrel: bool = False

    @classmethod
    def of(cls, sec: Any) -> Dynamic:
        d = cls([], [], [])
        for tag in sec.iter_tags():
            t = tag.entry.d_tag
            # pyelftools sets these attributes per tag type; it has no type hints.
            if t == "DT_NEEDED":
                d.needed.append(tag.needed)
            elif t == "DT_RPATH":
                d.rpath.extend(tag.rpath.split(":"))
            elif t == "DT_RUNPATH":
                d.runpath.extend(tag.runpath.split(":"))
            elif t == "DT_SONAME":
                d.soname = tag.soname
            elif t == "DT_TEXTREL" or (t == "DT_FLAGS" and tag.entry.d_val & DF_TEXTREL):
                d.textrel = True
        return d


def read_dynsym(member: str, stream: BinaryIO) -> DynSymbols:
    """The dynamic symbol facts of the ELF file on a seekable stream. ValueError naming the problem for a file
    that is not a little-endian 64-bit ELF shared object with readable tables (the loader would refuse it too)."""
    from elftools.common.exceptions import ELFError
    from elftools.elf.elffile import ELFFile

    try:
        elf = ELFFile(stream)
        if elf.elfclass != 64 or not elf.little_endian:
            raise ValueError(f"{member}: a {elf.elfclass}-bit {'little' if elf.little_endian else 'big'}-endian ELF")
        return read_tables(member, elf, list(elf.iter_sections()))
    except (ELFError, struct.error, KeyError, IndexError, TypeError, OverflowError, UnicodeDecodeError) as exc:
        raise ValueError(f"{member}: unreadable dynamic symbol table ({type(exc).__name__}: {exc})") from None


def read_dynsym_bytes(member: str, data: bytes) -> DynSymbols:
    return read_dynsym(member, io.BytesIO(data))


def _bytes(stream: BinaryIO, offset: int, size: int, limit: int = 1 << 30) -> bytes:
    """`size` bytes at `offset`, read only when the file holds them (a size field is never trusted first)."""
    if size > limit:
        raise ValueError(f"a dynamic table of {size} bytes (over {limit})")
    end = stream.seek(0, io.SEEK_END)
    if offset < 0 or offset + size > end:
        raise ValueError(f"a table at {offset} of {size} bytes runs past the end of the file ({end} bytes)")
    stream.seek(offset)
    data = stream.read(size)
    if len(data) != size:
        raise ValueError(f"a table at {offset} runs past the end of the file")
    return data


def read_tables(
    member: str,
    elf: Any,
    sections: list[Any],
    dynamic: tuple[list[str], list[str], list[str], str] | None = None,
) -> DynSymbols:
    """DynSymbols of an ELF file pyelftools opened (`sections`: its sections, already listed once; `dynamic`:
    its DT_NEEDED, DT_RPATH, DT_RUNPATH and DT_SONAME where already read: the dynamic section lies after the
    code, which a stream through a compressed zip member would inflate again to reach)."""
    from elftools.elf.dynamic import DynamicSection
    from elftools.elf.gnuversions import GNUVerDefSection, GNUVerNeedSection

    needed: list[str] = []
    rpath: list[str] = []
    runpath: list[str] = []
    soname = ""
    stream = elf.stream  # as pyelftools reads it (read_elf_stream bounds what a read may ask for)
    dynsym = next((s for s in sections if s["sh_type"] == "SHT_DYNSYM"), None)
    versym = next((s for s in sections if s["sh_type"] == "SHT_GNU_versym"), None)
    defs: dict[int, str] = {}
    needs: dict[int, tuple[str, str]] = {}
    if dynamic is not None:
        needed, rpath, runpath, soname = dynamic
    for sec in sections:
        if isinstance(sec, DynamicSection) and dynamic is None:
            found = Dynamic.of(sec)
            needed, rpath, runpath, soname = found.needed, found.rpath, found.runpath, found.soname
        elif isinstance(sec, GNUVerDefSection):
            for verdef, auxs in bounded_versions(sec):
                given = [str(a.name) for a in auxs]
                if given and not verdef["vd_flags"] & 0x1:  # VER_FLG_BASE names the file itself
                    defs[int(verdef["vd_ndx"])] = given[0]
        elif isinstance(sec, GNUVerNeedSection):
            for verneed, auxs in bounded_versions(sec):
                for a in auxs:
                    needs[int(a["vna_other"]) & 0x7FFF] = (str(a.name), str(verneed.name))
    names: set[str] = set()
    versioned: set[str] = set()
    undefined: list[tuple[str, str, str]] = []
    if dynsym is not None and dynsym["sh_size"]:
        strtab = sections[dynsym["sh_link"]]
        strings = _bytes(stream, strtab["sh_offset"], strtab["sh_size"])
        table = _bytes(stream, dynsym["sh_offset"], dynsym["sh_size"] - dynsym["sh_size"] % 24)
        count = len(table) // 24
        vs: tuple[int, ...] = ()
        if versym is not None:
            raw = _bytes(stream, versym["sh_offset"], min(versym["sh_size"], count * 2))
            vs = struct.unpack(f"<{len(raw) // 2}H", raw)
        for i, (st_name, st_info, _, shndx, _, _) in enumerate(struct.iter_unpack("<IBBHQQ", table)):
            bind = st_info >> 4
            if i == 0 or bind not in (STB_GLOBAL, STB_WEAK, STB_GNU_UNIQUE):
                continue
            end = strings.find(b"\0", st_name)
            name = strings[st_name : end if end >= 0 else len(strings)].decode("utf-8", "replace")
            v = vs[i] if i < len(vs) else 1
            index = v & 0x7FFF
            if shndx == 0:  # SHN_UNDEF
                if bind == STB_GLOBAL:
                    version, where = needs.get(index, ("", ""))
                    undefined.append((name, version, where))
                continue
            version = defs.get(index, "")
            if version:
                versioned.add(f"{name}@{version}")
            if not v & VERSYM_HIDDEN:
                names.add(name)
    return DynSymbols(
        member,
        soname,
        tuple(needed),
        tuple(rpath),
        tuple(runpath),
        frozenset(names),
        frozenset(versioned),
        not defs,
        tuple(undefined),
    )
