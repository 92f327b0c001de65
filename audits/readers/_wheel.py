"""Wheel (zip) reader: members, RECORD, WHEEL, METADATA, filename tags, and the facts of
every ELF member, in one streaming pass with bounded memory.

No member is held in memory unless an analyzer needs its bytes (the .dist-info files, the
policy's manifests); every other member is streamed through its hashes, and an ELF member
is spooled to a temporary file that pyelftools (and cuobjdump) read with bounded reads.
Members whose declared size or compression ratio is over the policy's limits are not
read at all: they are listed with the reason, and an analyzer reports them."""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import lzma
import shutil
import tempfile
import zipfile
import zlib
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import IO, BinaryIO, cast

from packaging.tags import Tag
from packaging.utils import InvalidWheelFilename, NormalizedName, parse_wheel_filename
from packaging.version import Version

from ..errors import AuditError
from ..model import Limits
from ._cuda import list_arch_bytes, list_archs
from ._elf import ElfFacts, is_elf, read_elf_stream
from ._python import MAX_SOURCE_BYTES, Lookup, find_lookups

_CHUNK = 1 << 20
# What reading one member of a damaged zip raises: a CRC mismatch or bad zip (BadZipFile), a broken
# deflate/bzip2/LZMA stream (zlib.error, OSError, lzma.LZMAError), a cut file (EOFError), an
# encrypted member (RuntimeError), a compression zipfile lacks (NotImplementedError).
MEMBER_ERRORS: tuple[type[BaseException], ...] = (
    zipfile.BadZipFile,
    zlib.error,
    lzma.LZMAError,
    OSError,
    EOFError,
    ValueError,
    RuntimeError,
    NotImplementedError,
)
ARCHIVE_ERRORS: tuple[type[BaseException], ...] = (*MEMBER_ERRORS, zipfile.LargeZipFile)
# ELF members up to this size are spooled in memory, larger ones to a temporary file.
_SPOOL_IN_MEMORY = 8 << 20


@dataclass(frozen=True)
class ReadOptions:
    """What the analyzers will need beyond hashes and ELF headers (decided from the policy)."""

    limits: Limits = field(default_factory=Limits)
    keep: Callable[[str], bool] = lambda name: False  # members whose bytes are kept (plus .dist-info/*)
    code: Callable[[str], bool] = lambda name: False  # ELF members whose code is disassembled
    exports: bool = False  # read every ELF's exported symbols
    cuobjdump: str | None = None  # list SASS/PTX of ELF members holding a .nv_fatbin section
    python: bool = True  # find lookups by distribution name in the .py members (readers/_python.py)
    forbidden: frozenset[str] = frozenset()  # symbols some manylinux policy forbids (ElfFacts.forbidden_candidates)
    # bytes of code sampled per x86-64 library for its instruction set, and per wheel (0: none sampled)
    isa_budget: int = 0
    isa_budget_wheel: int = 0
    isa_baseline: frozenset[str] = frozenset()  # what needs no search for a dispatch (the policy's baseline)


@dataclass(frozen=True)
class CudaListing:
    """cuobjdump's view of one ELF member with embedded device code (any wheel)."""

    member: str
    fatbin_bytes: int
    sass: tuple[str, ...]
    ptx: tuple[str, ...]
    arch_bytes: tuple[tuple[str, int], ...]  # SASS arch -> bytes of its cubins
    error: str = ""


@dataclass(frozen=True)
class Member:
    """One zip entry: name, mode, kind and hashes; its bytes only if an analyzer needs them."""

    name: str
    data: bytes | None  # None unless an analyzer needs the bytes (see ReadOptions.keep)
    mode: int  # unix mode bits from the zip entry
    kind: str = "file"  # "file", "link" (S_IFLNK) or "special" (fifo, device, socket), from the zip entry
    size: int = -1  # uncompressed bytes (from the data when not given)
    sha256: str = ""  # hex digest of the bytes
    record_hash: str = ""  # "sha256=<urlsafe b64>", RECORD's form
    refused: str = ""  # why the reader did not read this member ("" = read)

    def __post_init__(self) -> None:
        if self.data is not None and self.size < 0:
            object.__setattr__(self, "size", len(self.data))
        if self.data is not None and not self.sha256:
            digest = hashlib.sha256(self.data).digest()
            object.__setattr__(self, "sha256", digest.hex())
            object.__setattr__(self, "record_hash", record_form(digest))

    @staticmethod
    def kind_of(external_attr: int) -> str:
        ftype = (external_attr >> 16) & 0o170000
        return "file" if ftype in (0, 0o100000) else "link" if ftype == 0o120000 else "special"


def record_form(digest: bytes) -> str:
    """A sha256 digest in RECORD's form (sha256=<urlsafe base64, unpadded>)."""
    return "sha256=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


