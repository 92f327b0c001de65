"""Seeded mutants of real wheels for the audit's fuzz test: byte flips and truncations in the
deflated streams of members, in ELF headers and sections, in RECORD and METADATA, in the JSON the
audit reads and in the payload parts. Each mutant is one defect; the seed makes it repeatable.

`mutants` writes them; `python -m tests.fuzzkit DIRS.json RESULT.json` audits each directory in one
process and records its exit status, time, whether the report was written and any escaped exception,
with the process's peak RSS."""

from __future__ import annotations

import io
import json
import random
import struct
import sys
import time
import traceback
import zipfile
from collections.abc import Callable, Iterator
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.wheelkit import read_members, write_wheel

_LOCAL_HEADER = struct.Struct("<4s5H3L2H")  # zip local file header, 30 bytes


@dataclass(frozen=True)
class Mutant:
    """One mutated wheel: where it is, which wheel it came from and what was done."""

    path: Path
    origin: str
    kind: str
    detail: str


def _data_span(raw: bytes, info: zipfile.ZipInfo) -> tuple[int, int]:
    """(start, end) of a member's compressed bytes inside the zip file."""
    fields = _LOCAL_HEADER.unpack_from(raw, info.header_offset)
    start = info.header_offset + _LOCAL_HEADER.size + fields[9] + fields[10]
    return start, start + info.compress_size


def _flip(data: bytearray, rng: random.Random, start: int, end: int, count: int) -> str:
    where = sorted(rng.randrange(start, max(start + 1, end)) for _ in range(count))
    for i in where:
        if i < len(data):
            data[i] ^= 1 << rng.randrange(8)
    return f"bits at {where}"


def flip_stream(src: Path, rng: random.Random) -> tuple[bytes, str]:
    """Flip bits inside one compressed member's stream (the CRC may or may not catch it)."""
    raw = bytearray(src.read_bytes())
    with zipfile.ZipFile(src) as zf:
        infos = [i for i in zf.infolist() if i.compress_size > 8]
    info = rng.choice(infos)
    start, end = _data_span(bytes(raw), info)
    how = _flip(raw, rng, start, end, rng.choice((1, 1, 2, 8)))
    return bytes(raw), f"{info.filename} ({info.compress_type}): {how}"


def truncate(src: Path, rng: random.Random) -> tuple[bytes, str]:
    raw = src.read_bytes()
    cut = rng.randrange(0, len(raw))
    return raw[:cut], f"cut at {cut} of {len(raw)}"


def flip_any(src: Path, rng: random.Random) -> tuple[bytes, str]:
    """Flip bits anywhere in the file (headers, central directory, streams)."""
    raw = bytearray(src.read_bytes())
    return bytes(raw), _flip(raw, rng, 0, len(raw), rng.choice((1, 4, 16)))


def _rewrite(
    src: Path,
    rng: random.Random,
    pick: Callable[[str], bool],
    mutate: Callable[[bytes, random.Random], bytes],
    *,
    record: bool,
) -> tuple[dict[str, bytes], str, bool]:
    members = read_members(src)
    names = sorted(n for n in members if pick(n))
    if not names:
        return members, "", False
    name = rng.choice(names)
    members[name] = mutate(members[name], rng)
    return members, name, record


def _bytes_flip(limit: int | None) -> Callable[[bytes, random.Random], bytes]:
    def mutate(data: bytes, rng: random.Random) -> bytes:
        out = bytearray(data)
        if not out:
            return b"\xff"
        end = min(len(out), limit) if limit else len(out)
        _flip(out, rng, 0, end, rng.choice((1, 2, 4, 16)))
        return bytes(out)

    return mutate


def _elf_sections(data: bytes, rng: random.Random) -> bytes:
    """Flip bits in the section header table or in a random section's bytes."""
    out = bytearray(data)
    if len(out) < 64:
        return bytes(out)
    shoff = int.from_bytes(out[0x28:0x30], "little")
    if 0 < shoff < len(out) and rng.random() < 0.6:
        _flip(out, rng, shoff, len(out), rng.choice((1, 2, 8)))
    else:
        _flip(out, rng, 64, len(out), rng.choice((1, 4, 32)))
    return bytes(out)


