"""One test per way a wheel met in the wild used to crash the audit (exit 3 or a traceback): each
builds exactly that input and asserts the finding that replaces the crash, exit 1, and that the
other wheels of the directory are still reported."""

from __future__ import annotations

import io
import json
import struct
import time
import zipfile
from pathlib import Path
from typing import Any

import pytest

from audits.__main__ import main
from audits.report import md_code, md_text, printable, to_markdown, to_terminal
from tests.payloadkit import compressible, release_wheels
from tests.wheelkit import pure_wheel_members, read_members, write_wheel


def _audit(where: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, Any], str]:
    report = where / "report.json"
    code = main([str(where), "--json", str(report)])
    out = capsys.readouterr()
    assert "Traceback" not in out.err, out.err
    assert "internal error" not in out.err, out.err
    return code, json.loads(report.read_text()), out.out


def _rules(report: dict[str, Any], wheel: str = "") -> dict[str, list[dict[str, str]]]:
    out: dict[str, list[dict[str, str]]] = {}
    for f in report["findings"]:
        if not wheel or f["wheel"] == wheel:
            out.setdefault(f["rule"], []).append(f)
    return out


def _pair(tmp_path: Path, members: dict[str, bytes], *, compression: int = zipfile.ZIP_DEFLATED) -> Path:
    """`members` as demo_pkg's wheel beside a clean other_pkg wheel, in a fresh directory."""
    where = tmp_path / "dist"
    where.mkdir()
    write_wheel(where / "other_pkg-1.0-py3-none-any.whl", pure_wheel_members("other_pkg"))
    path = write_wheel(where / "demo_pkg-1.0-py3-none-any.whl", members)
    if compression != zipfile.ZIP_DEFLATED:
        with zipfile.ZipFile(path, "w", compression) as zf:
            for name, data in sorted(read_members_of(members).items()):
                zf.writestr(zipfile.ZipInfo(name, (2020, 1, 1, 0, 0, 0)), data, compress_type=compression)
    return where


def read_members_of(members: dict[str, bytes]) -> dict[str, bytes]:
    """`members` with the RECORD write_wheel would add (for a rewrite with another compression)."""
    from tests.wheelkit import record_hash

    rec = "demo_pkg-1.0.dist-info/RECORD"
    rows = [f"{n},{record_hash(d)},{len(d)}" for n, d in sorted(members.items())]
    return {**members, rec: ("\n".join([*rows, f"{rec},,"]) + "\n").encode()}


def _damage(path: Path, member: str, fn: Any) -> None:
    """Apply `fn` to the compressed bytes of `member` inside the zip file, in place."""
    raw = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as zf:
        info = zf.getinfo(member)
    name_len, extra_len = struct.unpack_from("<HH", raw, info.header_offset + 26)
    start = info.header_offset + 30 + name_len + extra_len
    raw[start : start + info.compress_size] = fn(bytes(raw[start : start + info.compress_size]))
    path.write_bytes(bytes(raw))


def _big_module() -> dict[str, bytes]:
    members = pure_wheel_members()
    members["demo_pkg/big.py"] = compressible(200_000, 5).hex().encode()[:200_000]
    return members


