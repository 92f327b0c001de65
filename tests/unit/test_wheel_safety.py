"""Hostile wheel members and foreign architectures: each defect gives exactly its rule;
a clean wheel gives none. Made-up facts (and one real zip read back), no build."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest
from packaging.tags import parse_tag
from packaging.utils import canonicalize_name
from packaging.version import Version

from audits.analyzers.wheel_rules import architecture, safety
from audits.readers._elf import ElfFacts
from audits.readers._wheel import Member, WheelFacts, looks_like_library, read_wheel
from tests.factkit import elf_facts

DI = "demo-1.0.dist-info"


def wheel(*members: Member, record: str = "", tag: str = "cp311-cp311-manylinux_2_28_x86_64") -> WheelFacts:
    rec = Member(f"{DI}/RECORD", (record or "demo/__init__.py,,\n").encode(), 0o644)
    return WheelFacts(
        Path(f"demo-1.0-{tag}.whl"),
        canonicalize_name("demo"),
        Version("1.0"),
        frozenset(parse_tag(tag)),
        (*members, rec),
        (),
        DI,
    )


def member(name: str, kind: str = "file") -> Member:
    return Member(name, b"x", 0o644, kind)


def elf(machine: str = "EM_X86_64", elfclass: int = 64, little: bool = True, osabi: str = "ELFOSABI_SYSV") -> ElfFacts:
    return elf_facts("demo/_ext.so", machine=machine, elfclass=elfclass, little_endian=little, osabi=osabi)


def rules(findings: list) -> set[str]:  # type: ignore[type-arg]
    return {f.rule for f in findings if f.severity == "error"}


def test_a_clean_wheel_is_safe() -> None:
    assert rules(safety(wheel(member("demo/__init__.py"), member("demo/sub/x.py")))) == set()
    assert rules(architecture(wheel(), [elf()], [])) == set()


@pytest.mark.parametrize(
    "name", ["../evil.py", "/etc/evil", "demo/../../evil.py", "demo\\evil.py", "C:/evil", "demo/a\x00b.py"]
)
def test_unsafe_member_paths(name: str) -> None:
    found = safety(wheel(member("demo/__init__.py"), member(name)))
    assert rules(found) == {"wheel.unsafe-path"}
    assert [f.member for f in found] == [name]


def test_names_that_differ_only_in_case() -> None:
    found = safety(wheel(member("demo/Util.py"), member("demo/util.py")))
    assert rules(found) == {"wheel.unsafe-path"}
    assert "differ only in case" in found[0].message


@pytest.mark.parametrize("kind", ["link", "special"])
def test_link_and_special_entries(kind: str) -> None:
    assert rules(safety(wheel(member("demo/__init__.py"), member("demo/x", kind)))) == {"wheel.link-member"}


def test_unsafe_record_path() -> None:
    found = safety(wheel(member("demo/__init__.py"), record="demo/__init__.py,,\n../../outside.py,,\n"))
    assert rules(found) == {"wheel.unsafe-path"}
    assert found[0].member == f"{DI}/RECORD"


def test_a_symlink_zip_entry_is_read_as_a_link(tmp_path: Path) -> None:
    path = tmp_path / "demo-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("demo/__init__.py", "")
        link = zipfile.ZipInfo("demo/escape")
        link.external_attr = (0o120777) << 16
        zf.writestr(link, "/etc/passwd")
        zf.writestr(f"{DI}/RECORD", "")
    kinds = {m.name: m.kind for m in read_wheel(path).members}
    assert kinds == {"demo/__init__.py": "file", "demo/escape": "link", f"{DI}/RECORD": "file"}


@pytest.mark.parametrize(
    ("facts", "tag"),
    [
        (elf("EM_AARCH64"), "cp311-cp311-manylinux_2_28_x86_64"),  # aarch64 library in an x86_64 wheel
        (elf("EM_X86_64"), "cp311-cp311-manylinux_2_28_aarch64"),  # the reverse
        (elf("EM_386", 32), "cp311-cp311-manylinux_2_28_x86_64"),  # 32-bit
        (elf("EM_PPC64", 64, little=False), "cp311-cp311-manylinux_2_28_ppc64le"),  # wrong byte order
        (elf(osabi="ELFOSABI_FREEBSD"), "cp311-cp311-manylinux_2_28_x86_64"),
    ],
)
def test_foreign_architecture(facts: ElfFacts, tag: str) -> None:
    assert rules(architecture(wheel(tag=tag), [facts], [])) == {"elf.arch-mismatch"}


def test_gpu_code_objects_are_not_host_libraries() -> None:
    assert rules(architecture(wheel(), [elf("EM_AMDGPU", osabi="ELFOSABI_ARM_AEABI"), elf("EM_CUDA")], [])) == set()


def test_a_matching_aarch64_wheel_passes() -> None:
    assert rules(architecture(wheel(tag="cp311-cp311-manylinux_2_28_aarch64"), [elf("EM_AARCH64")], [])) == set()


def test_a_library_that_is_not_elf() -> None:
    found = architecture(wheel(), [], ["demo/_ext.cpython-311-x86_64-linux-gnu.so"])
    assert rules(found) == {"elf.not-elf"}


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("a/x.so", True),
        ("a/libz.so.1.2.13", True),
        ("a/x.abi3.so", True),
        ("a/x.py", False),
        ("a/x.so.txt", False),
        (f"{DI}/x.so", False),
    ],
)
def test_library_names(name: str, expected: bool) -> None:
    assert looks_like_library(name) is expected


def test_the_reader_takes_the_os_abi_from_the_elf_header() -> None:
    """EI_OSABI is read from the file (the default would hide a FreeBSD library in a Linux wheel)."""
    import sys

    from audits.readers._elf import read_elf

    data = bytearray(Path(sys.executable).resolve().read_bytes())
    native = read_elf("python", bytes(data))
    assert native is not None
    assert native.osabi in ("ELFOSABI_SYSV", "ELFOSABI_LINUX")
    data[7] = 9  # ELFOSABI_FREEBSD
    freebsd = read_elf("python", bytes(data))
    assert freebsd is not None
    assert freebsd.osabi == "ELFOSABI_FREEBSD"


def test_top_level_lib_and_include_install_into_site_packages() -> None:
    from audits.analyzers.wheel_rules import layout

    w = wheel(member("demo/__init__.py"), member("lib/libfoo.a"), member("include/foo.h"), member("demo.libs/x.so"))
    found = layout(w, {}, frozenset({"lib", "include", "bin"}))
    assert sorted((f.rule, f.member) for f in found) == [("wheel.top-level", "include/"), ("wheel.top-level", "lib/")]


def test_the_same_library_under_its_soname_chain() -> None:
    from audits.analyzers.wheel_rules import layout

    names = {
        "demo/lib/libx.so": "a" * 64,
        "demo/lib/libx.so.0": "a" * 64,
        "demo/lib/libx.so.0.6.0": "a" * 64,
        "demo/lib/liby.so": "b" * 64,
    }
    found = layout(wheel(member("demo/__init__.py")), names, frozenset())
    assert [(f.rule, f.member) for f in found] == [("wheel.duplicate-library", "demo/lib/libx.so")]
    assert "3 times" in found[0].message


def test_two_distributions_installing_the_same_path() -> None:
    from audits.analyzers.wheel_rules import collisions

    shared = "triton_kernels/__init__.py"
    found = collisions(
        {
            "a-1-py3-none-any.whl": (shared, "a/__init__.py", "a-1.dist-info/RECORD"),
            "b-1-py3-none-any.whl": (shared, "b/__init__.py", "b-1.dist-info/RECORD"),
        }
    )
    assert [(f.rule, f.wheel, f.member) for f in found] == [
        ("release.path-collision", "b-1-py3-none-any.whl", "triton_kernels/__init__.py")
    ]