def _text_mutation(data: bytes, rng: random.Random) -> bytes:
    """RECORD/METADATA/JSON edits a user can meet: invalid UTF-8, a huge field, a cut, junk lines."""
    choice = rng.randrange(6)
    if choice == 0:
        return data[: rng.randrange(len(data) + 1)]
    if choice == 1:
        i = rng.randrange(len(data) + 1)
        return data[:i] + b"\xff\xfe\x80" + data[i:]
    if choice == 2:
        return data + b"x" * rng.choice((200_000, 2_000_000)) + b",,\n"
    if choice == 3:
        return data + b"Requires-Dist: ]][[ not a requirement\nName\n\x00\x01\n"
    if choice == 4:
        lines = data.splitlines(keepends=True)
        rng.shuffle(lines)
        return b"".join(lines)
    return bytes(_bytes_flip(None)(data, rng))


def _json_shape(data: bytes, rng: random.Random) -> bytes:
    """Valid JSON of the wrong shape: a value replaced by another type, a key dropped."""
    try:
        doc = json.loads(data)
    except ValueError:
        return data
    paths: list[tuple[Any, Any]] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                paths.append((node, k))
                walk(v)
        elif isinstance(node, list):
            for i, v in enumerate(node):
                paths.append((node, i))
                walk(v)

    walk(doc)
    if not paths or rng.random() < 0.1:
        return json.dumps(rng.choice([[], 3, "x", None, {"parts": 1}])).encode()
    for _ in range(rng.choice((1, 1, 3))):
        parent, key = rng.choice(paths)
        if isinstance(parent, dict) and rng.random() < 0.3:
            parent.pop(key, None)
        else:
            parent[key] = rng.choice([None, -1, 2**70, "x", [], {}, [1, "a"], {"a": None}, 1.5, True])
    return json.dumps(doc).encode()


def _is_elf(members: dict[str, bytes]) -> Callable[[str], bool]:
    return lambda n: members[n][:4] == b"\x7fELF"


def mutants(src: Path, out: Path, seed: int, count: int, siblings: tuple[Path, ...] = ()) -> Iterator[Mutant]:
    """`count` seeded mutants of one wheel, each in its own directory under `out` beside copies of
    `siblings` (the rest of a release), one defect each, the kinds taken in turn."""
    rng = random.Random(f"{src.name}:{seed}")  # noqa: S311 (seeded on purpose: a mutant can be rebuilt)
    members = read_members(src)
    kinds: list[tuple[str, Callable[[], tuple[bytes | dict[str, bytes], str, bool]]]] = [
        ("deflate-flip", lambda: (*flip_stream(src, rng), False)),
        ("truncate", lambda: (*truncate(src, rng), False)),
        ("zip-flip", lambda: (*flip_any(src, rng), False)),
    ]
    if any(_is_elf(members)(n) for n in members):
        kinds += [
            ("elf-header", lambda: _rewrite(src, rng, _is_elf(members), _bytes_flip(64), record=True)),
            ("elf-sections", lambda: _rewrite(src, rng, _is_elf(members), _elf_sections, record=True)),
        ]
    kinds += [
        ("record", lambda: _rewrite(src, rng, lambda n: n.endswith(".dist-info/RECORD"), _text_mutation, record=False)),
        (
            "metadata",
            lambda: _rewrite(src, rng, lambda n: n.endswith(("/METADATA", "/WHEEL")), _text_mutation, record=True),
        ),
    ]
    if any(n.endswith(".py") and members[n] for n in members):
        kinds.append(("python", lambda: _rewrite(src, rng, lambda n: n.endswith(".py"), _python_mutation, record=True)))
    if any(n.endswith(".json") for n in members):
        kinds.append(
            ("json-shape", lambda: _rewrite(src, rng, lambda n: n.endswith(".json"), _json_shape, record=True))
        )
        kinds.append(
            ("json-bytes", lambda: _rewrite(src, rng, lambda n: n.endswith(".json"), _text_mutation, record=True))
        )
    if any(_is_nested(n) for n in members):
        kinds.append(("part", lambda: _rewrite(src, rng, _is_nested, _part_mutation, record=True)))
    for i in range(count):
        kind, make = kinds[i % len(kinds)]
        made, detail, regen = make()
        where = out / f"{src.name.split('-')[0]}-{seed}-{i}"
        where.mkdir(parents=True, exist_ok=True)
        for sib in siblings:
            (where / sib.name).write_bytes(sib.read_bytes())
        path = where / src.name
        if isinstance(made, bytes):
            path.write_bytes(made)
        else:
            write_wheel(path, made, regenerate_record=regen)
        yield Mutant(path, src.name, kind, detail)


