"""The release's lazy CUDA archive: verified, extracted on first use, cached.

A KT release carries its large CUDA binaries (sgl_kernel's kernels and kt-kernel's
own libkt_cuda*.so) in one zstd-compressed tar, cut into parts that ride in the
five carrier wheels. The manifest (``sgl_kernel/_kt_payload.json`` in the
sglang-kernel-kt wheel; schema in audits/schemas/payload-manifest.schema.json)
names every part (distribution, version, member, size, sha256) and every file.

``materialize()`` finds each part through ``importlib.metadata`` (never by
guessing paths), checks the installed versions, and streams the parts in order
through hashing, decompression and extraction (no concatenated temp archive),
into ``$KT_KERNEL_CACHE_DIR/<archive sha256>/`` (else
``$XDG_CACHE_HOME/kt-kernel/payload/``), keeping wheel-relative paths so
``$ORIGIN`` RPATHs and the sm90/ vs sm100/ loader work. Extraction is atomic
(temp dir + rename), serialised across processes (flock), verified file by
file; the warm path only stats files. Command line::

    python -m kt_kernel.payload materialize   # extract + verify, print the directory
    python -m kt_kernel.payload verify        # re-hash every extracted file
    python -m kt_kernel.payload where         # print the directory; exit 1 if absent
    python -m kt_kernel.payload prune         # remove other releases' entries (never one in use)

The cache belongs to its user, as ssh's and gpg's directories do: a cache root or entry that
another user owns, that others can write, or that is a symbolic link is refused with the fix
(never loaded from), and the lock and log files are opened without following links. The tar
stream is read by the same rules as the audit's (audits/readers/_tar.py): headers and PAX
records bounded, PAX split by its length-prefixed records, and every file's size compared with
the manifest before a byte of it is written.
"""

from __future__ import annotations

import argparse
import errno
import fcntl
import hashlib
import io
import json
import os
import posixpath
import queue
import re
import shutil
import stat
import sys
import tarfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import metadata, util
from pathlib import Path
from typing import Any

try:
    from ._cpu import KTKernelError
except ImportError:  # loaded as a lone file by tests/unit: same behaviour, no native package needed

    class KTKernelError(Exception):  # type: ignore[no-redef]
        """kt_kernel's error root."""


SCHEMA_VERSION = 1
CACHE_ENV = "KT_KERNEL_CACHE_DIR"
MANIFEST_PACKAGE = "sgl_kernel"
MANIFEST_NAME = "_kt_payload.json"
COMPLETE = ".complete"
# Test hook: exit abruptly after extracting this many files (crash-recovery tests).
_CRASH_ENV = "KT_KERNEL_TEST_CRASH_AFTER_MEMBERS"
_CHUNK = 4 << 20
_WRITE = 1 << 20  # the most one write() of an extracted file takes (_Sink._write says why)
# The largest zstd window this kt-kernel decompresses with (the audit policy's [payload]
# zstd_window_log; tests/unit/test_tar_rules.py holds them equal): 2**27 = 128 MiB of memory.
MAX_WINDOW_LOG = 27
MAX_HEADER_BYTES = 1 << 20  # a PAX record set or GNU long name larger than this is refused
_PAX_RECORD = re.compile(rb"([0-9]+) ")
# What a full, failing or forbidding disk raises while the cache is written: a PayloadError then.
_DISK_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EACCES, errno.EPERM, errno.EROFS}
_SERVE_HINT = "ktransformers[serve]"


class PayloadError(KTKernelError):
    """The CUDA payload cannot be materialized; the message names the cause and the fix."""


@dataclass(frozen=True)
class Part:
    """One part of the lazy CUDA archive: the carrier wheel that holds it, its member, size and sha256."""

    index: int
    distribution: str
    version: str
    member: str
    size: int
    sha256: str

    def label(self, total: int) -> str:
        return f"part {self.index}/{total} ({self.distribution} {self.version}, {self.member})"


@dataclass(frozen=True)
class Manifest:
    """The lazy CUDA archive's manifest: the archive's hash, size, compression and its parts."""

    path: Path
    release: str
    sha256: str
    size: int
    compression: str
    window_log: int
    parts: tuple[Part, ...]
    files: dict[str, dict[str, Any]]

    @property
    def extracted_size(self) -> int:
        return sum(int(f["size"]) for f in self.files.values())

    def install_hint(self) -> str:
        pins = " ".join(f"{p.distribution}=={p.version}" for p in self.parts)
        return f"pip install {pins} (or {_SERVE_HINT}=={self.release})"


