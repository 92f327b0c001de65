"""Deterministic wheel reading and writing (PEP 427), and METADATA edits that
touch only the lines they must."""

from __future__ import annotations

import base64
import contextlib
import contextvars
import csv
import hashlib
import io
import os
import re
import time
import zipfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from packaging.utils import canonicalize_name

from .errors import InputError

# Zip timestamps cannot go below 1980.
_MIN_EPOCH = 315532800


def read(path: Path | bytes, where: str = "") -> dict[str, bytes]:
    """Every member of a wheel (a file, or its bytes), by name."""
    try:
        with zipfile.ZipFile(io.BytesIO(path) if isinstance(path, bytes) else path) as zf:
            return {i.filename: zf.read(i) for i in zf.infolist() if not i.filename.endswith("/")}
    except (OSError, zipfile.BadZipFile) as exc:
        label = where or ("a wheel in memory" if isinstance(path, bytes) else str(path))
        raise InputError(f"{label}: not a readable wheel ({exc})") from exc


def dist_info(members: Mapping[str, bytes]) -> str:
    """The .dist-info directory of a wheel's members."""
    found = {n.split("/", 1)[0] for n in members if n.split("/", 1)[0].endswith(".dist-info")}
    if len(found) != 1:
        raise InputError(f"expected one .dist-info directory, found {sorted(found) or 'none'}")
    return found.pop()


def read_metadata(path: Path) -> tuple[str, list[str]]:
    """(Version, Requires-Dist lines) of a wheel, reading only its METADATA member."""
    try:
        with zipfile.ZipFile(path) as zf:
            names = dict.fromkeys(zf.namelist(), b"")
            text = zf.read(f"{dist_info(names)}/METADATA").decode("utf-8")
    except (OSError, KeyError, UnicodeDecodeError, zipfile.BadZipFile) as exc:
        raise InputError(f"{path}: no readable .dist-info/METADATA ({exc})") from exc
    except InputError as exc:
        raise InputError(f"{path}: {exc}") from exc
    return metadata_field(text, "Version")[0], metadata_field(text, "Requires-Dist")


def has_sbom(names: Sequence[str]) -> bool:
    """Whether a wheel's members (by name) include an SBOM under .dist-info/sboms/."""
    return any(n.split("/")[0].endswith(".dist-info") and "/sboms/" in n for n in names)


def record_hash(data: bytes) -> str:
    """A sha256 in RECORD's form."""
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def write(
    path: Path,
    members: Mapping[str, bytes],
    executable: frozenset[str] = frozenset(),
    stored: frozenset[str] = frozenset(),
) -> None:
    """Write a wheel whose bytes depend on `members` alone (see write_to), atomically."""
    with atomic(path) as fh:
        write_to(fh, members, executable, stored)


def write_bytes(path: Path, data: bytes) -> None:
    """Write an already encoded wheel atomically."""
    with atomic(path) as fh:
        fh.write(data)


@contextlib.contextmanager
def atomic(path: Path) -> Iterator[IO[bytes]]:
    """A file handle whose bytes replace `path` whole when the block ends: a temporary file of its own
    beside it (two processes writing one path never share one), mode 0644, removed if the block fails."""
    import secrets

    from base import swap

    tmp = swap.part(path, secrets.token_hex(4))
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb") as fh:
            yield fh
        tmp.chmod(0o644)
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_to(
    fh: IO[bytes],
    members: Mapping[str, bytes],
    executable: frozenset[str] = frozenset(),
    stored: frozenset[str] = frozenset(),
) -> None:
    """A wheel whose bytes depend on `members` alone, into an open binary file: sorted entries (dist-info
    last, RECORD regenerated), SOURCE_DATE_EPOCH timestamps, 0644/0755 modes, deflate 6
    (`stored` members, already compressed, are stored as they are). Inside `memo(...)` a wheel of the
    same members was deflated before is written from the memo instead (same bytes, no compression)."""
    di = dist_info(members)
    record = f"{di}/RECORD"
    body = {n: d for n, d in members.items() if n != record and not n.endswith((".jws", ".p7s"))}
    # RECORD is CSV: paths with commas (sglang ships "N=1536,K=7168,...json") must be quoted.
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerows([(n, record_hash(d), len(d)) for n, d in sorted(body.items())])
    writer.writerow((record, "", ""))
    body[record] = buf.getvalue().encode()
    epoch = max(int(os.environ.get("SOURCE_DATE_EPOCH", _MIN_EPOCH)), _MIN_EPOCH)
    # RECORD names every member with its sha256: with the modes and the epoch, it is the wheel's content key.
    key = hashlib.sha256(
        f"{ENCODING}\0{epoch}\0{sorted(executable & set(body))}\0{sorted(stored & set(body))}\0".encode() + body[record]
    ).hexdigest()
    m = _MEMO.get()
    cached = m.get(key) if m is not None else None
    if cached is not None:
        fh.write(cached)
        return
    stamp = time.gmtime(epoch)[:6]
    order = sorted(body, key=lambda n: (n.startswith(di + "/"), n == record, n))
    out = io.BytesIO() if m is not None else fh
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED, compresslevel=6) as zf:
        for name in order:
            info = zipfile.ZipInfo(name, stamp)
            info.compress_type = zipfile.ZIP_STORED if name in stored else zipfile.ZIP_DEFLATED
            info.external_attr = ((0o755 if name in executable else 0o644) | 0o100000) << 16
            zf.writestr(info, body[name], compresslevel=None if name in stored else 6)
    if m is not None and isinstance(out, io.BytesIO):
        data = out.getvalue()
        m.put(key, data)
        fh.write(data)