@dataclass(frozen=True)
class WheelFacts:
    """Everything read from one wheel file, before any analyzer runs."""

    path: Path
    name: NormalizedName
    version: Version
    tags: frozenset[Tag]
    members: tuple[Member, ...]
    duplicates: tuple[str, ...]
    dist_info: str
    elfs: dict[str, ElfFacts] = field(default_factory=dict)
    non_elf: tuple[str, ...] = ()  # named like a shared library but not ELF
    unreadable: tuple[tuple[str, str], ...] = ()  # (member, why): malformed ELF, bad CRC
    cuda: tuple[CudaListing, ...] = ()
    cuda_inspected: bool = False  # cuobjdump was available
    size: int = 0  # bytes of the wheel file
    sha256: str = ""  # of the wheel file
    lookups: tuple[Lookup, ...] = ()  # calls that look a distribution up by a literal name

    @property
    def filename(self) -> str:
        return self.path.name

    def member(self, name: str) -> Member | None:
        for m in self.members:
            if m.name == name:
                return m
        return None

    def text(self, name: str) -> str | None:
        m = self.member(name)
        return None if m is None or m.data is None else m.data.decode("utf-8", errors="replace")

    @cached_property
    def record(self) -> tuple[tuple[tuple[str, ...], ...], str]:
        """RECORD's rows, and why it does not parse ("" when it does): parse_record, once per wheel."""
        return parse_record(self.text(f"{self.dist_info}/RECORD"))


def looks_like_library(name: str) -> bool:
    """A shared library or an extension module by its name (x.so, x.so.1.2, x.abi3.so)."""
    import re

    base = name.rsplit("/", 1)[-1]
    return bool(re.search(r"\.so(\.\d+)*$", base)) and ".dist-info/" not in name


def parse_record(text: str | None) -> tuple[tuple[tuple[str, ...], ...], str]:
    """RECORD's rows (blank lines dropped) and "", or the rows before the first that does not parse
    as CSV and why (a NUL byte, a field over csv's limit: pip would fail on it too)."""
    rows: list[tuple[str, ...]] = []
    try:
        for row in csv.reader(io.StringIO(text or "")):
            if row:
                rows.append(tuple(row))
    except csv.Error as exc:
        return tuple(rows), f"RECORD line {len(rows) + 1} does not parse as CSV: {exc}"
    return tuple(rows), ""


def file_digest(path: Path) -> tuple[int, str]:
    """(size, sha256) of a file, read in chunks; AuditError if unreadable."""
    h = hashlib.sha256()
    try:
        with path.open("rb") as fh:
            while chunk := fh.read(_CHUNK):
                h.update(chunk)
    except OSError as exc:
        raise AuditError(f"{path}: cannot read ({exc.strerror})") from None
    return path.stat().st_size, h.hexdigest()


def read_wheel(path: Path, options: ReadOptions | None = None) -> WheelFacts:
    """Facts of one wheel; raises AuditError if the file is not a readable wheel at all."""
    opts = options or ReadOptions()
    try:
        name, version, _build, tags = parse_wheel_filename(path.name)
    except InvalidWheelFilename as exc:
        raise AuditError(f"{path}: not a wheel filename ({exc}); audits take built .whl files") from exc
    size, digest = file_digest(path)
    members: list[Member] = []
    elfs: dict[str, ElfFacts] = {}
    non_elf: list[str] = []
    unreadable: list[tuple[str, str]] = []
    cuda: list[CudaListing] = []
    lookups: list[Lookup] = []
    isa_left = [opts.isa_budget_wheel]  # the wheel's sampling budget, spent library by library
    try:
        with zipfile.ZipFile(path) as zf:
            for info in zf.infolist():
                mode, kind = (info.external_attr >> 16) & 0o7777, Member.kind_of(info.external_attr)
                if info.is_dir():
                    members.append(Member(info.filename, None, mode, kind, size=0))
                    continue
                why = opts.limits.refuse(info)
                if why:
                    members.append(Member(info.filename, None, mode, kind, size=info.file_size, refused=why))
                    continue
                try:
                    m, elf, listing = _read_member(zf, info, mode, kind, opts, isa_left)
                except MEMBER_ERRORS as exc:
                    unreadable.append((info.filename, f"cannot decompress: {type(exc).__name__}: {exc}"))
                    members.append(Member(info.filename, None, mode, kind, size=info.file_size))
                    continue
                if _is_source(m.name, opts) and m.data is not None:
                    lookups += find_lookups(m.name, m.data)
                    if not opts.keep(m.name):
                        m = replace(m, data=None)  # parsed; not held
                members.append(m)
                if isinstance(elf, ElfFacts):
                    elfs[m.name] = elf
                elif isinstance(elf, str):
                    unreadable.append((m.name, elf))
                elif kind == "file" and looks_like_library(m.name):
                    non_elf.append(m.name)
                if listing is not None:
                    cuda.append(listing)
    except ARCHIVE_ERRORS as exc:
        # the central directory itself: cut, corrupt, or a member name that is not UTF-8 though flagged so
        raise AuditError(f"{path}: cannot read the wheel: {type(exc).__name__}: {exc}") from exc
    counts = Counter(m.name for m in members)
    dist_infos = sorted({m.name.split("/", 1)[0] for m in members if m.name.split("/", 1)[0].endswith(".dist-info")})
    return WheelFacts(
        path=path,
        name=name,
        version=version,
        tags=frozenset(tags),
        members=tuple(m for m in members if not m.name.endswith("/")),
        duplicates=tuple(sorted(n for n, c in counts.items() if c > 1)),
        dist_info=dist_infos[0] if dist_infos else "",
        elfs=elfs,
        non_elf=tuple(non_elf),
        unreadable=tuple(unreadable),
        cuda=tuple(cuda),
        cuda_inspected=opts.cuobjdump is not None,
        size=size,
        sha256=digest,
        lookups=tuple(lookups),
    )