def find_manifest() -> Path:
    """The installed manifest, found beside sgl_kernel without importing it."""
    spec = util.find_spec(MANIFEST_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise PayloadError(
            f"{MANIFEST_PACKAGE} is not installed, so the release's CUDA payload manifest is missing; "
            f"install sglang-kernel-kt (pip install {_SERVE_HINT})"
        )
    for location in spec.submodule_search_locations:
        candidate = Path(location) / MANIFEST_NAME
        if candidate.is_file():
            return candidate
    where = ", ".join(spec.submodule_search_locations)
    raise PayloadError(
        f"{where}: this {MANIFEST_PACKAGE} has no {MANIFEST_NAME}; it is upstream sglang-kernel, not the KT build. "
        f"pip uninstall sglang-kernel, then pip install {_SERVE_HINT}"
    )


def _field(obj: Any, key: str, kind: type, where: str) -> Any:
    """obj[key], which must be a `kind` (bool is no int); ValueError naming where and what otherwise."""
    if not isinstance(obj, dict):
        raise ValueError(f"{where} is a JSON {type(obj).__name__}, not an object")
    if key not in obj:
        raise ValueError(f"{where} has no {key!r}")
    value = obj[key]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ValueError(f"{where}.{key} is {value!r}, not a {kind.__name__}")
    return value


def _files(data: Any, fix: str) -> dict[str, dict[str, Any]]:
    """The manifest's files: each name inside the archive root, each entry an object with an integer
    size and a sha256, and no name both a file and a directory of another (`a` and `a/b`)."""
    files = _field(data, "files", dict, "the manifest")
    out: dict[str, dict[str, Any]] = {}
    for name, entry in files.items():
        where = f"files[{name!r}]"
        size, sha = _field(entry, "size", int, where), _field(entry, "sha256", str, where)
        if size < 0:
            raise ValueError(f"{where}.size is negative")
        norm = safe_member_name(name, "CUDA payload manifest", fix)
        if norm in out:
            raise ValueError(f"{where} names the file {norm!r} twice")
        out[norm] = {**entry, "size": size, "sha256": sha}
    for name in out:
        parent = posixpath.dirname(name)
        while parent:
            if parent in out:
                raise ValueError(
                    f"{parent!r} is a file and also the directory of {name!r}: both cannot exist in the cache"
                )
            parent = posixpath.dirname(parent)
    return out


def load_manifest(path: Path | None = None) -> Manifest:
    """The manifest at `path` (default: the installed one), validated shape by shape; PayloadError naming
    the file, what is wrong and the fix otherwise (never another exception)."""
    path = path or find_manifest()
    fix = "reinstall sglang-kernel-kt"
    try:
        data = json.loads(path.read_text())
        if _field(data, "schema_version", int, "the manifest") != SCHEMA_VERSION:
            raise ValueError(f"schema_version {data['schema_version']!r}, this kt-kernel reads {SCHEMA_VERSION}")
        archive = _field(data, "archive", dict, "the manifest")
        parts = []
        for i, p in enumerate(_field(data, "parts", list, "the manifest")):
            where = f"parts[{i}]"
            parts.append(
                Part(
                    _field(p, "index", int, where),
                    _field(p, "distribution", str, where),
                    _field(p, "version", str, where),
                    _field(p, "member", str, where),
                    _field(p, "size", int, where),
                    _field(p, "sha256", str, where),
                )
            )
        window = archive.get("window_log", 27)
        if not isinstance(window, int) or isinstance(window, bool):
            raise ValueError(f"archive.window_log is {window!r}, not an int")
        return Manifest(
            path,
            _field(data, "release", str, "the manifest"),
            _field(archive, "sha256", str, "archive"),
            _field(archive, "size", int, "archive"),
            _field(archive, "compression", str, "archive"),
            window,
            tuple(parts),
            _files(data, fix),
        )
    except (OSError, ValueError, RecursionError) as exc:
        raise PayloadError(f"{path}: unreadable CUDA payload manifest ({exc}); {fix}") from None


def cache_root(kind: str = "payload") -> Path:
    """$KT_KERNEL_CACHE_DIR, else $XDG_CACHE_HOME/kt-kernel/KIND (~/.cache when XDG_CACHE_HOME is
    unset); always absolute (a relative variable is taken against the working directory, once:
    a later chdir cannot move the cache)."""
    env = os.environ.get(CACHE_ENV)
    if env:
        return _absolute(env)
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return _absolute(xdg) / "kt-kernel" / kind


_ABSOLUTE: dict[str, Path] = {}


def _absolute(value: str) -> Path:
    if value not in _ABSOLUTE:
        _ABSOLUTE[value] = Path(value).absolute()
    return _ABSOLUTE[value]


def check_owned(path: Path, what: str, error: type[KTKernelError] = KTKernelError) -> None:
    """`path` (a cache root or entry) is a real directory of this user that nobody else can write;
    else `error` saying which and how to fix it. A missing path is fine (it will be made)."""
    try:
        st = path.lstat()
    except (FileNotFoundError, NotADirectoryError):  # made later (or refused then, with the reason)
        return
    except OSError as exc:
        raise error(
            f"cannot inspect the {what} {path}: {exc.strerror}; set {CACHE_ENV} to a directory of your own"
        ) from None
    fix = f"remove it, or set {CACHE_ENV} to a directory of your own"
    if stat.S_ISLNK(st.st_mode):
        raise error(f"the {what} {path} is a symbolic link; kt-kernel never loads code through one. {fix}")
    if not stat.S_ISDIR(st.st_mode):
        raise error(f"the {what} {path} is not a directory; {fix}")
    if st.st_uid != os.getuid():
        raise error(
            f"the {what} {path} belongs to uid {st.st_uid}, not to you (uid {os.getuid()}): libraries from a "
            f"directory another user controls are never loaded. {fix}"
        )
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise error(
            f"the {what} {path} is writable by others (mode {stat.S_IMODE(st.st_mode):o}): anyone could swap its "
            f"libraries. chmod go-w {path}, or {fix}"
        )


def _open_private(path: Path, flags: int, error: type[KTKernelError]) -> int:
    """Open (creating, mode 0600) a file of the cache without following a symbolic link."""
    try:
        fd = os.open(path, flags | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        why = "is a symbolic link" if exc.errno == errno.ELOOP else exc.strerror
        raise error(f"cannot open {path}: {why}; remove it, or set {CACHE_ENV} to a directory of your own") from None
    st = os.fstat(fd)
    if st.st_uid != os.getuid() or not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise error(f"{path} belongs to uid {st.st_uid} or is no regular file; remove it, or set {CACHE_ENV}")
    return fd


@contextmanager
def locked(path: Path, error: type[KTKernelError] = KTKernelError) -> Iterator[None]:
    """An exclusive flock on `path` (created if needed, never through a link), held for the block."""
    fd = _open_private(path, os.O_RDWR, error)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def safe_member_name(name: str, where: object, fix: str) -> str:
    """`name` normalised; an absolute path or one that climbs out of the root is an error."""
    norm = posixpath.normpath(name)
    if name.startswith("/") or norm == ".." or norm.startswith("../") or "/../" in f"/{name}/":
        raise PayloadError(f"corrupted {where}: member {name!r} points outside the archive root; {fix}")
    return norm


def locate_parts(m: Manifest) -> list[tuple[Part, Path]]:
    """Each part's installed file, through the distributions' metadata; versions checked."""
    n = len(m.parts)
    missing: list[Part] = []
    found: list[tuple[Part, Path]] = []
    for part in m.parts:
        try:
            dist = metadata.distribution(part.distribution)
        except metadata.PackageNotFoundError:
            missing.append(part)
            continue
        if dist.version != part.version:
            raise PayloadError(
                f"the CUDA payload's parts come from two releases: {m.path} is release {m.release} and wants "
                f"{part.distribution}=={part.version}, but {part.distribution} {dist.version} is installed. "
                f"Install the same release everywhere: {m.install_hint()}"
            )
        path = Path(str(dist.locate_file(part.member)))
        if not path.is_file():
            raise PayloadError(
                f"{part.label(n)} is missing: {path} does not exist although {part.distribution} "
                f"{dist.version} is installed; pip install --force-reinstall "
                f"{part.distribution}=={part.version}"
            )
        size = path.stat().st_size
        if size != part.size:
            raise PayloadError(
                f"corrupted {part.label(n)}: {path} is {size} bytes, the manifest says {part.size}; "
                f"pip install --force-reinstall {part.distribution}=={part.version}"
            )
        found.append((part, path))
    if missing:
        names = ", ".join(f"{p.distribution}=={p.version} (part {p.index}/{n})" for p in missing)
        raise PayloadError(
            f"the CUDA payload is incomplete: {names} not installed. Install "
            f"{' '.join(f'{p.distribution}=={p.version}' for p in missing)}, or {_SERVE_HINT}"
            f"=={m.release}"
        )
    return found


class _PartStream(io.RawIOBase):
    """The parts read in order as one stream; each part's sha256 is checked as its bytes go
    by. Nothing is concatenated on disk."""

    def __init__(self, m: Manifest, parts: list[tuple[Part, Path]]) -> None:
        self._m = m
        self._parts = parts
        self._i = -1
        self._fh: io.BufferedReader | None = None
        self._part_hash = hashlib.sha256()
        self.total = 0
        self._next()

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None
        super().close()

    def _next(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None
            part, path = self._parts[self._i]
            if self._part_hash.hexdigest() != part.sha256:
                raise PayloadError(
                    f"corrupted {part.label(len(self._parts))}: {path} has sha256 "
                    f"{self._part_hash.hexdigest()}, the manifest says {part.sha256}; "
                    f"pip install --force-reinstall {part.distribution}=={part.version}"
                )
        self._i += 1
        self._fh = self._parts[self._i][1].open("rb") if self._i < len(self._parts) else None
        self._part_hash = hashlib.sha256()

    def readable(self) -> bool:
        return True

    def drain(self) -> None:
        """Read (and so verify) the rest of the parts: a corrupted part is named by its own error."""
        buf = bytearray(_CHUNK)
        while self.readinto(buf):
            pass

    def readinto(self, buf: Any) -> int:
        while self._fh is not None:
            n = self._fh.readinto(buf)
            if n:
                self._part_hash.update(memoryview(buf)[:n])
                self.total += n
                return n
            self._next()
        return 0


def _extract_stream(m: Manifest, parts: list[tuple[Part, Path]], tmp: Path) -> None:
    try:
        import zstandard  # noqa: F401 - checked here, used by _untar
    except ImportError:
        raise PayloadError(
            f"the zstandard module is missing; it comes with sglang-kernel-kt: pip install {_SERVE_HINT}"
        ) from None
    if m.compression != "zstd":
        raise PayloadError(f"{m.path}: compression {m.compression!r} is unknown to this kt-kernel; upgrade kt-kernel")
    fix = f"reinstall the release ({m.install_hint()})"
    stream = _PartStream(m, parts)
    try:
        _untar(m, stream, tmp, fix)
    finally:
        stream.close()


class _Sink:
    """One file's chunks hashed and written on two threads while the caller decompresses the
    next chunk: zstd, sha256 and write() all release the GIL, so the three overlap."""

    def __init__(self, path: Path) -> None:
        self._hash = hashlib.sha256()
        self._fh = path.open("wb")
        self._errors: list[BaseException] = []
        self._queues: list[queue.Queue[bytes | None]] = [queue.Queue(maxsize=4), queue.Queue(maxsize=4)]
        self._threads = [
            threading.Thread(target=self._run, args=(q, fn), daemon=True)
            for q, fn in zip(self._queues, (self._hash.update, self._write), strict=True)
        ]
        for t in self._threads:
            t.start()

    def _run(self, q: queue.Queue[bytes | None], fn: Callable[[bytes], object]) -> None:
        while (chunk := q.get()) is not None:
            if not self._errors:
                try:
                    fn(chunk)
                except BaseException as exc:
                    self._errors.append(exc)

    def _write(self, chunk: bytes) -> None:
        # At most _WRITE bytes a call: a write of 2 MiB or more lets the kernel's page cache take a
        # 2 MiB folio, and on a virtual machine those cost the kernel 2-3 s more for our 1.1 GiB
        # (measured: 1 MiB writes 0.4 s of kernel time, 2 MiB writes 3.0 s; zstd writes 128 KiB).
        view = memoryview(chunk)
        for start in range(0, len(view), _WRITE):
            self._fh.write(view[start : start + _WRITE])

    def put(self, chunk: bytes) -> None:
        for q in self._queues:
            q.put(chunk)

    def close(self) -> str:
        """Wait for both threads; the file's sha256 (or the first error either thread met)."""
        for q in self._queues:
            q.put(None)
        for t in self._threads:
            t.join()
        self._fh.close()
        if self._errors:
            raise self._errors[0]
        return self._hash.hexdigest()


def _read_exact(raw: Any, n: int) -> bytes:
    data = raw.read(n)
    while len(data) < n:
        more = raw.read(n - len(data))
        if not more:
            raise EOFError(f"the archive ends inside a member ({len(data)} of {n} bytes)")
        data += more
    return bytes(data)


def pax_records(data: bytes) -> dict[str, str]:
    """The records of a PAX extended header, each "<length> <key>=<value>\\n" with the length
    counting the whole record (POSIX pax); never split on line breaks, which a name may hold."""
    out: dict[str, str] = {}
    pos = 0
    while pos < len(data) and data[pos:].strip(b"\0"):
        m = _PAX_RECORD.match(data, pos)
        if m is None or int(m.group(1)) < len(m.group(0)) + 2:
            raise tarfile.HeaderError(f"PAX header: malformed record at byte {pos}")
        end = pos + int(m.group(1))
        record = data[m.end() : end]
        if end > len(data) or not record.endswith(b"\n") or b"=" not in record:
            raise tarfile.HeaderError(f"PAX header: record at byte {pos} is cut or has no key=value")
        key, _, value = record[:-1].partition(b"=")
        out[key.decode("utf-8", "surrogateescape")] = value.decode("utf-8", "surrogateescape")
        pos = end
    return out


def _header_data(raw: Any, info: tarfile.TarInfo, what: str) -> bytes:
    if not 0 <= info.size <= MAX_HEADER_BYTES:
        raise tarfile.HeaderError(f"a {what} of {info.size} bytes (at most {MAX_HEADER_BYTES})")
    return _read_exact(raw, info.size + (-info.size % tarfile.BLOCKSIZE))[: info.size]


def _tar_members(raw: Any) -> Iterator[tarfile.TarInfo]:
    """The headers of a tar stream read in whole blocks straight from the decompressor (tarfile's
    stream mode copies every byte several times and reads a PAX header of any size). The caller
    reads each member's data. PAX path and size, and GNU long names, are honoured."""
    pax: dict[str, str] = {}
    longname = ""
    while True:
        block = _read_exact(raw, tarfile.BLOCKSIZE)
        if block == bytes(tarfile.BLOCKSIZE):
            return
        info = tarfile.TarInfo.frombuf(block, "utf-8", "surrogateescape")
        if info.size < 0:
            raise tarfile.HeaderError(f"member {info.name!r} declares a negative size")
        if info.type in (tarfile.XHDTYPE, tarfile.XGLTYPE):
            records = pax_records(_header_data(raw, info, "PAX header"))
            pax = records if info.type == tarfile.XHDTYPE else pax
            continue
        if info.type in (tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK):
            text = _header_data(raw, info, "GNU long name").rstrip(b"\0").decode("utf-8", "surrogateescape")
            longname = text if info.type == tarfile.GNUTYPE_LONGNAME else longname
            continue
        info.name = pax.get("path") or longname or info.name
        if "size" in pax:
            if not pax["size"].isdigit():
                raise tarfile.HeaderError(f"PAX size {pax['size']!r} of {info.name!r} is not a byte count")
            info.size = int(pax["size"])
        pax, longname = {}, ""
        yield info


def _crash_after() -> int:
    """The crash-test hook: exit after this many members (0: never); PayloadError for a non-integer."""
    value = os.environ.get(_CRASH_ENV, "").strip() or "0"
    try:
        return int(value)
    except ValueError:
        raise PayloadError(f"{_CRASH_ENV}={value!r} is not an integer (a test hook); unset it") from None


def _untar(m: Manifest, stream: _PartStream, tmp: Path, fix: str) -> None:
    import zstandard

    crash_after = _crash_after()
    if not 10 <= m.window_log <= MAX_WINDOW_LOG:
        raise PayloadError(
            f"{m.path}: window_log {m.window_log} needs a {2**m.window_log / 2**20:.0f} MiB window, over this "
            f"kt-kernel's {2**MAX_WINDOW_LOG / 2**20:.0f} MiB; {fix}"
        )
    dctx = zstandard.ZstdDecompressor(max_window_size=1 << m.window_log)
    seen: set[str] = set()
    try:
        with dctx.stream_reader(stream, read_size=_CHUNK, read_across_frames=True, closefd=False) as raw:
            for info in _tar_members(raw):
                name = safe_member_name(info.name, "CUDA payload", fix)
                if info.isdir():
                    continue
                if not info.isfile():
                    kind = "a link" if info.issym() or info.islnk() else "a special file"
                    raise PayloadError(f"corrupted CUDA payload: member {name!r} is {kind}; {fix}")
                expected = m.files.get(name)
                if expected is None or name in seen:
                    why = "is not in the manifest" if expected is None else "appears twice"
                    raise PayloadError(f"corrupted CUDA payload: member {name!r} {why}; {fix}")
                if info.size != int(expected["size"]):  # before a byte is written: never past the declared size
                    raise PayloadError(
                        f"corrupted CUDA payload: {name} is {info.size} bytes in the archive, the manifest says "
                        f"{expected['size']}; {fix}"
                    )
                out = tmp / name
                out.parent.mkdir(parents=True, exist_ok=True)
                sink = _Sink(out)
                try:
                    left = info.size
                    while left:
                        chunk = _read_exact(raw, min(left, _CHUNK))
                        sink.put(chunk)
                        left -= len(chunk)
                finally:
                    digest = sink.close()
                _read_exact(raw, -info.size % tarfile.BLOCKSIZE)
                if digest != expected["sha256"]:
                    raise PayloadError(
                        f"corrupted CUDA payload: {name} has sha256 {digest} ({info.size} "
                        f"bytes), the manifest says {expected['sha256']} ({expected['size']}); {fix}"
                    )
                out.chmod(0o755)
                seen.add(name)
                if crash_after and len(seen) >= crash_after:
                    os._exit(70)
            while raw.read(_CHUNK):  # the rest of the stream still has to be hashed
                pass
    except (tarfile.TarError, zstandard.ZstdError, EOFError, PayloadError) as exc:
        stream.drain()  # raises the precise error when a part's bytes are what is wrong
        if isinstance(exc, PayloadError):
            raise
        raise PayloadError(f"corrupted CUDA payload: the parts do not decompress ({exc}); {fix}") from None
    # Every part's sha256 was checked as it streamed by, in order: the archive they make is the
    # manifest's (the audit checks the whole archive's sha256 against the same manifest).
    if stream.total != m.size:
        raise PayloadError(
            f"corrupted CUDA payload: the parts make {stream.total} bytes, the manifest says {m.size}; {fix}"
        )
    missing = sorted(set(m.files) - seen)
    if missing:
        raise PayloadError(f"corrupted CUDA payload: {', '.join(missing)} missing from the archive; {fix}")


def is_complete(final: Path, sizes: dict[str, int | None], error: type[KTKernelError] = KTKernelError) -> bool:
    """The warm check (stat only, no hashing): `final` is this user's directory (else `error`), its
    marker exists, and every file is a regular file (no link) of its declared size (any size where
    none is declared: None)."""
    check_owned(final, "cache entry", error)
    try:
        marker = (final / COMPLETE).lstat()
        if not stat.S_ISREG(marker.st_mode):
            return False
        for name, size in sizes.items():
            st = (final / name).lstat()
            if not stat.S_ISREG(st.st_mode) or (size is not None and st.st_size != size):
                return False
    except OSError:
        return False
    return True


def _is_complete(final: Path, m: Manifest) -> bool:
    sizes: dict[str, int | None] = {name: int(f["size"]) for name, f in m.files.items()}
    return is_complete(final, sizes, PayloadError)


# Shared flocks on `<digest>.use`, held for the life of the process that materialized the entry:
# `prune` never removes an entry some process is using.
_IN_USE: dict[Path, int] = {}


def hold(root: Path, digest: str, error: type[KTKernelError] = KTKernelError) -> None:
    """Mark the entry in use by this process until it exits (a shared flock prune respects)."""
    path = root / f"{digest}.use"
    if path not in _IN_USE:
        fd = _open_private(path, os.O_RDWR, error)
        fcntl.flock(fd, fcntl.LOCK_SH)
        _IN_USE[path] = fd


def target_dir(m: Manifest, root: Path | None = None) -> Path:
    """The cache directory the archive with this manifest extracts into (named by its sha256)."""
    return (root or cache_root()) / m.sha256


def materialize(manifest: Path | Manifest | None = None, root: Path | None = None) -> Path:
    """The extracted payload's directory; extracts it first if no process has."""
    m = manifest if isinstance(manifest, Manifest) else load_manifest(manifest)
    root = root or cache_root()
    final = target_dir(m, root)
    check_owned(root, "CUDA payload cache", PayloadError)
    if _is_complete(final, m):
        hold(root, m.sha256, PayloadError)
        return final
    lock = lock_file(root, m.sha256, "CUDA payload cache", PayloadError)
    with locked(lock, PayloadError):
        if _is_complete(final, m):  # another process finished while we waited
            hold(root, m.sha256, PayloadError)
            return final
        parts = locate_parts(m)
        for stale in root.glob(f".tmp-{m.sha256}-*"):  # left by a crash mid-extraction
            shutil.rmtree(stale, ignore_errors=True)
        if final.exists():
            shutil.rmtree(final)
        free = shutil.disk_usage(root).free
        if free < m.extracted_size:
            raise PayloadError(
                f"not enough disk space in {root}: the CUDA payload needs "
                f"{m.extracted_size / 2**20:.0f} MiB, {free / 2**20:.0f} MiB are free; free space "
                f"or set {CACHE_ENV} to a larger disk"
            )
        need = f"{m.extracted_size / 2**20:.0f} MiB"
        done = install_atomically(root, m.sha256, lambda tmp: _extract_stream(m, parts, tmp), need, PayloadError)
        hold(root, m.sha256, PayloadError)
        return done


def lock_file(root: Path, digest: str, what: str, error: type[KTKernelError]) -> Path:
    """The lock file serialising extractions of `digest` under `root` (the root created 0700 and
    checked to be this user's); an unwritable cache is `error`, naming the directory and the
    variable that moves it."""
    try:
        root.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as exc:
        raise error(
            f"cannot write the {what} {root}: {exc.strerror}; set {CACHE_ENV} to a writable directory"
        ) from None
    check_owned(root, what, error)
    lock = root / f"{digest}.lock"
    os.close(_open_private(lock, os.O_RDWR, error))
    return lock


def install_atomically(
    root: Path,
    digest: str,
    fill: Callable[[Path], None],
    need: str = "",
    error: type[KTKernelError] = KTKernelError,
) -> Path:
    """`fill` a temporary directory under `root`, mark it complete and rename it to `root/digest`:
    readers see nothing or everything. Call with the digest's lock held; the extraction is logged.
    A full, failing or forbidding disk is `error` naming the directory, the need and the fix."""
    tmp = root / f".tmp-{digest}-{os.getpid()}"
    try:
        tmp.mkdir(mode=0o700)
        fill(tmp)
        (tmp / COMPLETE).write_text(digest + "\n")
        tmp.rename(root / digest)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if exc.errno not in _DISK_ERRNOS:
            raise
        needs = f" (it needs {need})" if need else ""
        raise error(
            f"cannot write the cache {root}: {exc.strerror}{needs}; free space or fix the directory's permissions, "
            f"or set {CACHE_ENV} to a writable disk with room"
        ) from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    fd = _open_private(root / "extractions.log", os.O_WRONLY | os.O_APPEND, error)
    with os.fdopen(fd, "a") as log:
        log.write(f"{digest} {os.getpid()}\n")
    return root / digest


def prune(keep: set[str], root: Path | None = None) -> list[str]:
    """Remove the entries under `root` whose digest is not in `keep`, and stale temporary
    directories, each under its lock and only when no process holds it in use; what was done."""
    root = root or cache_root()
    check_owned(root, "CUDA payload cache", PayloadError)
    if not root.is_dir():
        return []
    said = []
    for entry in sorted(root.iterdir()):
        name = entry.name
        digest = name.split("-")[1] if name.startswith(".tmp-") and name.count("-") >= 2 else name
        if not re.fullmatch(r"[0-9a-f]{64}", digest) or digest in keep or entry.is_symlink() or not entry.is_dir():
            continue
        lock_fd = _open_private(root / f"{digest}.lock", os.O_RDWR, PayloadError)
        use_fd = _open_private(root / f"{digest}.use", os.O_RDWR, PayloadError)
        try:
            try:
                fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                fcntl.flock(use_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                said.append(f"kept {entry}: in use by another process")
                continue
            size = sum(p.lstat().st_size for p in entry.rglob("*"))
            shutil.rmtree(entry)  # the .lock and .use files stay: a process may be opening them now
            said.append(f"removed {entry} ({size / 2**20:.1f} MiB)")
        finally:
            os.close(use_fd)
            os.close(lock_fd)
    return said


def verify(manifest: Path | Manifest | None = None, root: Path | None = None) -> list[str]:
    """Re-hash every extracted file; the problems found (empty: all match)."""
    m = manifest if isinstance(manifest, Manifest) else load_manifest(manifest)
    final = target_dir(m, root)
    check_owned(final, "cache entry", PayloadError)
    if not (final / COMPLETE).is_file():
        return [f"{final} is not materialized; run python -m kt_kernel.payload materialize"]
    problems = []
    for name, f in sorted(m.files.items()):
        h = hashlib.sha256()
        try:
            with (final / name).open("rb") as fh:
                while chunk := fh.read(_CHUNK):
                    h.update(chunk)
        except OSError as exc:
            problems.append(f"{final / name}: {exc.strerror}")
            continue
        if h.hexdigest() != f["sha256"]:
            problems.append(f"{final / name}: sha256 {h.hexdigest()}, the manifest says {f['sha256']}")
    return problems


def _prune_command(manifest: Path | None) -> int:
    try:
        m: Manifest | None = load_manifest(manifest)
    except PayloadError as exc:  # no release installed: every entry is another release's
        print(f"note: {exc}; keeping nothing", file=sys.stderr)
        m = None
    for line in prune({m.sha256} if m else set()):
        print(line)
    if m is not None:
        print(f"kept {target_dir(m)} (this release)" if target_dir(m).exists() else "nothing of this release cached")
    # kt-kernel's own CUDA archive (kt_kernel.cuda, outside a release): keep this build's entry only
    own = _own_cuda_digest()
    cuda_root = cache_root("cuda")
    if cuda_root.is_dir():
        for line in prune({own} if own else set(), cuda_root):
            print(line)
    return 0


def _own_cuda_digest() -> str:
    """The sha256 of this kt-kernel build's own CUDA archive, from _build.json beside this file
    ("" for a release's kt-kernel, whose libraries travel in the release payload)."""
    try:
        section = json.loads(Path(__file__).with_name("_build.json").read_text()).get("cuda") or {}
    except (OSError, ValueError, AttributeError):
        return ""
    digest = section.get("sha256", "") if isinstance(section, dict) else ""
    return digest if isinstance(digest, str) else ""


def main(argv: list[str] | None = None) -> int:
    """`python -m kt_kernel.payload materialize|verify|where|prune`; returns the exit status."""
    p = argparse.ArgumentParser(prog="python -m kt_kernel.payload", description=__doc__.splitlines()[0])
    p.add_argument("command", choices=["materialize", "verify", "where", "prune"])
    p.add_argument("--manifest", type=Path, help="a manifest other than the installed sgl_kernel's")
    args = p.parse_args(argv)
    try:
        if args.command == "prune":
            return _prune_command(args.manifest)
        m = load_manifest(args.manifest)
        if args.command == "materialize":
            print(materialize(m))
            return 0
        final = target_dir(m)
        if args.command == "where":
            if not _is_complete(final, m):
                print(f"not materialized: {final}; run python -m kt_kernel.payload materialize", file=sys.stderr)
                return 1
            print(final)
            return 0
        problems = verify(m)
        for line in problems:
            print(f"error: {line}", file=sys.stderr)
        if not problems:
            print(f"{final}: {len(m.files)} files match the manifest ({m.extracted_size / 2**20:.1f} MiB)")
        return 1 if problems else 0
    except PayloadError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