def test_a_corrupt_deflate_stream(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    where = _pair(tmp_path, _big_module())
    _damage(where / "demo_pkg-1.0-py3-none-any.whl", "demo_pkg/big.py", lambda b: b[:100] + b"\xff" * 64 + b[164:])
    code, report, _ = _audit(where, capsys)
    assert code == 1
    (f,) = _rules(report, "demo_pkg-1.0-py3-none-any.whl")["wheel.unreadable"]
    assert f["member"] == "demo_pkg/big.py"
    assert "cannot decompress" in f["message"]
    assert not _rules(report, "other_pkg-1.0-py3-none-any.whl")


def test_a_corrupt_lzma_stream(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    where = _pair(tmp_path, _big_module(), compression=zipfile.ZIP_LZMA)
    _damage(where / "demo_pkg-1.0-py3-none-any.whl", "demo_pkg/big.py", lambda b: b[:40] + b"\x00" * 200 + b[240:])
    code, report, _ = _audit(where, capsys)
    assert code == 1
    assert [f["member"] for f in _rules(report)["wheel.unreadable"]] == ["demo_pkg/big.py"]


def test_an_encrypted_member(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    where = _pair(tmp_path, pure_wheel_members())
    path = where / "demo_pkg-1.0-py3-none-any.whl"
    raw = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as zf:
        info = zf.getinfo("demo_pkg/__init__.py")
    raw[info.header_offset + 6] |= 1  # local header: general purpose flag bit 0, encrypted
    central = raw.find(b"PK\x01\x02" + raw[raw.find(b"PK\x01\x02") + 4 : raw.find(b"PK\x01\x02") + 4])
    while central != -1:
        name_len = struct.unpack_from("<H", raw, central + 28)[0]
        if raw[central + 46 : central + 46 + name_len] == b"demo_pkg/__init__.py":
            raw[central + 8] |= 1
        central = raw.find(b"PK\x01\x02", central + 4)
    path.write_bytes(bytes(raw))
    code, report, _ = _audit(where, capsys)
    assert code == 1
    (f,) = _rules(report)["wheel.unreadable"]
    assert (f["member"], "encrypted" in f["message"]) == ("demo_pkg/__init__.py", True)


def test_a_member_name_that_is_not_utf8(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    where = _pair(tmp_path, pure_wheel_members())
    path = where / "demo_pkg-1.0-py3-none-any.whl"
    raw = bytearray(path.read_bytes())
    good = b"demo_pkg/__init__.py"
    central = raw.find(b"PK\x01\x02")
    while central != -1:
        name_len = struct.unpack_from("<H", raw, central + 28)[0]
        if raw[central + 46 : central + 46 + name_len] == good:
            raw[central + 8 : central + 10] = struct.pack("<H", struct.unpack_from("<H", raw, central + 8)[0] | 0x800)
            raw[central + 46 : central + 46 + 4] = b"\xff\xfe\xfd\xfc"  # flagged UTF-8, is not
        central = raw.find(b"PK\x01\x02", central + 4)
    path.write_bytes(bytes(raw))
    code, report, _ = _audit(where, capsys)
    assert code == 1
    (f,) = _rules(report)["wheel.unreadable"]
    assert f["wheel"] == path.name
    assert "UnicodeDecodeError" in f["message"]
    assert {w["filename"] for w in report["wheels"]} == {path.name, "other_pkg-1.0-py3-none-any.whl"}


def test_a_record_field_over_csv_limits(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    members = read_members_of(pure_wheel_members())
    rec = "demo_pkg-1.0.dist-info/RECORD"
    members[rec] += b"demo_pkg/" + b"x" * 200_000 + b",,\n"
    where = tmp_path / "dist"
    where.mkdir()
    write_wheel(where / "demo_pkg-1.0-py3-none-any.whl", members, regenerate_record=False)
    code, report, _ = _audit(where, capsys)
    assert code == 1
    (f,) = _rules(report)["wheel.unreadable"]
    assert f["member"] == rec
    assert "field larger than field limit" in f["message"]


@pytest.mark.parametrize("source", [b"x = " + b"-" * 100_000 + b"1\n", b"x = " + b"+".join([b"1"] * 100_000) + b"\n"])
def test_a_deeply_nested_python_module(tmp_path: Path, capsys: pytest.CaptureFixture[str], source: bytes) -> None:
    members = pure_wheel_members()
    members["demo_pkg/deep.py"] = b"from importlib.metadata import version\nversion('numpy')\n" + source
    code, _, _ = _audit(_pair(tmp_path, members), capsys)
    assert code == 0


def test_an_elf_member_with_a_mutated_header(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    elf = bytearray(b"\x7fELF\x02\x01\x01" + bytes(57))
    struct.pack_into("<HHIQQQIHHHHHH", elf, 16, 3, 62, 1, 0, 0, 2**62, 0, 64, 56, 0, 64, 0xFFFF, 0)
    members = pure_wheel_members()
    members["demo_pkg/_native.so"] = bytes(elf) + bytes(256)
    code, report, _ = _audit(_pair(tmp_path, members), capsys)
    assert code == 1
    (f,) = _rules(report)["wheel.unreadable"]
    assert (f["member"], "malformed ELF" in f["message"]) == ("demo_pkg/_native.so", True)


def test_a_version_section_whose_count_loops_is_refused_quickly(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A .gnu.version_r whose count (sh_info) claims 2**31 entries and whose first entry's vn_next is 0: pyelftools
    yields that one entry again and again; the reader stops at its bound (a CI fuzz mutant ran the audit out of
    memory on exactly this)."""
    import subprocess

    from elftools.elf.elffile import ELFFile

    (tmp_path / "v.c").write_text(
        "#include <string.h>\nvoid *f(void *a, const void *b, size_t n) { return memcpy(a, b, n); }\n"
    )
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(tmp_path / "v.so"), str(tmp_path / "v.c")], check=True)
    data = bytearray((tmp_path / "v.so").read_bytes())
    elf = ELFFile(io.BytesIO(bytes(data)))
    i = next(n for n, sec in enumerate(elf.iter_sections()) if sec["sh_type"] == "SHT_GNU_verneed")
    header = elf["e_shoff"] + i * elf["e_shentsize"]
    struct.pack_into("<I", data, header + 44, 2**31)  # sh_info: the number of entries
    first = elf.get_section(i)["sh_offset"]
    struct.pack_into("<I", data, first + 12, 0)  # vn_next of the first entry: itself, forever
    members = pure_wheel_members()
    members["demo_pkg/_native.so"] = bytes(data)
    t0 = time.perf_counter()
    code, report, _ = _audit(_pair(tmp_path, members), capsys)
    assert time.perf_counter() - t0 < 30
    assert code == 1
    (f,) = _rules(report)["wheel.unreadable"]
    assert "more than 16384 version entries" in f["message"]


@pytest.fixture(scope="module")
def release(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    work = tmp_path_factory.mktemp("hostile-release")
    files = {"sgl_kernel/sm90/libflash.so": compressible(50_000, 1), "sgl_kernel/sm100/libflash.so": b"x" * 1000}
    return release_wheels(work / "dist", files, work / "build")


def _copy(release: list[Path], where: Path, change: str, fn: Any) -> Path:
    where.mkdir()
    for w in release:
        members = read_members(w)
        if w.name.startswith(change):
            members = fn(members)
        write_wheel(where / w.name, members)
    return where


def test_a_payload_manifest_of_the_wrong_shape(
    release: list[Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def reshape(members: dict[str, bytes]) -> dict[str, bytes]:
        doc = json.loads(members["sgl_kernel/_kt_payload.json"])
        doc["parts"][1]["distribution"] = 3.5
        doc["archive"]["window_log"] = None
        return {**members, "sgl_kernel/_kt_payload.json": json.dumps(doc).encode()}

    code, report, _ = _audit(_copy(release, tmp_path / "dist", "sglang_kernel_kt", reshape), capsys)
    assert code == 1
    (f,) = _rules(report)["payload.manifest"]
    assert "at $.archive.window_log: None is not of type 'integer'" in f["message"]


def test_an_invalid_requires_dist_in_the_manifest_wheel(
    release: list[Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def bad_requirement(members: dict[str, bytes]) -> dict[str, bytes]:
        name = next(n for n in members if n.endswith("/METADATA"))
        return {**members, name: members[name] + b"Requires-Dist: ]]not a requirement[[\n"}

    code, report, _ = _audit(_copy(release, tmp_path / "dist", "sglang_kernel_kt", bad_requirement), capsys)
    assert code == 1
    assert "wheel.requires-dist" in _rules(report)


def test_a_part_with_a_crc_error(release: list[Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    where = _copy(release, tmp_path / "dist", "", lambda m: m)
    carrier = next(w for w in where.iterdir() if w.name.startswith("ktransformers"))
    member = next(n for n in zipfile.ZipFile(carrier).namelist() if "/_kt_payload/" in n)
    _damage(carrier, member, lambda b: b[:-40] + bytes(b[-40] ^ 0xFF for _ in range(1)) + b[-39:])
    code, report, _ = _audit(where, capsys)
    assert code == 1
    messages = [f["message"] for f in _rules(report)["payload.archive-mismatch"]]
    assert any(f"{carrier.name}!{member}: cannot read the part" in m for m in messages), messages


HOSTILE = "evil\x1b[2K\rPASSED: 0 errors\u202e\u2028## heading | cell <!-- `x`"


def test_names_and_messages_are_escaped_in_terminal_and_markdown() -> None:
    report = {
        "passed": False,
        "elapsed_s": 0.1,
        "wheels": [{"filename": HOSTILE, "size": 1, "errors": 1}],
        "findings": [
            {"rule": "wheel.unreadable", "severity": "error", "wheel": HOSTILE, "member": HOSTILE, "message": HOSTILE}
            | {"fix": HOSTILE}
        ],
        "cpu_variants": {},
        "cuda_architectures": {HOSTILE: {"x": HOSTILE}},
        "payload": {},
    }
    term = to_terminal(report)
    for raw in ("\x1b", "\r", "\u202e", "\u2028"):
        assert raw not in term
    assert "\\x1b[2K\\x0dPASSED" in term
    assert term.rstrip().splitlines()[-1].startswith("FAILED")
    md = to_markdown(report)
    for raw in ("\x1b", "\r", "\u202e", "\u2028", "<!--", "\n## heading"):
        assert raw not in md
    cells = [line for line in md.splitlines() if line.startswith("| error")]
    assert len(cells) == 1
    assert cells[0].count("|") - cells[0].count("\\|") == 7  # six cells, no extra column from the name
    assert json.loads(json.dumps(report))["findings"][0]["member"] == HOSTILE  # the JSON keeps the bytes


def test_printable_helpers() -> None:
    assert printable("plain name.so") == "plain name.so"
    assert printable("a\nb\u200fc") == "a\\x0ab\\u200fc"
    assert md_text("a|b*c") == "a\\|b\\*c"
    assert md_code("x`|<y>") == "<code>x`&#124;&lt;y&gt;</code>"


def _many_headers_elf(code: bytes, headers: int) -> bytes:
    """An x86-64 ELF whose `headers` executable section headers all describe the same bytes of code
    (section 1 is .shstrtab; past 0xff00 headers the count lives in section 0's sh_size, as ELF says)."""
    ehsize, phsize, shsize = 64, 56, 64
    shstr = b"\0.text\0.shstrtab\0"
    code_off = ehsize + phsize
    str_off = code_off + len(code)
    sh_off = (str_off + len(shstr) + 7) // 8 * 8
    count = headers + 2
    ident = b"\x7fELF" + bytes([2, 1, 1, 0]) + bytes(8)
    head = ident + struct.pack(
        "<HHIQQQIHHHHHH",
        3,
        62,
        1,
        0,
        ehsize,
        sh_off,
        0,
        ehsize,
        phsize,
        1,
        shsize,
        count if count < 0xFF00 else 0,
        1,
    )
    phdr = struct.pack("<IIQQQQQQ", 1, 5, 0, 0, 0, str_off, str_off, 0x1000)
    sections = [struct.pack("<IIQQQQIIQQ", 0, 0, 0, 0, 0, count if count >= 0xFF00 else 0, 0, 0, 0, 0)]
    sections.append(struct.pack("<IIQQQQIIQQ", 7, 3, 0, 0, str_off, len(shstr), 0, 0, 1, 0))
    text = struct.pack("<IIQQQQIIQQ", 1, 1, 0x6, code_off, code_off, len(code), 0, 0, 16, 0)
    sections += [text] * headers
    body = head + phdr + code + shstr
    return body + bytes(sh_off - len(body)) + b"".join(sections)


def test_65535_section_headers_over_one_code_range_are_read_and_disassembled_once() -> None:
    """Each byte of code is read (and later disassembled) at most once per file, however many headers name
    it: before, 65535 headers over 1 MiB cost about 64 GiB and hours."""
    from audits.readers._elf import read_elf
    from audits.readers._isa import feature_uses

    code = bytes.fromhex("c5fd58c1") * 4096  # vaddpd ymm0, ymm0, ymm1: AVX, 16 KiB of it
    elf = read_elf("kt_kernel/_core.abi3.so", _many_headers_elf(code, 65535))
    assert elf is not None
    assert sum(len(c) for _, _, c in elf.exec_sections) == len(code)
    uses = feature_uses(elf)
    assert uses["AVX"].count == 4096


def test_overlapping_code_sections_are_merged_not_repeated() -> None:
    from audits.readers._elf import _code_once

    stream = io.BytesIO(bytes(range(256)) * 16)  # 4 KiB
    ranges = [(0, 1024, ".a", 0x1000), (512, 1024, ".b", 0x2000), (512, 100, ".c", 0x3000), (4000, 10**9, ".d", 0)]
    got = _code_once(stream, ranges)
    assert [(n, addr, len(data)) for n, addr, data in got] == [
        (".a", 0x1000, 1024),
        (".b", 0x2000 + 512, 512),
        (".d", 0, 96),
    ]
    assert sum(len(d) for _, _, d in got) == 1024 + 512 + 96  # every byte once, nothing past the file's end


class _Counted(io.BytesIO):
    """A stream that counts the bytes read from it."""

    read_bytes = 0

    def read(self, n: int | None = -1) -> bytes:
        data = super().read(n)
        self.read_bytes += len(data)
        return data


def _elf_with(code: bytes, rela: bytes, rela_headers: int) -> bytes:
    """An x86-64 shared object: one .text over `code`, and `rela_headers` SHT_RELA headers all over `rela`."""
    ehsize, phsize, shsize = 64, 56, 64
    shstr = b"\0.text\0.shstrtab\0.rela\0"
    code_off = ehsize + phsize
    rela_off = code_off + len(code)
    str_off = rela_off + len(rela)
    sh_off = (str_off + len(shstr) + 7) // 8 * 8
    count = rela_headers + 3
    ident = b"\x7fELF" + bytes([2, 1, 1, 0]) + bytes(8)
    fields = (3, 62, 1, 0, ehsize, sh_off, 0, ehsize, phsize, 1, shsize, count if count < 0xFF00 else 0, 1)
    head = ident + struct.pack("<HHIQQQIHHHHHH", *fields)
    phdr = struct.pack("<IIQQQQQQ", 1, 5, 0, 0, 0, str_off, str_off, 0x1000)
    sections = [struct.pack("<IIQQQQIIQQ", 0, 0, 0, 0, 0, count if count >= 0xFF00 else 0, 0, 0, 0, 0)]
    sections.append(struct.pack("<IIQQQQIIQQ", 7, 3, 0, 0, str_off, len(shstr), 0, 0, 1, 0))
    sections.append(struct.pack("<IIQQQQIIQQ", 1, 1, 0x6, code_off, code_off, len(code), 0, 0, 16, 0))
    sections += [struct.pack("<IIQQQQIIQQ", 17, 4, 0x2, 0, rela_off, len(rela), 0, 0, 8, 24)] * rela_headers
    body = head + phdr + code + rela + shstr
    return body + bytes(sh_off - len(body)) + b"".join(sections)


def test_65535_relocation_headers_over_one_table_are_read_once_by_the_ifunc_scan() -> None:
    """The ISA sample's ifunc scan read every relocation section's bytes per header (a 10 KiB wheel: 8 s); each
    byte is read once now, and an IRELATIVE entry behind the repeated headers is still found."""
    from audits.readers._elf import read_elf_stream

    code = bytes.fromhex("c5fd58c1") * 1024  # AVX: above the baseline, so the sample looks for a dispatch
    plain = struct.pack("<QQq", 0x1000, 8, 0) * 2000  # R_X86_64_RELATIVE entries, 48 KB
    irelative = plain + struct.pack("<QQq", 0x2000, 37, 0)
    for rela, dispatch in ((plain, ""), (irelative, "has ifunc relocations")):
        data = _elf_with(code, rela, 65535)
        stream = _Counted(data)
        t0 = time.perf_counter()
        facts = read_elf_stream("lib/libx.so", stream, code=False, exports=False, isa_budget=1 << 20)
        assert time.perf_counter() - t0 < 20
        assert facts.isa_sample is not None
        assert facts.isa_sample.dispatch.startswith(dispatch)
        assert stream.read_bytes < 3 * len(data), "each byte read a bounded number of times, not per header"


def test_the_cpuid_search_decodes_inside_the_sample_budget() -> None:
    """Code crafted of `0f a2` pairs inside immediates (mov eax, 0xa20f) made the cpuid search decode every
    pair outside any budget (about 12 minutes for one crafted library); its candidates count against the
    sample budget now, and a real cpuid within it is still found."""
    from audits.readers._elf import read_elf_stream

    avx = bytes.fromhex("c5fd58c1") * 64 + b"\x90" * 32  # above the baseline: the sample asks for a dispatch
    decoy = bytes.fromhex("b80fa20000") * ((8 << 20) // 5)  # 8 MiB, 1.7 million candidates, no cpuid
    t0 = time.perf_counter()
    facts = read_elf_stream("lib/libx.so", io.BytesIO(_elf_with(avx + decoy, b"", 0)), code=False, isa_budget=64 << 10)
    assert time.perf_counter() - t0 < 5
    assert facts.isa_sample is not None
    assert facts.isa_sample.dispatch == ""
    real = avx + decoy[:5000] + bytes.fromhex("0fa2") + decoy
    found = read_elf_stream("lib/libx.so", io.BytesIO(_elf_with(real, b"", 0)), code=False, isa_budget=64 << 10)
    assert found.isa_sample is not None
    assert found.isa_sample.dispatch.startswith("executes cpuid")