ENCODING = "kt-wheel-1"  # bump when write_to's output changes for the same members (the memo's keys with it)
MEMO_LIMIT = 3 << 30  # the memo keeps the newest-used wheels up to this many bytes


MEMO_NAME = re.compile(r"(?P<key>[0-9a-f]{64})-(?P<sha256>[0-9a-f]{64})\.whl")  # the only names the memo writes


class Memo:
    """Encoded wheels by content key, `KEY-SHA256.whl` in one folder of the running user's own
    (base.cachedir.owned): an entry is used only if its bytes still hash to the sha256 in its name (a
    corrupted one is deleted and the wheel encoded again), and the folder is pruned, least recently used
    first, to `limit` bytes, of those names only (base.cachedir.prune): a user's wheel beside them stays."""

    def __init__(self, root: Path, limit: int | None = None) -> None:
        from base import cachedir

        self.root = cachedir.owned(root, "wheel memo")  # judged once, when the memo is opened
        self.limit = MEMO_LIMIT if limit is None else limit
        self.hits = self.misses = 0

    def get(self, key: str) -> bytes | None:
        for path in sorted(self.root.glob(f"{key}-*.whl")):
            m = MEMO_NAME.fullmatch(path.name)
            if m is None or m["key"] != key:
                continue
            try:
                data = path.read_bytes()
            except FileNotFoundError:  # another assembly pruned it meanwhile
                continue
            if hashlib.sha256(data).hexdigest() == m["sha256"]:
                os.utime(path)  # recently used: pruned last
                self.hits += 1
                return data
            path.unlink(missing_ok=True)
        self.misses += 1
        return None

    def put(self, key: str, data: bytes) -> None:
        from base import cachedir

        path = self.root / f"{key}-{hashlib.sha256(data).hexdigest()}.whl"
        write_bytes(path, data)
        cachedir.prune(self.root, MEMO_NAME, keep=[path], max_bytes=self.limit)


_MEMO: contextvars.ContextVar[Memo | None] = contextvars.ContextVar("wheel_memo", default=None)


def current_memo() -> Memo | None:
    """The memo of the enclosing `memo(...)` block, if any."""
    return _MEMO.get()


@contextlib.contextmanager
def memo(root: Path | None) -> Iterator[Memo | None]:
    """Within the block, write_to reuses wheels it encoded before from `root` (None: no memo)."""
    m = Memo(root) if root is not None else None
    token = _MEMO.set(m)
    try:
        yield m
    finally:
        _MEMO.reset(token)


def set_tags(members: dict[str, bytes], tags: list[str]) -> None:
    """Rewrite the WHEEL file's Tag lines (and Root-Is-Purelib: false for a platform tag)."""
    name = f"{dist_info(members)}/WHEEL"
    lines = [ln for ln in members[name].decode("utf-8").splitlines() if ln.strip() and not ln.startswith("Tag: ")]
    platform = any(not t.endswith("-any") for t in tags)
    lines = [
        f"Root-Is-Purelib: {'false' if platform else 'true'}" if ln.startswith("Root-Is-Purelib:") else ln
        for ln in lines
    ]
    members[name] = ("\n".join(lines + [f"Tag: {t}" for t in tags]) + "\n").encode()


def tags_of(data: bytes) -> list[str]:
    """The Tag lines of a wheel's WHEEL file (the wheel's bytes)."""
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        names = dict.fromkeys(zf.namelist(), b"")
        text = zf.read(f"{dist_info(names)}/WHEEL").decode("utf-8")
    return [ln[len("Tag: ") :].strip() for ln in text.splitlines() if ln.startswith("Tag: ")]


def compressed_tag(tags: Sequence[str]) -> str:
    """PEP 425 compressed tag set: cp311-cp311-manylinux_2_34_x86_64, py3-none-a.b."""
    parts = [sorted({t.split("-")[i] for t in tags}) for i in range(3)]
    return "-".join(".".join(p) for p in parts)


def wheel_name(name: str, version: str, tag: str) -> str:
    """A wheel filename from name, version and compressed tag."""
    return f"{canonicalize_name(name).replace('-', '_')}-{version}-{tag}.whl"


def edit_metadata(
    text: str,
    *,
    name: str | None = None,
    version: str | None = None,
    requirement: Callable[[str], str] | None = None,
    add: Sequence[str] = (),
    append: Sequence[str] = (),
) -> str:
    """Rewrite Name, Version and Requires-Dist header lines, insert the header lines `add` (after the
    last Requires-Dist, or at the end of the header) and `append` (at the end of the header); every
    other byte stays."""
    head, sep, body = text.partition("\n\n")
    lines = head.split("\n")
    last = len(lines)
    for i, line in enumerate(lines):
        if name is not None and line.startswith("Name: "):
            lines[i] = f"Name: {name}"
        elif version is not None and line.startswith("Version: "):
            lines[i] = f"Version: {version}"
        elif line.startswith("Requires-Dist: "):
            last = i + 1
            if requirement is not None:
                lines[i] = "Requires-Dist: " + requirement(line[len("Requires-Dist: ") :])
    lines[last:last] = list(add)
    lines += list(append)
    return "\n".join(lines) + sep + body


def metadata_field(text: str, key: str) -> list[str]:
    """Every value of one METADATA header (`Requires-Dist`), as packaging.metadata parses it."""
    from packaging.metadata import parse_email

    raw, unparsed = parse_email(text)
    fields: dict[str, Any] = dict(raw)
    raw_key = key.lower().replace("-", "_")  # packaging's raw names: plural for some lists (license_files)
    value = fields.get(raw_key, fields.get(f"{raw_key}s", unparsed.get(key.lower(), [])))
    return [value] if isinstance(value, str) else [str(v) for v in value]
