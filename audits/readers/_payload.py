"""Reader for the release's lazy CUDA archive: what each wheel carries of it, and
the archive itself, streamed out of the wheels' part members in the manifest's
order through zstd and tar. Every file is spooled to a temporary file, hashed,
and read for ELF facts and (cuobjdump) its cubins/PTX, then deleted: the archive
is never held in memory or written out whole."""

from __future__ import annotations

import hashlib
import io
import tempfile
import zipfile
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from email.parser import HeaderParser
from pathlib import Path
from typing import Any

from ._cuda import CudaFacts, list_archs, read_cuda
from ._elf import ElfFacts, is_elf, read_elf_stream
from ._json import PAYLOAD_MANIFEST, load
from ._tar import BLOCK, TarFormatError, TarStream
from ._wheel import ARCHIVE_ERRORS, MEMBER_ERRORS, WheelFacts

PART_DIR = "/_kt_payload/"
_CHUNK = 1 << 20


@dataclass(frozen=True)
class PartMember:
    """One archive part member of a wheel: its path, size and sha256."""

    name: str
    size: int
    sha256: str


@dataclass(frozen=True)
class WheelSummary:
    """What the release-level payload rules need of one wheel."""

    path: Path
    filename: str
    name: str
    version: str
    tags: tuple[str, ...]
    requires: tuple[str, ...]
    parts: tuple[PartMember, ...]
    manifest: dict[str, Any] | None
    manifest_error: str
    largest: tuple[tuple[str, int], ...]


def summarize(w: WheelFacts, manifest_member: str) -> WheelSummary:
    """What the release-level payload rules need of one wheel (parts, manifest, requirements)."""
    parts = tuple(PartMember(m.name, m.size, m.sha256) for m in w.members if PART_DIR in f"/{m.name}")
    manifest, error = None, ""
    member = w.member(manifest_member)
    if member is not None:
        manifest, problem = load(member.data or b"", PAYLOAD_MANIFEST)
        error = f"{manifest_member}: {problem}" if problem else ""
    meta = w.text(f"{w.dist_info}/METADATA") or ""
    requires = tuple(HeaderParser().parsestr(meta).get_all("Requires-Dist", []))
    largest = tuple(sorted(((m.name, m.size) for m in w.members), key=lambda x: -x[1])[:3])
    return WheelSummary(
        w.path,
        w.filename,
        str(w.name),
        str(w.version),
        tuple(sorted(str(t) for t in w.tags)),
        requires,
        parts,
        manifest,
        error,
        largest,
    )


@dataclass(frozen=True)
class ArchivedFile:
    """One file of the release's CUDA archive, read while streaming: hashes, ELF and cuobjdump facts."""

    path: str
    kind: str  # "file", "dir", "link", "special"
    size: int
    sha256: str
    linkname: str = ""
    elf: ElfFacts | None = None
    elf_error: str = ""
    sass: frozenset[str] = frozenset()
    ptx: frozenset[str] = frozenset()
    cuda: CudaFacts | None = None  # full cuobjdump facts, for the libraries the policy details
    cuda_error: str = ""  # what cuobjdump said when it could not read the file


@dataclass(frozen=True)
class ArchiveFacts:
    """The release's CUDA archive streamed out of its parts: size, sha256, files, errors."""

    size: int
    sha256: str
    error: str  # "" when the stream decompressed and untarred to its end
    files: tuple[ArchivedFile, ...]
    cuda_inspected: bool


class _Chain(io.RawIOBase):
    """Part members of several wheels read in order as one stream, hashed as they pass."""

    def __init__(self, parts: list[tuple[Path, str]]) -> None:
        self._todo = list(parts)
        self._zip: zipfile.ZipFile | None = None
        self._fh: Any = None
        self.hash = hashlib.sha256()
        self.size = 0
        self.error = ""  # the first part member that could not be read, and why

    def readable(self) -> bool:
        return True

    def _advance(self) -> bool:
        if self._fh is not None:
            self._fh.close()
            assert self._zip is not None
            self._zip.close()
            self._fh = self._zip = None
        if not self._todo:
            return False
        wheel, member = self._todo.pop(0)
        try:
            self._zip = zipfile.ZipFile(wheel)
            self._fh = self._zip.open(member)
        except ARCHIVE_ERRORS as exc:
            self._fail(wheel, member, exc)
        return True

    def _fail(self, wheel: Path, member: str, exc: BaseException) -> None:
        """A part that cannot be read ends the stream there (the archive is then short)."""
        self.error = self.error or f"{wheel.name}!{member}: cannot read the part: {type(exc).__name__}: {exc}"
        self._todo.clear()
        if self._zip is not None:
            self._zip.close()
        self._fh = self._zip = None

    def readinto(self, buf: Any) -> int:
        while True:
            if self._fh is not None:
                try:
                    data = self._fh.read(len(buf))
                except MEMBER_ERRORS as exc:
                    assert self._zip is not None
                    self._fail(Path(str(self._zip.filename)), self._fh.name, exc)
                    return 0
                if data:
                    n = len(data)
                    buf[:n] = data
                    self.hash.update(data)
                    self.size += n
                    return n
            if not self._advance():
                return 0

    def drain(self) -> None:
        while self.readinto(bytearray(_CHUNK)):
            pass


