"""Every audit rule rejects an artifact built with exactly its defect, and the
real kt-kernel wheel passes with zero errors."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import pytest

from audits import RULES, audit_wheel, load_policy, run
from audits.policy import DEFAULT_POLICY
from audits.readers._cuda import find_cuobjdump
from tests.wheelkit import compile_so, pure_wheel_members, read_members, retag, write_wheel

POLICY = load_policy()
THIRD = load_policy("third-party")
LADDER = DEFAULT_POLICY.parent / "cpu_variants.json"  # a policy copied elsewhere names the ladder absolutely
AVX2_LOOP = """
#include <immintrin.h>
__attribute__((visibility("default"))) void kt_cpu_variant_ops(float *a, const float *b, int n) {
  for (int i = 0; i < n; i += 8)
    _mm256_storeu_ps(a + i, _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), _mm256_loadu_ps(a + i)));
}
"""


def rules_of(path: Path, policy: Any = POLICY, baseline: dict[str, Any] | None = None) -> set[str]:
    return {f.rule for f in audit_wheel(path, policy, baseline).findings if f.severity == "error"}


@pytest.fixture(scope="module")
def members(kt_wheel: Path) -> dict[str, bytes]:
    return read_members(kt_wheel)


@pytest.fixture
def out(tmp_path: Path, kt_wheel: Path) -> Path:
    return tmp_path / kt_wheel.name


@pytest.fixture(scope="module")
def tag(kt_wheel: Path) -> str:
    """The kernel wheel's platform tag, as its build chose it (manylinux_2_24_x86_64: test_kernel_wheel.py)."""
    return kt_wheel.name[:-4].rsplit("-", 1)[1]


def test_clean_kt_kernel_wheel_has_zero_findings(kt_wheel: Path) -> None:
    res = audit_wheel(kt_wheel, POLICY)
    assert [f for f in res.findings if f.severity == "error"] == []
    assert all(v["marker_present"] for n, v in res.cpu.items() if n != "loader")
    assert res.cpu["loader"]["above_baseline"] == []


def test_clean_pure_wheel_passes(tmp_path: Path) -> None:
    w = write_wheel(tmp_path / "demo_pkg-1.0-py3-none-any.whl", pure_wheel_members(requires=("numpy>=1",)))
    assert rules_of(w) == set()


# --- 1. wheel integrity and metadata -------------------------------------------------


def test_tampered_member_behind_unchanged_record(members: dict[str, bytes], out: Path) -> None:
    m = dict(members)
    m["kt_kernel/_cpu.py"] += b"\n# tampered\n"
    assert rules_of(write_wheel(out, m, regenerate_record=False)) == {"wheel.record-mismatch"}


@pytest.mark.parametrize("wrong_first", [True, False], ids=["wrong-row-first", "wrong-row-last"])
def test_a_record_path_listed_twice_is_judged_row_by_row(
    members: dict[str, bytes], out: Path, wrong_first: bool
) -> None:
    """An installer may take either row of a path RECORD lists twice: whichever is wrong, it is a mismatch."""
    w = write_wheel(out, members)
    m = read_members(w)
    record = next(n for n in m if n.endswith(".dist-info/RECORD"))
    rows = m[record].decode().splitlines()
    (good,) = [r for r in rows if r.startswith("kt_kernel/_cpu.py,")]
    bad = "kt_kernel/_cpu.py,sha256=" + "A" * 43 + ",1"
    pair = [bad, good] if wrong_first else [good, bad]
    m[record] = ("\n".join(x for r in rows for x in (pair if r == good else [r])) + "\n").encode()
    res = audit_wheel(write_wheel(out, m, regenerate_record=False), POLICY)
    (f,) = [f for f in res.findings if f.rule == "wheel.record-mismatch"]
    assert f.member == "kt_kernel/_cpu.py"
    assert f"(row {1 if wrong_first else 2} of the 2 that list it)" in f.message


def test_member_missing_from_record(members: dict[str, bytes], out: Path) -> None:
    w = write_wheel(out, members)  # RECORD now correct; add a member after it
    m = read_members(w)
    m["kt_kernel/extra.py"] = b"x = 1\n"
    assert rules_of(write_wheel(out, m, regenerate_record=False)) == {"wheel.record-unlisted"}


def test_record_lists_a_missing_file(members: dict[str, bytes], out: Path) -> None:
    m = read_members(write_wheel(out, members))
    del m["kt_kernel/_moe.py"]
    assert rules_of(write_wheel(out, m, regenerate_record=False)) == {"wheel.record-phantom"}


def test_no_record(members: dict[str, bytes], out: Path) -> None:
    m = {n: d for n, d in members.items() if not n.endswith("/RECORD")}
    assert rules_of(write_wheel(out, m, regenerate_record=False)) == {"wheel.record-missing"}


def test_wheel_tag_lines_differ_from_filename(members: dict[str, bytes], out: Path, tag: str) -> None:
    assert rules_of(write_wheel(out, retag(members, tag, "manylinux_2_35_x86_64"))) == {"wheel.wheel-file"}


def test_native_wheel_claiming_purelib(members: dict[str, bytes], out: Path) -> None:
    m = {
        n: (d.replace(b"Root-Is-Purelib: false", b"Root-Is-Purelib: true") if n.endswith("/WHEEL") else d)
        for n, d in members.items()
    }
    assert rules_of(write_wheel(out, m)) == {"wheel.purelib"}


def test_metadata_name_differs_from_filename(tmp_path: Path) -> None:
    m = pure_wheel_members()
    m["demo_pkg-1.0.dist-info/METADATA"] = m["demo_pkg-1.0.dist-info/METADATA"].replace(
        b"Name: demo-pkg", b"Name: other"
    )
    assert rules_of(write_wheel(tmp_path / "demo_pkg-1.0-py3-none-any.whl", m)) == {"wheel.metadata"}


def test_metadata_version_differs_from_filename(tmp_path: Path) -> None:
    m = pure_wheel_members()
    assert rules_of(write_wheel(tmp_path / "demo_pkg-1.1-py3-none-any.whl", m)) == {"wheel.metadata"}


