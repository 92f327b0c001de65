"""One rule set for the audit and the runtime: the audit's tar reader (audits/readers/_tar.py)
and kt_kernel.payload's read every hostile archive below the same way: both refuse it, or both
see the same names and sizes. Their limits are the policy's."""

from __future__ import annotations

import io
import tarfile
from typing import Any

import pytest

from audits.policy import load_policy
from audits.readers._tar import MAX_HEADER_BYTES, TarStream
from tests.conftest import KT_SRC, load_source_module

payload: Any = load_source_module("kt_payload_tar_under_test", KT_SRC / "payload.py")


def _tar(*members: tuple[str, bytes], fmt: int = tarfile.PAX_FORMAT) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _header(name: str, size: int, kind: bytes = tarfile.REGTYPE) -> bytes:
    info = tarfile.TarInfo(name)
    info.size, info.type = size, kind
    return info.tobuf(tarfile.USTAR_FORMAT)


def _pax(records: bytes) -> bytes:
    return _header("././@PaxHeader", len(records), tarfile.XHDTYPE) + records + bytes(-len(records) % 512)


def _negative_size() -> bytes:
    block = bytearray(_header("a.so", 0))
    block[124:136] = b"\xff" * 12  # base-256 size field: -1
    block[148:156] = b"        "
    block[148:155] = f"{sum(block):06o}\0".encode()
    return bytes(block) + bytes(1024)


CASES = {
    "plain": _tar(("a/x.so", b"1" * 10), ("a/y.so", b"2" * 700)),
    "duplicate": _tar(("a/x.so", b"1"), ("a/x.so", b"2")),
    "line separator in a PAX name": _tar(("a/x\u2028y.so", b"1" * 3), ("a/\r.so", b"2")),
    "long name": _tar(("a/" + "d" * 150 + "/x.so", b"1")),
    "GNU long name": _tar(("a/" + "g" * 150 + "/x.so", b"1"), fmt=tarfile.GNU_FORMAT),
    "huge PAX header": _header("././@PaxHeader", MAX_HEADER_BYTES + 1, tarfile.XHDTYPE) + bytes(2048),
    "malformed PAX record": _pax(b"99 path=a/x.so\n") + _header("b.so", 0) + bytes(1024),
    "PAX size not a number": _pax(b"14 size=-500\n") + _header("b.so", 0) + bytes(1024),
    "negative size": _negative_size(),
    "cut inside a member": _tar(("a/x.so", b"1" * 5000))[:2000],
}


def _audit(data: bytes) -> list[tuple[str, int]] | str:
    stream = TarStream(io.BytesIO(data))
    try:
        out = []
        for e in stream:
            out.append((e.name, e.size))
            stream.read(e.size)
        return out
    except ValueError as exc:
        return f"refused: {type(exc).__name__}"


def _runtime(data: bytes) -> list[tuple[str, int]] | str:
    raw = io.BytesIO(data)
    try:
        out = []
        for info in payload._tar_members(raw):
            out.append((info.name, info.size))
            payload._read_exact(raw, info.size + (-info.size % 512))
        return out
    except (tarfile.TarError, EOFError) as exc:
        return f"refused: {type(exc).__name__}"


@pytest.mark.parametrize("case", sorted(CASES))
def test_audit_and_runtime_read_every_archive_alike(case: str) -> None:
    audit, runtime = _audit(CASES[case]), _runtime(CASES[case])
    assert isinstance(audit, str) == isinstance(runtime, str), (audit, runtime)
    if not isinstance(audit, str):
        assert audit == runtime
    refused = {"huge PAX header", "malformed PAX record", "PAX size not a number", "negative size"}
    refused |= {"cut inside a member"}
    assert isinstance(audit, str) == (case in refused), audit


def test_names_with_line_separators_are_one_name() -> None:
    assert _audit(CASES["line separator in a PAX name"]) == [("a/x\u2028y.so", 3), ("a/\r.so", 1)]


def test_the_runtime_limits_are_the_policys() -> None:
    policy = load_policy()
    assert policy.payload is not None
    assert policy.payload.zstd_window_log == payload.MAX_WINDOW_LOG
    assert payload.MAX_HEADER_BYTES == MAX_HEADER_BYTES