def _is_source(name: str, opts: ReadOptions) -> bool:
    return opts.python and name.endswith(".py") and ".dist-info/" not in name


def _read_member(
    zf: zipfile.ZipFile, info: zipfile.ZipInfo, mode: int, kind: str, opts: ReadOptions, isa_left: list[int]
) -> tuple[Member, ElfFacts | str | None, CudaListing | None]:
    """Stream one member through its hashes; keep its bytes if asked, spool it if ELF."""
    h = hashlib.sha256()
    keep = info.file_size <= opts.limits.memory_max_bytes and (
        ".dist-info/" in info.filename
        or opts.keep(info.filename)
        or (_is_source(info.filename, opts) and info.file_size <= MAX_SOURCE_BYTES)
    )
    kept = io.BytesIO() if keep else None
    spool: IO[bytes] | None = None
    size = 0
    with zf.open(info) as src:
        head = src.read(_CHUNK)
        if is_elf(head) and kind == "file":
            # in memory up to _SPOOL_IN_MEMORY (the zip declares the size; a lie only makes it a file)
            in_memory = info.file_size <= _SPOOL_IN_MEMORY
            spool = io.BytesIO() if in_memory else tempfile.TemporaryFile(prefix="kt-audit-", suffix=".so")  # noqa: SIM115 (closed by `with spool` below)
        chunk = head
        while chunk:
            h.update(chunk)
            size += len(chunk)
            if kept is not None:
                kept.write(chunk)
            if spool is not None:
                spool.write(chunk)
            chunk = src.read(_CHUNK)
    digest = h.digest()
    member = Member(
        info.filename,
        kept.getvalue() if kept is not None else None,
        mode,
        kind,
        size=size,
        sha256=digest.hex(),
        record_hash=record_form(digest),
    )
    if spool is None:
        return member, None, None
    with spool:
        spool.seek(0)
        try:
            stream = cast(BinaryIO, spool)
            code = opts.code(info.filename)
            program = ".data/scripts/" in info.filename  # run, never loaded by another ELF: not sampled
            budget = 0 if code or program else min(opts.isa_budget, isa_left[0])
            elf = read_elf_stream(
                info.filename,
                stream,
                code=code,
                exports=opts.exports,
                forbidden=opts.forbidden,
                isa_budget=budget,
                isa_baseline=opts.isa_baseline,
            )
            if elf.isa_sample is not None:
                isa_left[0] -= elf.isa_sample.sampled_bytes
        except ValueError as exc:
            return member, str(exc), None
        listing = None
        if elf.fatbin_bytes and opts.cuobjdump is not None:
            listing = _list_cuda(opts.cuobjdump, info.filename, elf.fatbin_bytes, spool)
    return member, elf, listing


def _list_cuda(tool: str, name: str, fatbin_bytes: int, spool: IO[bytes]) -> CudaListing:
    """cuobjdump needs a file on disk: the spooled member is written out once."""
    with tempfile.NamedTemporaryFile(prefix="kt-audit-", suffix=".so") as tmp:
        spool.seek(0)
        shutil.copyfileobj(spool, tmp, _CHUNK)
        tmp.flush()
        try:
            sass, ptx = list_archs(tool, Path(tmp.name))
            arch_bytes = list_arch_bytes(tool, Path(tmp.name))
        except ValueError as exc:
            return CudaListing(name, fatbin_bytes, (), (), (), str(exc))
    return CudaListing(name, fatbin_bytes, tuple(sorted(sass)), tuple(sorted(ptx)), tuple(sorted(arch_bytes.items())))
