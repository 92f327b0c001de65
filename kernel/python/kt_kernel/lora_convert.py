"""Convert LoRA adapters between the KT expert layout and PEFT's per-expert layout.

    kt-lora-convert to-peft ADAPTER OUT      (also: python -m kt_kernel.lora_convert ...)
    kt-lora-convert to-kt   ADAPTER OUT
    kt-lora-convert --check ADAPTER_A ADAPTER_B

KT layout (what kt_kernel.sft saves): one tensor per MoE block, projection and A/B, experts stacked
first: ``<block>.experts.<proj>.lora_A.weight`` [E, rank, in] and ``lora_B`` [E, out, rank].
PEFT layout: one tensor per expert: ``<block>.experts.<e>.<proj>.lora_A.weight`` [rank, in].
Every other tensor (attention and dense LoRA) is copied as it is. ADAPTER is a .safetensors file or
a directory with one, or with shards and their ``*.safetensors.index.json``. Tensors are streamed
(memory bounded by one copy buffer and the headers), the output is written to a temporary name and
renamed, byte-identical for the same input, and the input is only ever read. The two layouts hold
the same bytes: a round trip reproduces every tensor bit for bit.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import struct
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

CHUNK = 1 << 20
SHARD_BYTES = 5 << 30  # a new output shard after this many bytes (--max-shard-mib)
DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}
KT_EXPERT = re.compile(r"^(?P<block>.+\.experts)\.(?P<proj>[A-Za-z_][A-Za-z0-9_]*)\.(?P<ab>lora_[AB])\.weight$")
PEFT_EXPERT = re.compile(
    r"^(?P<block>.+\.experts)\.(?P<e>\d+)\.(?P<proj>[A-Za-z_][A-Za-z0-9_]*)\.(?P<ab>lora_[AB])\.weight$"
)
LORA_NAME = re.compile(r"\.(lora_[AB]|lora_embedding_[AB]|lora_magnitude_vector)(\.[A-Za-z0-9_]+)*(\.weight|\.bias)?$")


class ConvertError(Exception):
    """Bad input: the message names the tensor, the file and what is wrong."""


@dataclass(frozen=True)
class Piece:
    """Bytes of one stored tensor: file, absolute offset, length."""

    file: Path
    offset: int
    length: int


@dataclass(frozen=True)
class Tensor:
    """A logical tensor: dtype, shape and the stored pieces whose bytes it is, in order."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    pieces: tuple[Piece, ...]

    @property
    def nbytes(self) -> int:
        return sum(p.length for p in self.pieces)


def _header(path: Path) -> tuple[dict[str, dict[str, Any]], int]:
    """The safetensors header of `path` (tensors only) and where its data starts."""
    try:
        with path.open("rb") as f:
            raw = f.read(8)
            if len(raw) != 8:
                raise ConvertError(f"{path}: not a safetensors file (shorter than its 8-byte header length)")
            (n,) = struct.unpack("<Q", raw)
            if n > 100 << 20:
                raise ConvertError(f"{path}: header of {n} bytes; not a safetensors file")
            head = json.loads(f.read(n))
            size = os.fstat(f.fileno()).st_size
    except (OSError, ValueError) as exc:
        raise ConvertError(f"{path}: not a readable safetensors file ({exc})") from None
    head.pop("__metadata__", None)
    for name, info in head.items():
        dtype, shape, (a, b) = info.get("dtype"), info.get("shape"), info.get("data_offsets", (0, -1))
        if dtype not in DTYPE_BYTES or not isinstance(shape, list):
            raise ConvertError(f"{path}: tensor {name!r} has dtype {dtype!r} / shape {shape!r} this tool does not read")
        count = 1
        for d in shape:
            count *= d
        if b - a != count * DTYPE_BYTES[dtype] or 8 + n + b > size:
            raise ConvertError(f"{path}: tensor {name!r}: offsets {a}..{b} do not fit {dtype} {shape} in the file")
    return head, 8 + n


def read_adapter(src: Path) -> dict[str, Tensor]:
    """Every tensor of an adapter (file, directory, or sharded directory), by name."""
    if src.is_dir():
        index = sorted(src.glob("*.safetensors.index.json"))
        if len(index) > 1:
            raise ConvertError(f"{src}: several index files {[p.name for p in index]}; keep one")
        if index:
            try:
                files = sorted({src / f for f in json.loads(index[0].read_text())["weight_map"].values()})
            except (OSError, ValueError, KeyError) as exc:
                raise ConvertError(f"{index[0]}: not a safetensors index ({exc})") from None
        else:
            files = sorted(src.glob("*.safetensors"))
        if not files:
            raise ConvertError(f"{src}: no .safetensors file in it")
    elif src.is_file():
        files = [src]
    else:
        raise ConvertError(f"{src}: no such file or directory")
    out: dict[str, Tensor] = {}
    for f in files:
        head, base = _header(f)
        for name, info in head.items():
            if name in out:
                raise ConvertError(f"{f}: tensor {name!r} is also in {out[name].pieces[0].file}")
            a, b = (int(v) for v in info["data_offsets"])
            shape = tuple(int(d) for d in info["shape"])
            out[name] = Tensor(name, str(info["dtype"]), shape, (Piece(f, base + a, b - a),))
    return out