def _is_nested(name: str) -> bool:
    return "/_kt_payload/" in name or name.endswith((".tar.xz", ".tar.zst"))


def _python_mutation(data: bytes, rng: random.Random) -> bytes:
    """A .py member a parser must survive: deep nesting, a NUL byte, junk."""
    choice = rng.randrange(3)
    if choice == 0:
        return (
            b"import importlib.metadata\nx = importlib.metadata.version('a')\ny = "
            + b"(" * 5000
            + b"1"
            + b")" * 5000
            + b"\n"
        )
    if choice == 1:
        return b"import importlib.metadata\nimportlib.metadata.version('a')\n" + b"[" * 200_000 + b"\n"
    return data + b"\x00version('x')\n"


def _part_mutation(data: bytes, rng: random.Random) -> bytes:
    choice = rng.randrange(3)
    if choice == 0:
        return data[: rng.randrange(len(data) + 1)]
    out = bytearray(data)
    _flip(out, rng, 0, len(out), rng.choice((1, 2, 8)))
    return bytes(out)


def audit_dirs(dirs: list[Path]) -> list[dict[str, Any]]:
    """Audit each directory in this process (the fuzz test's subprocess); one record per run."""
    from audits.__main__ import main

    records = []
    for where in dirs:
        t0 = time.perf_counter()
        sink = io.StringIO()
        report = where / "report.json"
        try:
            with redirect_stdout(sink), redirect_stderr(sink):
                status: int | None = main([str(where), "--json", str(report), "--markdown", str(where / "report.md")])
            error = "" if status in (0, 1) else sink.getvalue()[-2000:]
        except BaseException:  # the fuzz test reports whatever escaped, exactly
            status, error = None, traceback.format_exc()[-4000:]
        records.append(
            {
                "dir": where.name,
                "status": status,
                "seconds": round(time.perf_counter() - t0, 3),
                "report": report.is_file(),
                "error": error,
            }
        )
    return records


def peak_rss() -> int:
    """This process's own peak RSS in bytes (VmHWM: ru_maxrss would carry the parent's peak across fork
    and exec, and a pytest worker's is whatever its earlier tests left)."""
    status = Path("/proc/self/status").read_text().splitlines()
    return int(next(line for line in status if line.startswith("VmHWM:")).split()[1]) * 1024


if __name__ == "__main__":
    manifest, result = Path(sys.argv[1]), Path(sys.argv[2])
    todo = [Path(d) for d in json.loads(manifest.read_text())]
    done = audit_dirs(todo)
    peak = peak_rss()
    result.write_text(json.dumps({"runs": done, "peak_rss": peak}))


def tar_member(name: str, size: int, chunk: bytes = b"") -> tuple[bytes, int]:
    """A ustar header for a regular file of `size` bytes, and the padding its data needs."""
    import tarfile

    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = size, 0o644, 0
    return info.tobuf(tarfile.USTAR_FORMAT), -size % tarfile.BLOCKSIZE


def compressed_bomb(compress: Callable[[], Any], name: str, size: int, head: bytes = b"") -> bytes:
    """A tar of `head` (whole tar entries) then one member `name` of `size` zero bytes, compressed
    chunk by chunk: a few hundred KB that unpack to `size`."""
    import tarfile

    c = compress()
    header, pad = tar_member(name, size)
    out = [c.compress(head + header)]
    zero = bytes(1 << 20)
    left = size
    while left:
        n = min(left, len(zero))
        out.append(c.compress(zero[:n]))
        left -= n
    out.append(c.compress(bytes(pad) + bytes(2 * tarfile.BLOCKSIZE)))
    out.append(c.flush())
    return b"".join(out)