# tar's own bytes per archived file at most (header, PAX header and its records, padding), and at its end
_TAR_OVERHEAD, _TAR_END = 4 * BLOCK, 20 * BLOCK


def read_archive(
    parts: list[tuple[Path, str]],
    window_log: int,
    tool: str | None,
    detailed: Collection[str] = (),
    declared: Mapping[str, int] | None = None,
    max_bytes: int = 16 << 30,
) -> ArchiveFacts:
    """Stream the archive; `detailed`: archive paths whose full cuobjdump facts are wanted.

    Bounded by what the manifest declares (`declared`: path -> size): a file is read only when its
    header's size is the declared one (any other is listed unread, and the payload rules report
    it), and the stream is refused once it unpacks past the declared files plus tar's overhead
    (or `max_bytes`, the policy's archive_max_mib), so a small part can never fill the temp disk."""
    import zstandard

    chain = _Chain(parts)
    files: list[ArchivedFile] = []
    error = ""
    sizes = dict(declared or {})
    cap = min(max_bytes, sum(sizes.values()) + _TAR_OVERHEAD * (len(sizes) + 8) + _TAR_END) if declared else max_bytes
    try:
        dctx = zstandard.ZstdDecompressor(max_window_size=1 << max(window_log, 10))
        with dctx.stream_reader(chain, read_size=_CHUNK, read_across_frames=True, closefd=False) as raw:
            stream = TarStream(raw)
            for e in stream:
                if stream.offset + (e.size if e.kind == "file" else 0) > cap:
                    raise TarFormatError(
                        f"{e.name!r} declares {e.size} bytes at byte {stream.offset}: the archive would unpack past "
                        f"{cap} bytes, more than its manifest declares"
                    )
                if e.kind != "file" or (declared is not None and sizes.get(e.name) != e.size):
                    files.append(ArchivedFile(e.name, e.kind, e.size, "", e.linkname))
                    continue
                files.append(_spool(e.name, stream, tool, e.name in detailed))
            rest = 0
            while chunk := raw.read(_CHUNK):
                rest += len(chunk)
                if rest > _TAR_END:
                    raise TarFormatError(f"{rest} bytes follow the end of the tar archive")
    except (zstandard.ZstdError, EOFError, OSError, ValueError) as exc:  # TarFormatError is a ValueError
        error = f"{type(exc).__name__}: {exc}"
    chain.drain()
    return ArchiveFacts(chain.size, chain.hash.hexdigest(), chain.error or error, tuple(files), tool is not None)


def _spool(name: str, src: Any, tool: str | None, detailed: bool) -> ArchivedFile:
    h = hashlib.sha256()
    size = 0
    with tempfile.NamedTemporaryFile(prefix="kt-audit-", suffix=".so") as tmp:
        while chunk := src.read(_CHUNK):  # a TarStream stops at the entry's size
            h.update(chunk)
            tmp.write(chunk)
            size += len(chunk)
        tmp.flush()
        tmp.seek(0)
        elf, elf_error = None, ""
        sass: frozenset[str] = frozenset()
        ptx: frozenset[str] = frozenset()
        cuda = None
        cuda_error = ""
        if is_elf(tmp.read(4)):
            tmp.seek(0)
            try:
                elf = read_elf_stream(f"payload!{name}", tmp, code=False)  # type: ignore[arg-type]
            except ValueError as exc:
                elf_error = str(exc)
            try:
                if tool is not None and detailed:
                    cuda = read_cuda(tool, Path(tmp.name).read_bytes())
                    sass, ptx = cuda.sass, cuda.ptx
                elif tool is not None:
                    sass, ptx = list_archs(tool, Path(tmp.name))
            except ValueError as exc:
                cuda_error = str(exc)
    return ArchivedFile(
        name,
        "file",
        size,
        h.hexdigest(),
        elf=elf,
        elf_error=elf_error,
        sass=sass,
        ptx=ptx,
        cuda=cuda,
        cuda_error=cuda_error,
    )
