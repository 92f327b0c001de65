"""A bounded tar stream reader for the nested archives the audit opens (kt-kernel's tar.xz, the
release's zstd payload): headers in whole 512-byte blocks from any decompressor, PAX extended
headers split by their length-prefixed records (POSIX pax: "%d %s=%s\\n"; never by line breaks:
a name may hold one), GNU long names, and every size checked before anything is read.

The runtime (kt_kernel.payload) reads the same way and refuses what this reader reports, so the
audit and the first use never disagree about an archive (tests/unit/test_tar_rules.py runs one
set of hostile archives through both). tarfile's own reader is not used: it reads a PAX header of
any declared size into memory and accepts a negative size."""

from __future__ import annotations

import re
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

BLOCK = tarfile.BLOCKSIZE
MAX_HEADER_BYTES = 1 << 20  # a PAX record set or GNU long name larger than this is refused
_RECORD = re.compile(rb"([0-9]+) ")


class TarFormatError(ValueError):
    """The stream is no tar this reader accepts; the message says where and why."""


@dataclass(frozen=True)
class TarEntry:
    """One member's header: its name (PAX path or GNU long name applied), kind, size and link."""

    name: str
    kind: str  # "file", "dir", "link", "special"
    size: int
    linkname: str = ""


def pax_records(data: bytes) -> dict[str, str]:
    """The records of a PAX extended header: each is "<length> <key>=<value>\\n", the length
    counting the whole record in bytes. A malformed record is a TarFormatError."""
    out: dict[str, str] = {}
    pos = 0
    while pos < len(data):
        if data[pos:].strip(b"\0") == b"":
            break  # padding after the last record
        m = _RECORD.match(data, pos)
        if m is None or int(m.group(1)) < len(m.group(0)) + 2:
            raise TarFormatError(f"PAX header: malformed record at byte {pos}")
        end = pos + int(m.group(1))
        record = data[m.end() : end]
        if end > len(data) or not record.endswith(b"\n") or b"=" not in record:
            raise TarFormatError(f"PAX header: record at byte {pos} is cut or has no key=value")
        key, _, value = record[:-1].partition(b"=")
        out[key.decode("utf-8", "surrogateescape")] = value.decode("utf-8", "surrogateescape")
        pos = end
    return out


def _kind(info: tarfile.TarInfo) -> str:
    if info.isfile():
        return "file"
    if info.isdir():
        return "dir"
    if info.issym() or info.islnk():
        return "link"
    return "special"


class TarStream:
    """Iterate the entries of a tar stream; `read` gives the current file's bytes (never past its
    size), and the rest of an entry is skipped before the next header."""

    def __init__(self, raw: Any) -> None:
        self._raw = raw
        self._left = 0  # bytes of the current entry's data not yet read
        self._pad = 0
        self.offset = 0  # bytes consumed from the stream

    def _exact(self, n: int) -> bytes:
        parts = []
        need = n
        while need:
            chunk = self._raw.read(min(need, 1 << 20))
            if not chunk:
                raise TarFormatError(f"the archive ends inside an entry (byte {self.offset}, {need} bytes short)")
            parts.append(bytes(chunk))
            need -= len(chunk)
            self.offset += len(chunk)
        return b"".join(parts)

    def _header_data(self, info: tarfile.TarInfo, what: str) -> bytes:
        if info.size > MAX_HEADER_BYTES:
            raise TarFormatError(f"{what} of {info.size} bytes at byte {self.offset}, over the {MAX_HEADER_BYTES}")
        return self._exact(info.size + (-info.size % BLOCK))[: info.size]

    def read(self, n: int) -> bytes:
        """Up to `n` bytes of the current file's data (b"" at its end)."""
        n = min(n, self._left)
        if n <= 0:
            return b""
        data = self._exact(n)
        self._left -= n
        return data

    def _skip(self) -> None:
        while self._left:
            self.read(1 << 20)
        self._exact(self._pad)
        self._pad = 0

    def __iter__(self) -> Iterator[TarEntry]:
        pax: dict[str, str] = {}
        longname = longlink = ""
        while True:
            self._skip()
            block = self._exact(BLOCK)
            if block == bytes(BLOCK):
                return
            try:
                info = tarfile.TarInfo.frombuf(block, "utf-8", "surrogateescape")
            except tarfile.HeaderError as exc:
                raise TarFormatError(f"bad tar header at byte {self.offset - BLOCK}: {exc}") from None
            if info.size < 0:
                raise TarFormatError(f"tar header at byte {self.offset - BLOCK} declares a negative size")
            if info.type in (tarfile.XHDTYPE, tarfile.XGLTYPE):
                records = pax_records(self._header_data(info, "PAX header"))
                if info.type == tarfile.XHDTYPE:
                    pax = records
                continue
            if info.type in (tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK):
                text = self._header_data(info, "GNU long name").rstrip(b"\0").decode("utf-8", "surrogateescape")
                longname, longlink = (text, longlink) if info.type == tarfile.GNUTYPE_LONGNAME else (longname, text)
                continue
            name = pax.get("path") or longname or info.name
            linkname = pax.get("linkpath") or longlink or info.linkname
            size = info.size
            if "size" in pax:
                if not pax["size"].isdigit():
                    raise TarFormatError(f"PAX size {pax['size']!r} of {name!r} is not a byte count")
                size = int(pax["size"])
            pax, longname, longlink = {}, "", ""
            kind = _kind(info)
            has_data = kind == "file" or info.type not in (tarfile.SYMTYPE, tarfile.LNKTYPE, tarfile.DIRTYPE)
            self._left = size if has_data else 0
            self._pad = -self._left % BLOCK
            yield TarEntry(name, kind, size, linkname)