def _check_name(t: Tensor) -> None:
    if not LORA_NAME.search(t.name):
        raise ConvertError(
            f"{t.pieces[0].file}: tensor {t.name!r} is not a LoRA tensor name (…lora_A/lora_B.weight); "
            "is this an adapter?"
        )


def to_peft(tensors: dict[str, Tensor]) -> dict[str, Tensor]:
    """KT layout -> PEFT layout: each stacked [E, a, b] expert tensor becomes E tensors [a, b]."""
    out: dict[str, Tensor] = {}
    for t in tensors.values():
        _check_name(t)
        m = KT_EXPERT.match(t.name)
        if m is None or m.group("proj").isdigit():
            out[t.name] = t
            continue
        if len(t.shape) != 3:
            raise ConvertError(
                f"{t.pieces[0].file}: expert tensor {t.name!r} has shape {list(t.shape)}; "
                "KT layout is [experts, rows, cols]"
            )
        (piece,) = t.pieces
        step = piece.length // t.shape[0]
        for e in range(t.shape[0]):
            name = f"{m.group('block')}.{e}.{m.group('proj')}.{m.group('ab')}.weight"
            out[name] = Tensor(name, t.dtype, t.shape[1:], (Piece(piece.file, piece.offset + e * step, step),))
    return out


def to_kt(tensors: dict[str, Tensor]) -> dict[str, Tensor]:
    """PEFT layout -> KT layout: the experts 0..E-1 of each block, projection and A/B stacked."""
    groups: dict[str, dict[int, Tensor]] = {}
    out: dict[str, Tensor] = {}
    for t in tensors.values():
        _check_name(t)
        m = PEFT_EXPERT.match(t.name)
        if m is None:
            out[t.name] = t
            continue
        key = f"{m.group('block')}.{m.group('proj')}.{m.group('ab')}.weight"
        groups.setdefault(key, {})[int(m.group("e"))] = t
    counts: dict[str, dict[str, int]] = {}
    for key, experts in groups.items():
        counts.setdefault(key.rsplit(".", 3)[0], {})[key] = len(experts)
    for block, per in counts.items():
        if len(set(per.values())) > 1:
            files = sorted({str(t.pieces[0].file) for k in per for t in groups[k].values()})
            raise ConvertError(
                f"{', '.join(files)}: {block}: expert counts differ between its tensors "
                f"(extra or missing experts): {per}"
            )
    for key, experts in groups.items():
        first = experts[min(experts)]
        where = first.pieces[0].file
        if sorted(experts) != list(range(len(experts))):
            missing = sorted(set(range(max(experts) + 1)) - set(experts))
            raise ConvertError(
                f"{where}: {key}: experts {missing} are missing (have {len(experts)}, highest {max(experts)})"
            )
        for t in (experts[k] for k in sorted(experts)):
            if (t.dtype, t.shape) != (first.dtype, first.shape):
                raise ConvertError(
                    f"{t.pieces[0].file}: tensor {t.name!r} is {t.dtype} {list(t.shape)}, expert 0 is "
                    f"{first.dtype} {list(first.shape)} (rank or dtype mismatch)"
                )
        if key in out:
            raise ConvertError(f"{where}: {key} exists both stacked and per expert")
        pieces = tuple(p for e in range(len(experts)) for p in experts[e].pieces)
        out[key] = Tensor(key, first.dtype, (len(experts), *first.shape), pieces)
    return out


class _Files:
    """Open input files, reused across the many small tensors of an adapter."""

    def __init__(self) -> None:
        self.open: dict[Path, BinaryIO] = {}

    def __enter__(self) -> _Files:
        return self

    def __exit__(self, *exc: object) -> None:
        for f in self.open.values():
            f.close()

    def stream(self, pieces: tuple[Piece, ...]) -> Iterator[bytes]:
        for p in pieces:
            f = self.open.get(p.file)
            if f is None:
                f = self.open[p.file] = p.file.open("rb")
            f.seek(p.offset)
            left = p.length
            while left:
                chunk = f.read(min(CHUNK, left))
                if not chunk:
                    raise ConvertError(f"{p.file}: ends inside a tensor (truncated file)")
                left -= len(chunk)
                yield chunk


def _write_file(path: Path, tensors: list[Tensor], layout: str) -> None:
    header: dict[str, object] = {"__metadata__": {"format": "pt", "kt_lora_layout": layout}}
    offset = 0
    for t in tensors:
        header[t.name] = {"dtype": t.dtype, "shape": list(t.shape), "data_offsets": [offset, offset + t.nbytes]}
        offset += t.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with path.open("wb") as f, _Files() as files:
        f.write(struct.pack("<Q", len(raw)) + raw)
        for t in tensors:
            for chunk in files.stream(t.pieces):
                f.write(chunk)


