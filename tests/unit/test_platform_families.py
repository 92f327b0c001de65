"""The libc family and the architecture a wheel is judged for, decided as auditwheel decides them
(tags, then the ELF files' interpreter, DT_NEEDED and extension suffix), and the verdict each family's
policy gives: made-up ELF facts, auditwheel's real policy data."""

from __future__ import annotations

from audits.analyzers.elf_rules import load_chains
from audits.platforms import EF_ARM_ABI_FLOAT_HARD, EF_ARM_EABI_VER5, elf_arch, system_libraries, target, verdict
from tests.factkit import elf_facts

EXT = "pkg/_ext.cpython-312-x86_64-linux-musl.so"


def judge(platforms: list[str], *elfs):  # type: ignore[no-untyped-def]
    t, why = target(platforms, list(elfs))
    tag, reason = verdict(t, list(elfs), load_chains(list(elfs), [e.member for e in elfs]).where)
    return t, tag, reason or why


def test_musl_named_by_dt_needed_gives_musllinux_and_its_libc_is_the_systems() -> None:
    e = elf_facts("pkg/_ext.so", needed=("libc.musl-x86_64.so.1",))
    t, tag, _ = judge(["linux_x86_64"], e)
    assert t is not None
    assert (t.family, tag) == ("musllinux", "musllinux_1_2_x86_64")
    assert "DT_NEEDED libc.musl-x86_64.so.1" in t.how
    assert "libc.musl-x86_64.so.1" in system_libraries(t, ["linux_x86_64"])
    more = elf_facts("pkg/_ext.so", needed=("libc.musl-x86_64.so.1", "libssl.so.3"))
    assert judge(["linux_x86_64"], more)[1:] == (
        "linux_x86_64",
        "libssl.so.3 (needed by pkg/_ext.so) is neither in the wheel nor a system library of musllinux_1_2",
    )


def test_the_musl_interpreter_and_the_musl_suffix_name_musl() -> None:
    exe = elf_facts("pkg-1.0.data/scripts/tool", interp="/lib/ld-musl-aarch64.so.1", machine="EM_AARCH64")
    assert judge(["py3-none-linux_aarch64"], exe)[1] == "musllinux_1_2_aarch64"
    ext = elf_facts(EXT)  # needs nothing: only the suffix says musl (Python >= 3.11)
    assert judge(["linux_x86_64"], ext)[1] == "musllinux_1_2_x86_64"


def test_tags_naming_one_family_decide_it() -> None:
    e = elf_facts("pkg/_ext.so", needed=("libc.so.6",), version_needs=(("libc.so.6", ("GLIBC_2.17",)),))
    t, tag, _ = judge(["manylinux_2_17_x86_64"], e)
    assert (t.family if t else None, tag) == ("manylinux", "manylinux_2_17_x86_64")


def test_soft_float_arm_is_no_armv7l() -> None:
    hard = elf_facts("pkg/a.so", machine="EM_ARM", elfclass=32, eflags=EF_ARM_EABI_VER5 | EF_ARM_ABI_FLOAT_HARD)
    soft = elf_facts("pkg/a.so", machine="EM_ARM", elfclass=32, eflags=EF_ARM_EABI_VER5)
    assert elf_arch(hard) == ("armv7l", "")
    arch, why = elf_arch(soft)
    assert arch is None
    assert "soft-float" in why
    t, tag, reason = judge(["linux_armv5l"], soft)
    assert (t, tag) == (None, None)
    assert "soft-float" in reason


def test_an_unknown_machine_is_never_given_another_architectures_tag() -> None:
    mips = elf_facts("pkg/a.so", machine="EM_MIPS", elfclass=64, little_endian=False, needed=("libc.so.6",))
    for tags in (["linux_mips64"], ["manylinux_2_17_x86_64"], ["any"]):
        t, tag, reason = judge(tags, mips)
        assert (t, tag) == (None, None)
        assert "EM_MIPS ELF64 big-endian" in reason


def test_pyfpe_and_ucs2_leave_only_the_plain_linux_tag() -> None:
    fpe = elf_facts("pkg/_ext.cpython-35m-x86_64-linux-gnu.so", needed=("libc.so.6",), py_ext=3, pyfpe=True)
    assert judge(["linux_x86_64"], fpe)[1:] == (
        "linux_x86_64",
        "pkg/_ext.cpython-35m-x86_64-linux-gnu.so references PyFPE_jbuf, which only fpectl builds of Python define",
    )
    not_ext = elf_facts("pkg/libhelper.so", needed=("libc.so.6",), pyfpe=True)  # auditwheel checks extensions only
    assert judge(["linux_x86_64"], not_ext)[1] == "manylinux_2_5_x86_64"
    ucs2 = elf_facts("pkg/_ext.so", needed=("libc.so.6",), py_ext=2, ucs2=True)
    assert "UCS2" in judge(["linux_x86_64"], ucs2)[2]


def test_android_is_judged_by_its_api_levels_policy_without_warning_on_its_system_libraries() -> None:
    e = elf_facts(
        "spam.cpython-313-aarch64-linux-android.so",
        machine="EM_AARCH64",
        needed=("libc.so", "libm.so", "libdl.so", "liblog.so", "libpython3.13.so"),
    )
    t, tag, _ = judge(["android_24_arm64_v8a"], e)
    assert t is not None
    assert (t.family, tag) == ("android", "android_24_arm64_v8a")
    assert {"libc.so", "libm.so", "liblog.so"} <= system_libraries(t, ["android_24_arm64_v8a"])
    grafted = elf_facts(e.member, machine="EM_AARCH64", needed=("libc.so", "libc++_shared.so"))
    assert judge(["android_24_arm64_v8a"], grafted)[1] == "linux_aarch64"


def test_non_linux_platforms_get_a_verdict_of_none_and_a_reason() -> None:
    t, why = target(["ios_13_0_arm64_iphoneos"], [])
    assert t is None
    assert "iOS" in why
    assert target(["macosx_11_0_arm64"], [])[1].startswith("a wheel for macOS")
