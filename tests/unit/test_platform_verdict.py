"""The platform verdict on every dimension auditwheel computes, from made-up ELF facts: symbol
versions (one finding per library and limiting reason, real version names), forbidden symbols and
the x86-64 ISA level of the GNU property note."""

from __future__ import annotations

import re
from pathlib import Path

from audits.analyzers.elf_rules import load_chains
from audits.analyzers.wheel_rules import platform_overclaims, tags
from audits.manylinux import honest_platform
from audits.platforms import forbidden_symbols
from audits.readers._wheel import WheelFacts
from tests.factkit import elf_facts

EXT = "pkg/_ext.cpython-311-x86_64-linux-gnu.so"


def _wheel(platform: str) -> WheelFacts:
    from packaging.tags import Tag
    from packaging.utils import canonicalize_name
    from packaging.version import Version

    return WheelFacts(
        path=Path(f"pkg-1.0-cp311-cp311-{platform}.whl"),
        name=canonicalize_name("pkg"),
        version=Version("1.0"),
        tags=frozenset({Tag("cp311", "cp311", platform)}),
        members=(),
        duplicates=(),
        dist_info="pkg-1.0.dist-info",
    )


CXX = elf_facts(
    EXT,
    needed=("libstdc++.so.6", "libc.so.6"),
    version_needs=(
        ("libstdc++.so.6", ("GLIBCXX_3.4.30", "GLIBCXX_3.4.31", "GLIBCXX_3.4.32", "CXXABI_1.3.15", "CXXABI_1.3.2")),
        ("libc.so.6", ("GLIBC_2.2.5", "GLIBC_2.34", "GLIBC_2.33", "GLIBC_2.32")),
    ),
)


def test_overclaims_are_grouped_per_library_and_reason_with_real_versions() -> None:
    found = platform_overclaims(_wheel("manylinux_2_17_x86_64"), [CXX])
    by_reason = {re.match(r"needs (\w+?)_", f.message).group(1): f.message for f in found}  # type: ignore[union-attr]
    assert sorted(by_reason) == ["CXXABI", "GLIBC", "GLIBCXX"]
    assert by_reason["GLIBCXX"].startswith("needs GLIBCXX_3.4.32 and 2 more GLIBCXX versions from libstdc++.so.6")
    assert by_reason["GLIBC"].startswith("needs GLIBC_2.34 and 2 more GLIBC versions from libc.so.6")
    assert "its newest CXXABI on x86_64 is CXXABI_1.3.7)" in by_reason["CXXABI"]
    for message in by_reason.values():
        assert "FLOAT128" not in message
        assert "TM_1" not in message


def test_the_overclaim_rule_reads_the_policy_of_the_wheels_own_architecture() -> None:
    """The same policy objects as the verdict, for the wheel's architecture: on aarch64 GLIBC_2.17 is what
    manylinux_2_17 allows (x86-64's data, which the rule once fell back to, would not say so), and a message
    names the architecture."""
    ok = elf_facts(EXT, machine="EM_AARCH64", needed=("libc.so.6",), version_needs=(("libc.so.6", ("GLIBC_2.17",)),))
    assert platform_overclaims(_wheel("manylinux_2_17_aarch64"), [ok]) == []
    over = elf_facts(EXT, machine="EM_AARCH64", needed=("libc.so.6",), version_needs=(("libc.so.6", ("GLIBC_2.28",)),))
    (f,) = platform_overclaims(_wheel("manylinux_2_17_aarch64"), [over])
    assert "which manylinux_2_17_aarch64 does not allow (its newest GLIBC on aarch64 is GLIBC_2.18)" in f.message
    assert f.message.endswith("the lowest tag allowing it is manylinux_2_28_aarch64")


def test_an_isa_level_above_baseline_allows_no_manylinux_tag() -> None:
    v3 = elf_facts(EXT, needed=("libc.so.6",), version_needs=(("libc.so.6", ("GLIBC_2.2.5",)),), isa_needed="x86_64_v3")
    tag, why = honest_platform([v3], load_chains([v3], [EXT]).where)
    assert tag == "linux_x86_64"
    assert "x86_64_v3" in why
    assert [f.rule for f in tags(_wheel("manylinux_2_28_x86_64"), [v3])] == ["tag.isa-level"]
    baseline = elf_facts(EXT, needed=("libc.so.6",), version_needs=(("libc.so.6", ("GLIBC_2.2.5",)),))
    assert honest_platform([baseline], load_chains([baseline], [EXT]).where)[0] == "manylinux_2_5_x86_64"


def test_a_forbidden_symbol_lowers_the_verdict_as_auditwheel_does() -> None:
    """__cxa_thread_atexit_impl of libc.so.6 is forbidden up to manylinux_2_17 only."""
    assert "__cxa_thread_atexit_impl" in forbidden_symbols()
    e = elf_facts(
        EXT,
        needed=("libc.so.6",),
        version_needs=(("libc.so.6", ("GLIBC_2.2.5",)),),
        forbidden_candidates=("__cxa_thread_atexit_impl",),
    )
    tag, why = honest_platform([e], load_chains([e], [EXT]).where)
    assert tag == "manylinux_2_24_x86_64"
    assert "__cxa_thread_atexit_impl" in why
    (f,) = [f for f in tags(_wheel("manylinux_2_17_x86_64"), [e]) if f.rule == "tag.forbidden-symbol"]
    assert "__cxa_thread_atexit_impl (libc.so.6)" in f.message
    assert not [f for f in tags(_wheel("manylinux_2_28_x86_64"), [e]) if f.rule == "tag.forbidden-symbol"]