def write_adapter(tensors: dict[str, Tensor], out: Path, layout: str, shard_bytes: int = SHARD_BYTES) -> list[Path]:
    """Write `tensors` (sorted by name) to `out`: a .safetensors file, or a directory of shards with
    an index when they exceed `shard_bytes`. Atomic: written under a temporary name, then renamed."""
    order = [tensors[n] for n in sorted(tensors)]
    shards: list[list[Tensor]] = [[]]
    size = 0
    for t in order:
        if shards[-1] and size + t.nbytes > shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(t)
        size += t.nbytes
    if out.exists():
        raise ConvertError(f"{out} exists; remove it or choose another output")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        if out.suffix == ".safetensors":
            if len(shards) > 1:
                raise ConvertError(f"{out}: {sum(t.nbytes for t in order)} bytes need shards; give a directory")
            _write_file(tmp / out.name, shards[0], layout)
            (tmp / out.name).replace(out)
            return [out]
        names = (
            ["adapter_model.safetensors"]
            if len(shards) == 1
            else [f"adapter_model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
        )
        for name, shard in zip(names, shards, strict=True):
            _write_file(tmp / name, shard, layout)
        if len(shards) > 1:
            index = {
                "metadata": {"total_size": sum(t.nbytes for t in order)},
                "weight_map": {t.name: name for name, shard in zip(names, shards, strict=True) for t in shard},
            }
            (tmp / "adapter_model.safetensors.index.json").write_text(
                json.dumps(index, indent=2, sort_keys=True) + "\n"
            )
        tmp.replace(out)
        return [out / n for n in names]
    finally:
        if tmp.exists():
            for f in tmp.iterdir():
                f.unlink()
            tmp.rmdir()


def _elements(t: Tensor, files: _Files) -> Iterator[bytes]:
    """The tensor's bytes, re-chunked to whole elements."""
    size = DTYPE_BYTES[t.dtype]
    rest = b""
    for chunk in files.stream(t.pieces):
        data = rest + chunk
        cut = len(data) - len(data) % size
        rest = data[cut:]
        yield data[:cut]


def check(a: Path, b: Path) -> str | None:
    """None when the adapters hold the same tensors (either layout), else the first difference."""
    ta, tb = to_peft(read_adapter(a)), to_peft(read_adapter(b))
    only_a, only_b = sorted(set(ta) - set(tb)), sorted(set(tb) - set(ta))
    if only_a or only_b:
        return f"tensor {(only_a or only_b)[0]!r} is only in {a if only_a else b}"
    with _Files() as fa, _Files() as fb:
        for name in sorted(ta):
            diff = _compare(name, ta[name], tb[name], a, b, fa, fb)
            if diff:
                return diff
    return None


def _compare(name: str, x: Tensor, y: Tensor, a: Path, b: Path, fa: _Files, fb: _Files) -> str | None:
    if (x.dtype, x.shape) != (y.dtype, y.shape):
        return f"{name}: {x.dtype} {list(x.shape)} in {a}, {y.dtype} {list(y.shape)} in {b}"
    size, pos = DTYPE_BYTES[x.dtype], 0
    for cx, cy in zip(_elements(x, fa), _elements(y, fb), strict=False):
        if cx != cy:
            i = next(k for k in range(0, len(cx), size) if cx[k : k + size] != cy[k : k + size])
            va, vb = cx[i : i + size].hex(), cy[i : i + size].hex()
            return f"{name}: element {(pos + i) // size} differs ({va} vs {vb})"
        pos += len(cx)
    return None


def main(argv: list[str] | None = None) -> int:
    """The kt-lora-convert command; returns the exit status (2: bad input, 1: --check found a difference)."""
    p = argparse.ArgumentParser(prog="kt-lora-convert", description=__doc__.splitlines()[0])
    p.add_argument("direction", nargs="?", choices=["to-peft", "to-kt"])
    p.add_argument("src", type=Path)
    p.add_argument("out", type=Path)
    p.add_argument("--check", action="store_true", help="compare SRC and OUT tensor by tensor instead")
    p.add_argument("--max-shard-mib", type=int, default=SHARD_BYTES >> 20, help="output shard size (directory outputs)")
    args = p.parse_args(argv)
    try:
        if args.check:
            diff = check(args.src, args.out)
            print(diff or f"identical: {args.src} and {args.out}")
            return 1 if diff else 0
        if args.direction is None:
            p.error("give to-peft or to-kt (or --check)")
        tensors = read_adapter(args.src)
        converted = to_peft(tensors) if args.direction == "to-peft" else to_kt(tensors)
        written = write_adapter(converted, args.out, args.direction[3:], args.max_shard_mib << 20)
    except ConvertError as exc:
        print(f"kt-lora-convert: {exc}", file=sys.stderr)
        return 2
    print(f"{len(tensors)} tensors -> {len(converted)} in {len(written)} file(s): {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