def test_unparseable_requires_dist(tmp_path: Path) -> None:
    m = pure_wheel_members(requires=("transformers-kt ==5.6.0.post2 ;; extra",))
    assert rules_of(write_wheel(tmp_path / "demo_pkg-1.0-py3-none-any.whl", m)) == {"wheel.requires-dist"}


def test_missing_requires_python(tmp_path: Path) -> None:
    m = pure_wheel_members(requires_python=None)
    assert rules_of(write_wheel(tmp_path / "demo_pkg-1.0-py3-none-any.whl", m)) == {"wheel.requires-python"}


def test_stray_pycache(members: dict[str, bytes], out: Path) -> None:
    m = dict(members)
    m["kt_kernel/__pycache__/_cpu.cpython-311.pyc"] = b"\x00" * 16
    assert rules_of(write_wheel(out, m)) == {"wheel.stray-content"}


def test_duplicate_zip_member(tmp_path: Path) -> None:
    path = write_wheel(tmp_path / "demo_pkg-1.0-py3-none-any.whl", pure_wheel_members())
    import zipfile

    with zipfile.ZipFile(path, "a") as zf, pytest.warns(UserWarning, match="Duplicate name"):
        zf.writestr("demo_pkg/__init__.py", b"VALUE = 2\n")
    # the second copy's bytes are not the ones RECORD hashed: that mismatch is this defect's too
    assert rules_of(path) == {"wheel.duplicate-member", "wheel.record-mismatch"}


def test_not_a_zip(tmp_path: Path) -> None:
    path = tmp_path / "demo_pkg-1.0-py3-none-any.whl"
    path.write_bytes(b"not a zip")
    assert rules_of(path) == {"wheel.unreadable"}


# --- 2. tags ---------------------------------------------------------------------------


def test_extension_suffix_for_another_python(members: dict[str, bytes], out: Path) -> None:
    """The cp311-abi3 wheel whose extension is built for CPython 3.12 only (its version-specific suffix)."""
    (core,) = [n for n in members if n.startswith("kt_kernel/_core.") and n.endswith(".abi3.so")]
    m = {(n.replace(".abi3.so", ".cpython-312-x86_64-linux-gnu.so") if n == core else n): d for n, d in members.items()}
    assert rules_of(write_wheel(out, m)) == {"tag.ext-suffix"}


def test_overclaiming_manylinux_tag(members: dict[str, bytes], tmp_path: Path, kt_wheel: Path, tag: str) -> None:
    """The kernel's CPU variants need GLIBCXX_3.4.22 (libstdc++ of GCC 6); manylinux_2_17 is a lie."""
    path = tmp_path / kt_wheel.name.replace(tag, "manylinux_2_17_x86_64")
    res = audit_wheel(write_wheel(path, retag(members, tag, "manylinux_2_17_x86_64")), POLICY)
    over = [f for f in res.findings if f.rule == "tag.manylinux-overclaim"]
    assert over
    assert any("GLIBCXX_3.4.22" in f.message for f in over)
    # one finding per library and limiting reason, however many versions and symbols
    keys = [(f.member, f.message.split(" from ")[1].split(",")[0], f.message.split("_")[0]) for f in over]
    assert len(keys) == len(set(keys)), [f.message for f in over]
    assert len(over) <= 4 * len({f.member for f in over})  # libc, libm (GLIBC), libstdc++ (GLIBCXX, CXXABI)


def test_isa_level_above_baseline_under_a_manylinux_tag(members: dict[str, bytes], out: Path, tmp_path: Path) -> None:
    """auditwheel allows no manylinux tag to a library whose GNU property note needs x86-64-v3."""
    lib = compile_so(tmp_path, "v3.so", "int kt_cuda_v3(void) { return 3; }", "-Wl,-z,x86-64-v3")
    res = audit_wheel(write_wheel(out, _with_lib(members, "kt_kernel/v3.so", lib)), POLICY)
    assert {f.rule for f in res.findings if f.severity == "error"} == {"tag.isa-level"}
    assert res.platform == "linux_x86_64"
    assert "x86_64_v3" in res.platform_reason


def test_symbol_the_policy_forbids(members: dict[str, bytes], out: Path, tmp_path: Path) -> None:
    """zlib's internal _tr_init is on auditwheel's blacklist for libz.so.1 in every manylinux policy."""
    src = "extern void _tr_init(void *); void kt_cuda_z(void) { _tr_init(0); }"
    lib = compile_so(tmp_path, "z.so", src, "-Wl,--no-as-needed", "/lib/x86_64-linux-gnu/libz.so.1")
    res = audit_wheel(write_wheel(out, _with_lib(members, "kt_kernel/z.so", lib)), POLICY)
    (f,) = [f for f in res.findings if f.rule == "tag.forbidden-symbol"]
    assert "_tr_init (libz.so.1)" in f.message
    assert res.platform == "linux_x86_64"


def test_a_forbidden_symbol_found_through_a_sysv_hash_table_is_still_used(tmp_path: Path) -> None:
    """With only a SysV .hash table (no .gnu.hash), the hash lookup also returns undefined symbols: a strong
    reference to a forbidden one must still count (it was dropped as "defined here")."""
    import io

    from elftools.elf.elffile import ELFFile

    from audits.platforms import forbidden_symbols
    from audits.readers._elf import read_elf_stream

    src = "extern void _tr_init(void *); void kt_cuda_z(void) { _tr_init(0); }"
    flags = ("-Wl,--hash-style=sysv", "-Wl,--no-as-needed", "/lib/x86_64-linux-gnu/libz.so.1")
    lib = compile_so(tmp_path, "zsysv.so", src, *flags)
    with (tmp_path / "zsysv.so").open("rb") as f:
        names = {s.name for s in ELFFile(f).iter_sections()}
    assert ".hash" in names
    assert ".gnu.hash" not in names
    facts = read_elf_stream("z.so", io.BytesIO(lib), forbidden=forbidden_symbols())
    assert facts.forbidden_candidates == ("_tr_init",)


def test_a_weak_reference_to_a_forbidden_symbol_is_no_use(members: dict[str, bytes], out: Path, tmp_path: Path) -> None:
    """A weak undefined reference is optional (the library checks it for NULL and falls back, as Rust's
    std does with __cxa_thread_atexit_impl): no tag.forbidden-symbol, as auditwheel; the strong one of
    test_symbol_the_policy_forbids still is. Both compiled here, so the ELF binding is the real one."""
    src = "extern void _tr_init(void *) __attribute__((weak));void kt_cuda_z(void) { if (_tr_init) _tr_init(0); }"
    lib = compile_so(tmp_path, "zweak.so", src, "-Wl,--no-as-needed", "/lib/x86_64-linux-gnu/libz.so.1")
    from elftools.elf.elffile import ELFFile
    from elftools.elf.sections import SymbolTableSection

    with (tmp_path / "zweak.so").open("rb") as f:
        dynsym = ELFFile(f).get_section_by_name(".dynsym")
        assert isinstance(dynsym, SymbolTableSection)
        (sym,) = [s for s in dynsym.iter_symbols() if s.name == "_tr_init"]
        assert (sym.entry.st_shndx, sym.entry.st_info.bind) == ("SHN_UNDEF", "STB_WEAK")
    res = audit_wheel(write_wheel(out, _with_lib(members, "kt_kernel/zweak.so", lib)), POLICY)
    assert [f for f in res.findings if f.rule == "tag.forbidden-symbol"] == []
    assert res.platform != "linux_x86_64"


def test_native_library_in_an_any_wheel(tmp_path: Path) -> None:
    members = pure_wheel_members()
    members["demo_pkg/_speedups.so"] = compile_so(tmp_path, "s.so", "int s(void) { return 1; }")
    res = audit_wheel(write_wheel(tmp_path / "demo_pkg-1.0-py3-none-any.whl", members), POLICY)
    (f,) = [f for f in res.findings if f.rule == "tag.native-any"]
    assert (f.severity, f.member) == ("error", "demo_pkg/_speedups.so")


def test_a_fatbin_cuobjdump_cannot_read(members: dict[str, bytes], out: Path, tmp_path: Path) -> None:
    if find_cuobjdump() is None:
        pytest.fail("cuobjdump is required (lockfiles/test.txt installs nvidia-cuda-cuobjdump)")
    src = (
        '__attribute__((section(".nv_fatbin"), used)) static const char fatbin[256] = "not a fatbin";\n'
        "int kt_cuda_bad(void) { return 0; }"
    )
    wheel = write_wheel(out, _with_lib(members, "kt_kernel/bad.so", compile_so(tmp_path, "bad.so", src)))
    ours = [f for f in audit_wheel(wheel, POLICY).findings if f.rule == "cuda.fatbin-unreadable"]
    assert [(f.severity, f.member) for f in ours] == [("error", "kt_kernel/bad.so")]
    theirs = [f for f in audit_wheel(wheel, load_policy("third-party")).findings if f.rule == "cuda.fatbin-unreadable"]
    assert [f.severity for f in theirs] == ["warning"]


def test_plain_linux_tag_is_a_warning(members: dict[str, bytes], tmp_path: Path, kt_wheel: Path, tag: str) -> None:
    path = tmp_path / kt_wheel.name.replace(tag, "linux_x86_64")
    res = audit_wheel(write_wheel(path, retag(members, tag, "linux_x86_64")), POLICY)
    assert [f.severity for f in res.findings if f.rule == "tag.not-portable"] == ["warning"]


# --- 3-4. ELF/ABI and RPATH --------------------------------------------------------------


def _with_lib(members: dict[str, bytes], member: str, data: bytes) -> dict[str, bytes]:
    m = dict(members)
    m[member] = data
    return m


def test_libcudart_in_needed(members: dict[str, bytes], out: Path, tmp_path: Path) -> None:
    compile_so(tmp_path, "libcudart.so.13", "int cudaFree(void *p) { return 0; }", "-Wl,-soname,libcudart.so.13")
    lib = compile_so(
        tmp_path,
        "libkt_cuda.so",
        "int cudaFree(void*); int kt_cuda_free(void) { return cudaFree(0); }",
        f"-L{tmp_path}",
        "-l:libcudart.so.13",
        "-Wl,-rpath,$ORIGIN",
    )
    res = rules_of(write_wheel(out, _with_lib(members, "kt_kernel/libkt_cuda.so", lib)))
    # libcudart.so.13 is bundled beside it ($ORIGIN), so only the forbidden-dependency rule fires
    assert res == {"elf.needed-forbidden"}


def test_executable_stack(members: dict[str, bytes], out: Path, tmp_path: Path) -> None:
    lib = compile_so(tmp_path, "x.so", "int kt_cuda_x(void) { return 1; }", "-Wl,-z,execstack")
    assert rules_of(write_wheel(out, _with_lib(members, "kt_kernel/x.so", lib))) == {"elf.execstack"}


def test_text_relocations(members: dict[str, bytes], out: Path, tmp_path: Path) -> None:
    asm = (
        ".text\n.globl kt_cuda_addr\nkt_cuda_addr:\n movabs $value, %rax\n ret\n.data\nvalue: .quad 0\n"
        '.section .note.GNU-stack,"",@progbits\n'
    )
    lib = compile_so(tmp_path, "t.so", asm, "-Wl,-z,notext", lang="asm")
    assert rules_of(write_wheel(out, _with_lib(members, "kt_kernel/t.so", lib))) == {"elf.textrel"}


def test_rwx_segment(members: dict[str, bytes], out: Path, tmp_path: Path) -> None:
    asm = (
        '.section .kt_rwx,"awx",@progbits\n.globl kt_cuda_rwx\nkt_cuda_rwx: ret\n'
        '.section .note.GNU-stack,"",@progbits\n'
    )
    lib = compile_so(tmp_path, "r.so", asm, "-Wl,--no-warn-rwx-segments", lang="asm")
    assert rules_of(write_wheel(out, _with_lib(members, "kt_kernel/r.so", lib))) == {"elf.rwx-segment"}


def test_undeclared_exports(members: dict[str, bytes], out: Path, tmp_path: Path) -> None:
    lib = compile_so(tmp_path, "e.so", "int helper_leaks(void) { return 1; }")
    assert rules_of(write_wheel(out, _with_lib(members, "kt_kernel/e.so", lib))) == {"elf.exports"}


def test_absolute_rpath(members: dict[str, bytes], out: Path, tmp_path: Path) -> None:
    lib = compile_so(tmp_path, "a.so", "int kt_cuda_a(void) { return 1; }", "-Wl,-rpath,/usr/local/cuda/lib64")
    res = audit_wheel(write_wheel(out, _with_lib(members, "kt_kernel/a.so", lib)), POLICY)
    assert any(f.rule == "rpath.not-origin" and "/usr/local/cuda/lib64" in f.message for f in res.findings)


def test_needed_library_not_in_the_wheel(members: dict[str, bytes], out: Path, tmp_path: Path) -> None:
    compile_so(tmp_path, "libhelper.so.1", "int h(void) { return 1; }", "-Wl,-soname,libhelper.so.1")
    lib = compile_so(
        tmp_path,
        "n.so",
        "int h(void); int kt_cuda_n(void) { return h(); }",
        f"-L{tmp_path}",
        "-l:libhelper.so.1",
        "-Wl,-rpath,$ORIGIN/../kt_kernel.libs",
    )
    assert rules_of(write_wheel(out, _with_lib(members, "kt_kernel/n.so", lib))) == {"rpath.unresolved"}
    helper = (tmp_path / "libhelper.so.1").read_bytes()
    fixed = _with_lib(_with_lib(members, "kt_kernel/n.so", lib), "kt_kernel.libs/libhelper.so.1", helper)
    assert "rpath.unresolved" not in rules_of(write_wheel(out, fixed))


# --- 5. ISA --------------------------------------------------------------------------------


def test_avx512_instruction_in_the_avx2_variant(members: dict[str, bytes], out: Path, tmp_path: Path) -> None:
    src = (
        AVX2_LOOP
        + """
__attribute__((target("avx512f"))) void widen(int *a) {
  _mm512_storeu_si512(a, _mm512_add_epi32(_mm512_loadu_si512(a), _mm512_set1_epi32(1)));
}"""
    )
    lib = compile_so(tmp_path, "v.so", src, "-mavx2", "-mfma")
    res = audit_wheel(write_wheel(out, _with_lib(members, "kt_kernel/cpu/libkt_cpu_avx2.so", lib)), POLICY)
    bad = [f for f in res.findings if f.rule == "isa.forbidden-feature"]
    assert bad
    assert "AVX512F" in bad[0].message
    assert "widen" in bad[0].message


def test_vnni_variant_without_vnni_code_is_mislabeled(members: dict[str, bytes], out: Path) -> None:
    m = _with_lib(members, "kt_kernel/cpu/libkt_cpu_avx512_vnni.so", members["kt_kernel/cpu/libkt_cpu_avx512_base.so"])
    res = rules_of(write_wheel(out, m))
    # the ISA rule and the manifest's claim about the same library; the copy also stores the
    # base variant's bytes twice
    assert res == {"isa.marker-missing", "manifest.claim", "wheel.duplicate-library"}


def test_loader_above_baseline(members: dict[str, bytes], out: Path, tmp_path: Path) -> None:
    (core,) = [n for n in members if n.startswith("kt_kernel/_core.") and n.endswith(".so")]
    lib = compile_so(tmp_path, "core.so", AVX2_LOOP, "-mavx2", "-mfma")
    assert rules_of(write_wheel(out, _with_lib(members, core, lib))) == {"isa.loader-above-baseline"}


def test_variant_missing(members: dict[str, bytes], out: Path) -> None:
    m = {n: d for n, d in members.items() if not n.endswith("libkt_cpu_amx.so")}
    res = rules_of(write_wheel(out, m))
    assert {"isa.variant-missing", "manifest.claim"} <= res


# --- 7. size -------------------------------------------------------------------------------


def test_over_budget(members: dict[str, bytes], out: Path, tmp_path: Path) -> None:
    policy_file = tmp_path / "policy.toml"
    text = DEFAULT_POLICY.read_text().replace("wheel_budget_mib = 100", "wheel_budget_mib = 1")
    policy_file.write_text(text.replace('ladder = "cpu_variants.json"', f'ladder = "{LADDER}"'))
    m = _with_lib(members, "kt_kernel/blob.bin", os.urandom(2 << 20))
    res = audit_wheel(write_wheel(out, m), load_policy(policy_file))
    over = [f for f in res.findings if f.rule == "size.wheel-budget"]
    assert over
    assert "kt_kernel/blob.bin" in over[0].message


def test_growth_against_baseline(kt_wheel: Path) -> None:
    size = kt_wheel.stat().st_size
    assert rules_of(kt_wheel, baseline={"kt-kernel": size // 2}) == {"size.growth"}
    assert "size.growth" not in rules_of(kt_wheel, baseline={"kt-kernel": size})


# --- 8. build manifest -----------------------------------------------------------------


def test_manifest_missing(members: dict[str, bytes], out: Path) -> None:
    m = {n: d for n, d in members.items() if n != "kt_kernel/_build.json"}
    assert rules_of(write_wheel(out, m)) == {"manifest.missing"}


def test_manifest_claims_wrong_features(members: dict[str, bytes], out: Path) -> None:
    data = json.loads(members["kt_kernel/_build.json"])
    data["variants"]["avx2"]["features"].append("AVX512F")
    m = _with_lib(members, "kt_kernel/_build.json", json.dumps(data).encode())
    assert rules_of(write_wheel(out, m)) == {"manifest.claim"}


def test_manifest_wrong_sha256(members: dict[str, bytes], out: Path) -> None:
    data = json.loads(members["kt_kernel/_build.json"])
    data["variants"]["avx2"]["sha256"] = "0" * 64
    m = _with_lib(members, "kt_kernel/_build.json", json.dumps(data).encode())
    assert rules_of(write_wheel(out, m)) == {"manifest.claim"}


def test_unlisted_native_library(members: dict[str, bytes], out: Path) -> None:
    m = _with_lib(members, "kt_kernel/cpu/libkt_cpu_avx10.so", members["kt_kernel/cpu/libkt_cpu_avx2.so"])
    # made as a copy of avx2's library, so its bytes are stored twice as well
    assert rules_of(write_wheel(out, m)) == {"manifest.unlisted", "wheel.duplicate-library"}


# --- the CLI and the report ----------------------------------------------------------------


def test_cli_writes_report_and_exits_nonzero_on_errors(
    kt_wheel: Path, members: dict[str, bytes], out: Path, tmp_path: Path
) -> None:
    from audits.__main__ import main

    rep = tmp_path / "report.json"
    assert main([str(kt_wheel), "--json", str(rep), "--markdown", str(tmp_path / "r.md")]) == 0
    data = json.loads(rep.read_text())
    assert data["schema_version"] == 1
    assert data["passed"] is True
    assert "cpu_variants" in data
    assert "cuda_architectures" in data
    bad = tmp_path / "bad"
    bad.mkdir()
    m = dict(members)
    m["kt_kernel/_cpu.py"] += b"#"
    write_wheel(bad / kt_wheel.name, m, regenerate_record=False)
    assert main([str(bad), "--json", str(rep)]) == 1
    f = json.loads(rep.read_text())["findings"][0]
    assert set(f) == {"rule", "severity", "wheel", "member", "message", "fix"}


def _asserted_strings(path: Path) -> set[str]:
    """String constants a test checks: inside an assert, a comparison (``f.rule == "x"``, ``"x" in
    rules``), a subscript (``rules["x"]``) or the rule argument of a findings helper
    (``_findings(dist, "x")``); never a docstring, a comment or a bare list."""
    import ast

    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        roots: list[ast.AST] = [node] if isinstance(node, ast.Assert | ast.Compare) else []
        if isinstance(node, ast.Subscript):
            roots = [node.slice]
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and "finding" in node.func.id:
            roots = list(node.args)
        for root in roots:
            found |= {c.value for c in ast.walk(root) if isinstance(c, ast.Constant) and isinstance(c.value, str)}
    return found


def test_every_rule_has_a_negative_test() -> None:
    """Each rule id is checked (asserted or compared, not merely mentioned) by a test that builds its
    defect: this file, the audit's other integration tests, or the unit tests that feed the analyzers
    made-up facts."""
    here = Path(__file__).resolve()
    files = [here, *here.parent.glob("test_audit_*.py"), *(here.parents[1] / "unit").glob("test_*.py")]
    checked = set().union(*(_asserted_strings(f) for f in files))
    untested = [r for r in RULES if r not in checked]
    assert untested == []


def test_run_over_a_directory(kt_wheel: Path) -> None:
    report = run([kt_wheel.parent], POLICY)
    assert report["passed"]


# --- 6. CUDA archive ---------------------------------------------------------------------

PAYLOAD = "kt_kernel/cuda_archive/kt_cuda.tar.xz"


def _repack(members: dict[str, bytes], files: dict[str, bytes], extra: Any = None) -> dict[str, bytes]:
    """The wheel's members with a new payload, and a manifest that describes it honestly."""
    import hashlib
    import io
    import lzma
    import tarfile

    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        for name, data in sorted(files.items()):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        if extra is not None:
            tar.addfile(extra, io.BytesIO(b"x" * extra.size))
    payload = lzma.compress(raw.getvalue())
    manifest = json.loads(members["kt_kernel/_build.json"])
    manifest["cuda"]["sha256"] = hashlib.sha256(payload).hexdigest()
    manifest["cuda"]["files"] = {
        n: {"sha256": hashlib.sha256(d).hexdigest(), "sass": [], "ptx": []} for n, d in files.items()
    }
    return _with_lib(_with_lib(members, PAYLOAD, payload), "kt_kernel/_build.json", json.dumps(manifest).encode())


def _payload_files(members: dict[str, bytes]) -> dict[str, bytes]:
    import io
    import tarfile

    with tarfile.open(fileobj=io.BytesIO(members[PAYLOAD]), mode="r:xz") as tar:
        return {i.name: tar.extractfile(i).read() for i in tar if i.isfile()}  # type: ignore[union-attr]


def _nvcc() -> str:
    from audits.readers._cuda import find_cuobjdump

    tool = find_cuobjdump()
    nvcc = Path(tool).with_name("nvcc") if tool else None
    if nvcc is None or not nvcc.exists():
        pytest.fail("nvcc missing: lockfiles/test.txt installs the CUDA toolchain")
    return str(nvcc)


def test_cuda_library_missing_an_arch_and_kernels(members: dict[str, bytes], out: Path, tmp_path: Path) -> None:
    import subprocess

    src = tmp_path / "k.cu"
    src.write_text(
        "__global__ void router_topk_kernel(float *x) { x[threadIdx.x] = 1.f; }\n"
        'extern "C" __attribute__((visibility("default"))) int kt_cuda_abi_version(void) { return 1; }\n'
    )
    lib = tmp_path / "libkt_cuda.so"
    subprocess.run(
        [
            _nvcc(),
            "-shared",
            "-Xcompiler",
            "-fPIC",
            "-cudart",
            "static",
            "-gencode",
            "arch=compute_80,code=sm_80",
            "-o",
            str(lib),
            str(src),
        ],
        check=True,
    )
    files = _payload_files(members)
    files["lib/libkt_cuda.so"] = lib.read_bytes()
    res = audit_wheel(write_wheel(out, _repack(members, files)), POLICY)
    rules = {f.rule for f in res.findings}
    assert {"cuda.arch-set", "cuda.kernel-missing"} <= rules
    arch = next(f for f in res.findings if f.rule == "cuda.arch-set")
    assert "sm_120" in arch.message
    assert any("dequant_int8_kernel" in f.message for f in res.findings if f.rule == "cuda.kernel-missing")


def test_ptx_newer_than_the_driver_floor(kt_wheel: Path, tmp_path: Path) -> None:
    policy_file = tmp_path / "policy.toml"
    text = DEFAULT_POLICY.read_text().replace('min_driver_ptx_isa = "9.5"', 'min_driver_ptx_isa = "8.0"')
    policy_file.write_text(text.replace('ladder = "cpu_variants.json"', f'ladder = "{LADDER}"'))
    assert rules_of(kt_wheel, load_policy(policy_file)) == {"cuda.ptx-version"}


def test_cuobjdump_missing_is_reported(kt_wheel: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KT_CUOBJDUMP", "/nonexistent/cuobjdump")
    res = audit_wheel(kt_wheel, POLICY)
    # An audit that could not look is not a pass.
    assert [f.severity for f in res.findings if f.rule == "cuda.tool-missing"] == ["error"]


def test_payload_member_escaping_the_root(members: dict[str, bytes], out: Path) -> None:
    import tarfile

    evil = tarfile.TarInfo("../../etc/evil.so")
    evil.size = 3
    assert rules_of(write_wheel(out, _repack(members, _payload_files(members), evil))) == {"cuda.payload"}


def test_payload_library_with_absolute_rpath(members: dict[str, bytes], out: Path, tmp_path: Path) -> None:
    files = _payload_files(members)
    files["lib/libextra.so"] = compile_so(
        tmp_path, "x.so", "int kt_cuda_x(void) { return 1; }", "-Wl,-rpath,/usr/local/cuda/lib64"
    )
    assert rules_of(write_wheel(out, _repack(members, files))) == {"rpath.not-origin"}


def test_clean_payload_is_rechecked_inside_its_layout(kt_wheel: Path) -> None:
    """The sm90a library resolves libkt_cuda.so through $ORIGIN/../lib inside the payload."""
    res = audit_wheel(kt_wheel, POLICY)
    assert res.cuda["libraries"]["sm90a/libkt_cuda_sm90a.so"]["sass"] == ["sm_90a"]
    arch_bytes = res.cuda["libraries"]["lib/libkt_cuda.so"]["arch_bytes"]
    assert set(arch_bytes) == {"sm_80", "sm_86", "sm_89", "sm_90", "sm_120"}
    assert all(b > 0 for b in arch_bytes.values())
    assert len(res.sizes["cpu_variants"]) == 6
    assert not [f for f in res.findings if f.rule.startswith(("rpath.", "cuda."))]


def test_waiver_downgrades_exactly_its_finding(tmp_path: Path) -> None:
    m = pure_wheel_members("compressed_tensors_kt", "0.18.0", requires_python=None)
    res = audit_wheel(write_wheel(tmp_path / "compressed_tensors_kt-0.18.0-py3-none-any.whl", m), POLICY)
    (f,) = [f for f in res.findings if f.rule == "wheel.requires-python"]
    assert f.severity == "info"
    assert f.message.startswith("waived (upstream compressed-tensors")
    other = write_wheel(tmp_path / "demo_pkg-1.0-py3-none-any.whl", pure_wheel_members(requires_python=None))
    assert rules_of(other) == {"wheel.requires-python"}


def test_a_foreign_architecture_library_in_a_real_wheel(members: dict[str, bytes], out: Path, tmp_path: Path) -> None:
    """A real x86_64 library with its e_machine turned into aarch64 (183): exactly the arch rule."""
    lib = bytearray(compile_so(tmp_path, "x.so", "int kt_cuda_x(void) { return 1; }"))
    lib[18:20] = (183).to_bytes(2, "little")
    found = audit_wheel(write_wheel(out, _with_lib(members, "kt_kernel/x.so", bytes(lib))), POLICY).findings
    assert {f.rule for f in found if f.member == "kt_kernel/x.so" and f.severity == "error"} == {"elf.arch-mismatch"}


def test_a_so_member_that_is_not_elf(members: dict[str, bytes], out: Path) -> None:
    found = audit_wheel(write_wheel(out, _with_lib(members, "kt_kernel/fake.so", b"not a library")), POLICY).findings
    assert {f.rule for f in found if f.severity == "error"} == {"elf.not-elf"}


def test_an_abi3_extension_in_a_cp311_wheel_is_valid(members: dict[str, bytes], out: Path, tmp_path: Path) -> None:
    lib = compile_so(tmp_path, "x.so", '__attribute__((visibility("default"))) void *PyInit_extra(void) { return 0; }')
    found = audit_wheel(write_wheel(out, _with_lib(members, "kt_kernel/extra.abi3.so", lib)), POLICY).findings
    assert [f for f in found if f.severity == "error"] == []


def test_embedded_cuda_code_without_cuobjdump_is_noted(
    members: dict[str, bytes], out: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Any ELF member with a .nv_fatbin section is listed; without the tool, the report says
    'cuda: not inspected' (a warning beside the payload's own tool-missing error)."""
    src = (
        '__attribute__((section(".nv_fatbin"), used)) static const char fatbin[64] = "x";\n'
        "int kt_cuda_y(void) { return 0; }"
    )
    wheel = write_wheel(out, _with_lib(members, "kt_kernel/dev.so", compile_so(tmp_path, "dev.so", src)))
    monkeypatch.setenv("KT_CUOBJDUMP", "/nonexistent/cuobjdump")
    res = audit_wheel(wheel, POLICY)
    noted = [f for f in res.findings if f.rule == "cuda.tool-missing" and f.member == "kt_kernel/dev.so"]
    assert [f.severity for f in noted] == ["warning"]
    assert noted[0].message.startswith("cuda: not inspected")
    assert res.cuda["embedded"] == {"inspected": False, "files": {"kt_kernel/dev.so": 64}}


# --- 2b. the libc family and the architecture, as auditwheel decides them ------------------


def _native(tmp_path: Path, tags: list[str], libs: dict[str, bytes]) -> Path:
    """demo_pkg, tagged with `tags` (one wheel file name), holding `libs` (member -> ELF bytes)."""
    members = pure_wheel_members()
    wheel = "Wheel-Version: 1.0\nGenerator: wheelkit\nRoot-Is-Purelib: false\n" + "".join(f"Tag: {t}\n" for t in tags)
    members["demo_pkg-1.0.dist-info/WHEEL"] = wheel.encode()
    members |= libs
    interp, abi = tags[0].split("-")[:2]
    platforms = ".".join(t.split("-")[2] for t in tags)
    return write_wheel(tmp_path / f"demo_pkg-1.0-{interp}-{abi}-{platforms}.whl", members)


def test_a_glibc_library_in_a_musllinux_wheel(tmp_path: Path) -> None:
    """Built here against glibc (DT_NEEDED libc.so.6), tagged musllinux: it cannot load on Alpine."""
    ext = compile_so(tmp_path, "x.so", "int x(void) { return 1; }", "-Wl,--no-as-needed", "-lc")
    path = _native(tmp_path, ["cp311-cp311-musllinux_1_2_x86_64"], {"demo_pkg/x.so": ext})
    res = audit_wheel(path, POLICY)
    (f,) = [f for f in res.findings if f.rule == "tag.libc-mismatch"]
    assert (f.severity, f.member) == ("error", "demo_pkg/x.so")
    assert "libc.so.6" in f.message
    assert res.platform == "musllinux_1_2_x86_64"  # as auditwheel: the tags decide the family


def test_an_extension_suffix_of_the_other_libc(tmp_path: Path) -> None:
    ext = compile_so(tmp_path, "x.so", "int x(void) { return 1; }", "-nostdlib")
    member = "demo_pkg/_x.cpython-311-x86_64-linux-musl.so"
    res = audit_wheel(_native(tmp_path, ["cp311-cp311-manylinux_2_17_x86_64"], {member: ext}), POLICY)
    assert [(f.rule, f.member) for f in res.findings if f.rule == "tag.libc-mismatch"] == [
        ("tag.libc-mismatch", member)
    ]


def test_a_library_that_names_no_libc_under_tags_naming_both(tmp_path: Path) -> None:
    """-nostdlib: no DT_NEEDED, no interpreter; the tags name both families. Judged as glibc (auditwheel on a
    glibc host), and the note says musllinux fits too."""
    lib = compile_so(tmp_path, "x.so", "int x(void) { return 1; }", "-nostdlib")
    tags = ["py3-none-manylinux_2_17_x86_64", "py3-none-musllinux_1_2_x86_64"]
    res = audit_wheel(_native(tmp_path, tags, {"demo_pkg/x.so": lib}), POLICY)
    (f,) = [f for f in res.findings if f.rule == "tag.libc-assumed"]
    assert f.severity == "info"
    assert "manylinux_2_5_x86_64 and musllinux_1_2_x86_64" in f.message
    assert res.platform == "manylinux_2_5_x86_64"


def test_abi_flags_are_part_of_the_extension_suffix(tmp_path: Path) -> None:
    """cpython-311d (a debug build) needs the ABI tag cp311d: a cp311 wheel is the wrong one; the right tag passes."""
    ext = compile_so(tmp_path, "x.so", "int x(void) { return 1; }")
    member = "demo_pkg/_x.cpython-311d-x86_64-linux-gnu.so"
    wrong = audit_wheel(_native(tmp_path, ["cp311-cp311-manylinux_2_17_x86_64"], {member: ext}), POLICY)
    (f,) = [f for f in wrong.findings if f.rule == "tag.ext-suffix"]
    assert "cp311d" in f.message
    right = audit_wheel(_native(tmp_path, ["cp311-cp311d-manylinux_2_17_x86_64"], {member: ext}), POLICY)
    assert [f for f in right.findings if f.rule == "tag.ext-suffix"] == []


def _graft_wheel(tmp_path: Path, graft_source: str, *graft_flags: str) -> Path:
    """A manylinux_2_28 x86-64 wheel: an extension that loads pkg.libs/libgraft-1a2b3c4d.so (its RPATH), the
    graft compiled here from `graft_source` with `graft_flags`."""
    lib = "libgraft-1a2b3c4d.so"
    tmp_path.mkdir(parents=True, exist_ok=True)
    graft = compile_so(tmp_path, lib, graft_source, *graft_flags, f"-Wl,-soname,{lib}")
    ext_src = (
        "extern unsigned kt_graft(unsigned long long);\n"
        "void *PyInit__ext(void) { return (void *)(unsigned long) kt_graft(3); }\n"
    )
    ext = compile_so(tmp_path, "_ext.so", ext_src, f"-L{tmp_path}", f"-l:{lib}", "-Wl,-rpath,$ORIGIN/../pkg.libs")
    members = pure_wheel_members("pkg", "1.0")
    members["pkg/_ext.cpython-311-x86_64-linux-gnu.so"] = ext
    members[f"pkg.libs/{lib}"] = graft
    di = "pkg-1.0.dist-info"
    members[f"{di}/WHEEL"] = b"Wheel-Version: 1.0\nRoot-Is-Purelib: false\nTag: cp311-cp311-manylinux_2_28_x86_64\n"
    return write_wheel(tmp_path / "pkg-1.0-cp311-cp311-manylinux_2_28_x86_64.whl", members)


POPCNT = "unsigned kt_graft(unsigned long long x) { return (unsigned) __builtin_popcountll(x * 2654435761u); }\n"


def test_a_graft_built_above_baseline_without_dispatch_is_a_warning(tmp_path: Path) -> None:
    """What auditwheel cannot see: the graft compiled for x86-64-v2 (popcnt, no ISA note) under a baseline
    manylinux tag dies with Illegal instruction on an older CPU; the finding names the library, the instruction
    and its offset. The same library built for baseline gets nothing."""
    third = load_policy("third-party")
    res = audit_wheel(_graft_wheel(tmp_path / "v2", POPCNT, "-march=x86-64-v2"), third)
    (f,) = [f for f in res.findings if f.rule.startswith("isa.graft")]
    assert (f.rule, f.severity, f.member) == ("isa.graft-above-baseline", "warning", "pkg.libs/libgraft-1a2b3c4d.so")
    assert "loaded by pkg/_ext.cpython-311-x86_64-linux-gnu.so, uses popcnt" in f.message
    assert "(POPCNT) at 0x" in f.message
    assert res.platform == "manylinux_2_5_x86_64"  # the verdict itself is auditwheel's: no note, no level
    res = audit_wheel(_graft_wheel(tmp_path / "v1", POPCNT, "-march=x86-64"), third)
    assert [f for f in res.findings if f.rule.startswith("isa.graft")] == []


def test_a_graft_that_dispatches_on_the_cpu_is_only_said(tmp_path: Path) -> None:
    src = (
        '__attribute__((target("popcnt"))) static unsigned fast(unsigned long long x) '
        "{ return (unsigned) __builtin_popcountll(x); }\n"
        "static unsigned slow(unsigned long long x) { unsigned n = 0; while (x) { n += x & 1; x >>= 1; } return n; }\n"
        'unsigned kt_graft(unsigned long long x) { return __builtin_cpu_supports("popcnt") ? fast(x) : slow(x); }\n'
    )
    res = audit_wheel(_graft_wheel(tmp_path, src, "-march=x86-64"), load_policy("third-party"))
    (f,) = [f for f in res.findings if f.rule.startswith("isa.graft")]
    assert (f.rule, f.severity) == ("isa.graft-dispatch", "info")
    assert "chooses its code at run time (executes cpuid (cpuid at 0x" in f.message  # libgcc's CPU check, linked in
    assert "of its code decoded" in f.message


def test_tzcnt_rdtsc_and_the_cet_hints_are_baseline(tmp_path: Path) -> None:
    """What runs on every x86-64 CPU is not above the baseline, whatever feature the decoder names: tzcnt runs
    as bsf without BMI1 (GCC emits it for __builtin_ctz at -march=x86-64), rdtsc is TSC, endbr64 and rdssp
    are NOPs without CET (libgcc's unwinder executes them). Real grafts (libgcc_s, libzmq) had these only."""
    src = (
        "unsigned kt_graft(unsigned long long x) {\n"
        "  unsigned long long t = __builtin_ia32_rdtsc();\n"
        "  unsigned long long s; __asm__ volatile ('rdsspq %0' : '=r'(s) : '0'(0ULL));\n"
        "  return (unsigned) __builtin_ctzll(x | t | s | 1); }\n"
    ).replace("'", '"')
    res = audit_wheel(_graft_wheel(tmp_path, src, "-march=x86-64", "-mtune=generic", "-fcf-protection"), THIRD)
    assert [f for f in res.findings if f.rule.startswith("isa.graft")] == []


def _avx_blob(functions: int) -> str:
    """`functions` AVX2 functions, more code than one sample window: what OpenBLAS's kernels look like."""
    return "".join(
        f'__attribute__((target("avx2"), noinline)) void kt_k{i}(float *a, int n) '
        f"{{ for (int j = 0; j < n; j++) a[j] = a[j] * {i}.5f + (float) j; }}\n"
        for i in range(functions)
    )


def test_a_dispatch_the_sample_misses_is_found_by_its_cpuid(tmp_path: Path) -> None:
    """OpenBLAS (DYNAMIC_ARCH) and libgfortran choose their kernels once, in a few bytes a sample rarely meets
    (libgcc's __cpu_indicator_init linked in: no dynamic symbol names it). With the sample two windows that
    miss the CPU check, the CPUID found anywhere in the code still makes it a dispatch, never a warning."""
    src = (  # the CPU check first, then more than two windows of kernels (sampled: .init, then mid-kernels)
        "static int kt_has_avx2(void) { unsigned a, b, c, d;\n"
        '  __asm__ volatile ("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(7), "c"(0));\n'
        "  return (b >> 5) & 1; }\n"
        + _avx_blob(2400)
        + "unsigned kt_graft(unsigned long long x) { float a[64] = {0};\n"
        "  if (kt_has_avx2()) kt_k0(a, (int) x);\n"
        "  return (unsigned) a[1]; }\n"
    )
    two_windows = dataclasses.replace(THIRD, library_sample_bytes=128 << 10, wheel_sample_bytes=128 << 10)
    res = audit_wheel(_graft_wheel(tmp_path, src, "-O2", "-march=x86-64", "-fno-toplevel-reorder"), two_windows)
    (f,) = [f for f in res.findings if f.rule.startswith("isa.graft")]
    assert (f.rule, f.severity) == ("isa.graft-dispatch", "info"), f.message
    assert "executes cpuid (cpuid at 0x" in f.message
    assert "of its code decoded" in f.message  # a sample, and said so


def test_cpuid_bytes_inside_another_instruction_are_no_dispatch(tmp_path: Path) -> None:
    """Bytes 0f a2 inside an immediate are not a CPUID instruction: the library that uses AVX2 unconditionally
    stays a warning."""
    src = _avx_blob(8) + (
        "unsigned kt_graft(unsigned long long x) { float a[64] = {0}; kt_k0(a, (int) x);\n"
        "  return (unsigned) a[1] + (unsigned) (x * 0x11a20f11u); }\n"
    )
    graft = _graft_wheel(tmp_path, src, "-O2", "-march=x86-64")
    assert b"\x0f\xa2" in read_members(graft)["pkg.libs/libgraft-1a2b3c4d.so"]
    res = audit_wheel(graft, THIRD)  # all of its code decoded, then searched for cpuid
    (f,) = [f for f in res.findings if f.rule.startswith("isa.graft")]
    assert (f.rule, f.severity) == ("isa.graft-above-baseline", "warning")
