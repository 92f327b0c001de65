"""The audit on anyone's wheels: bounded reads (a zip bomb is a finding, not an OOM), load-chain
library resolution as glibc does it, auditwheel-style verdicts per architecture, and the
third-party policy that keeps our release's rules as warnings. Made-up facts and small zips."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest

from audits import __main__ as cli
from audits import audit_wheel, load_policy, platforms
from audits.analyzers.elf_rules import load_chains, rpath
from audits.manylinux import honest_platform
from audits.readers._elf import ElfFacts
from audits.readers._wheel import ReadOptions, read_wheel
from tests.factkit import elf_facts
from tests.wheelkit import pure_wheel_members, write_wheel

DEFAULT = load_policy()
THIRD = load_policy("third-party")


def elf(
    member: str,
    needed: tuple[str, ...] = (),
    rpath: tuple[str, ...] = (),
    runpath: tuple[str, ...] = (),
    soname: str = "",
    versions: tuple[tuple[str, tuple[str, ...]], ...] = (),
    machine: str = "EM_X86_64",
) -> ElfFacts:
    return elf_facts(
        member, needed=needed, rpath=rpath, runpath=runpath, soname=soname, version_needs=versions, machine=machine
    )


def errors(findings: list) -> set[str]:  # type: ignore[type-arg]
    return {f.rule for f in findings if f.severity == "error"}


# --- load chains: DT_RPATH inherited, DT_RUNPATH not, loaded names reused --------------------------------

EXT = "pkg/_ext.cpython-311-x86_64-linux-gnu.so"
TREE = [EXT, "pkg.libs/libgraft.so.1", "pkg.libs/libdep.so.2", "pkg/__init__.py"]


def test_a_grafted_librarys_dependency_resolves_through_the_loaders_rpath() -> None:
    elfs = [
        elf(EXT, needed=("libgraft.so.1",), rpath=("$ORIGIN/../pkg.libs",)),
        elf("pkg.libs/libgraft.so.1", needed=("libdep.so.2",), soname="libgraft.so.1"),
        elf("pkg.libs/libdep.so.2", soname="libdep.so.2"),
    ]
    where = load_chains(elfs, TREE).where
    assert where[("pkg.libs/libgraft.so.1", "libdep.so.2")] == "pkg.libs/libdep.so.2"
    assert errors(rpath("w.whl", elfs, TREE, frozenset())) == set()


def test_runpath_is_not_inherited() -> None:
    elfs = [
        elf(EXT, needed=("libgraft.so.1",), runpath=("$ORIGIN/../pkg.libs",)),
        elf("pkg.libs/libgraft.so.1", needed=("libdep.so.2",), soname="libgraft.so.1"),
        elf("pkg.libs/libdep.so.2", soname="libdep.so.2"),
    ]
    assert load_chains(elfs, TREE).where[("pkg.libs/libgraft.so.1", "libdep.so.2")] is None
    found = rpath("w.whl", elfs, TREE, frozenset())
    assert errors(found) == {"rpath.unresolved"}
    assert [f.member for f in found] == ["pkg.libs/libgraft.so.1"]


def test_an_object_with_its_own_runpath_ignores_the_inherited_rpath() -> None:
    elfs = [
        elf(EXT, needed=("libgraft.so.1",), rpath=("$ORIGIN/../pkg.libs",)),
        elf("pkg.libs/libgraft.so.1", needed=("libdep.so.2",), runpath=("$ORIGIN/nowhere",)),
        elf("pkg.libs/libdep.so.2"),
    ]
    assert load_chains(elfs, TREE).where[("pkg.libs/libgraft.so.1", "libdep.so.2")] is None


def test_a_name_already_loaded_in_the_chain_is_reused() -> None:
    """libdep is loaded by the extension first (breadth first), so libgraft, with no search path
    at all, finds it by its SONAME, as ld.so does."""
    elfs = [
        elf(EXT, needed=("libdep.so.2", "libgraft.so.1"), runpath=("$ORIGIN/../pkg.libs",)),
        elf("pkg.libs/libgraft.so.1", needed=("libdep.so.2",)),
        elf("pkg.libs/libdep.so.2", soname="libdep.so.2"),
    ]
    assert load_chains(elfs, TREE).where[("pkg.libs/libgraft.so.1", "libdep.so.2")] == "pkg.libs/libdep.so.2"


# --- verdicts like auditwheel's ---------------------------------------------------------------------------


def test_a_library_that_resolves_nowhere_makes_the_verdict_linux() -> None:
    elfs = [elf(EXT, needed=("libc.so.6", "libfoo.so.1"), versions=(("libc.so.6", ("GLIBC_2.2.5",)),))]
    tag, why = honest_platform(elfs, load_chains(elfs, [EXT]).where)
    assert tag == "linux_x86_64"
    assert "libfoo.so.1" in why
    assert EXT in why
    ok = [elf(EXT, needed=("libc.so.6",), versions=(("libc.so.6", ("GLIBC_2.2.5",)),))]
    assert honest_platform(ok, load_chains(ok, [EXT]).where) == ("manylinux_2_5_x86_64", "")


def test_the_verdict_names_the_symbol_that_limits_it() -> None:
    elfs = [elf(EXT, needed=("libc.so.6",), versions=(("libc.so.6", ("GLIBC_2.2.5", "GLIBC_2.34")),))]
    tag, why = honest_platform(elfs, load_chains(elfs, [EXT]).where)
    assert tag == "manylinux_2_34_x86_64"
    assert why.startswith("GLIBC_2.34 from libc.so.6")
    assert "manylinux_2_" in why


def test_symbol_versions_of_a_library_inside_the_wheel_count_as_auditwheel_counts_them() -> None:
    """A bundled libstdc++.so.6 brings its own GLIBCXX, yet the system's libstdc++.so.6, loaded first by anything
    else in the process, is the one the loader reuses for that SONAME: auditwheel counts every version need
    (its versioned_symbols_policy reads them from every ELF, whatever provides them), and so do we."""
    tree = [EXT, "pkg.libs/libstdc++.so.6"]
    elfs = [
        elf(
            EXT,
            needed=("libstdc++.so.6",),
            rpath=("$ORIGIN/../pkg.libs",),
            versions=(("libstdc++.so.6", ("GLIBCXX_3.4.32",)),),
        ),
        elf("pkg.libs/libstdc++.so.6"),
    ]
    tag, why = honest_platform(elfs, load_chains(elfs, tree).where)
    assert tag == "manylinux_2_39_x86_64"  # the first policy whose GLIBCXX reaches 3.4.32
    assert why == f"GLIBCXX_3.4.32 from libstdc++.so.6 (needed by {EXT}) is newer than manylinux_2_38 allows"


def test_the_verdict_is_computed_for_the_wheels_architecture() -> None:
    """manylinux_2_5 (manylinux1) never existed for aarch64; 2_17 is its floor."""
    elfs = [elf(EXT, needed=("libc.so.6",), versions=(("libc.so.6", ("GLIBC_2.17",)),), machine="EM_AARCH64")]
    assert honest_platform(elfs, load_chains(elfs, [EXT]).where, "aarch64")[0] == "manylinux_2_17_aarch64"
    assert honest_platform([], None) == (None, "")


# --- bounded reads --------------------------------------------------------------------------------------


def _bomb(path: Path, mib: int) -> Path:
    members = pure_wheel_members("demo", "1.0")
    write_wheel(path, members)
    with zipfile.ZipFile(path, "a", zipfile.ZIP_DEFLATED) as zf, zf.open("demo/zeros.bin", "w") as fh:
        block = bytes(1 << 20)
        for _ in range(mib):
            fh.write(block)
    return path


def test_a_zip_bomb_member_is_refused_not_read(tmp_path: Path) -> None:
    wheel = _bomb(tmp_path / "demo-1.0-py3-none-any.whl", 64)
    facts = read_wheel(wheel, ReadOptions(limits=DEFAULT.limits))
    (bomb,) = [m for m in facts.members if m.name == "demo/zeros.bin"]
    assert bomb.refused.startswith("expands")
    assert bomb.data is None
    assert bomb.sha256 == ""
    res = audit_wheel(wheel, DEFAULT)
    assert [(f.rule, f.member) for f in res.findings if f.severity == "error"] == [
        ("wheel.member-limit", "demo/zeros.bin"),
        ("wheel.record-unlisted", "demo/zeros.bin"),
    ]


def test_members_are_hashed_streaming_and_not_kept(tmp_path: Path) -> None:
    wheel = write_wheel(tmp_path / "demo-1.0-py3-none-any.whl", pure_wheel_members("demo", "1.0"))
    facts = read_wheel(wheel)
    init = facts.member("demo/__init__.py")
    assert init is not None
    assert init.data is None
    assert init.size == len(b"VALUE = 1\n")
    assert facts.text(
        f"{facts.dist_info}/METADATA",
    ).startswith("Metadata-Version")  # type: ignore[union-attr]


def test_a_corrupt_member_is_named(tmp_path: Path) -> None:
    wheel = tmp_path / "demo-1.0-py3-none-any.whl"
    members = pure_wheel_members("demo", "1.0")
    members["demo/data.txt"] = b"A" * 4096
    write_wheel(wheel, members)
    raw = bytearray(wheel.read_bytes())
    with zipfile.ZipFile(wheel) as zf:
        info = zf.getinfo("demo/data.txt")
    raw[info.header_offset + 30 + len(info.filename) + 2] ^= 0xFF  # a byte of the deflated stream
    wheel.write_bytes(bytes(raw))
    res = audit_wheel(wheel, DEFAULT)
    assert ("wheel.unreadable", "demo/data.txt") in {(f.rule, f.member) for f in res.findings}


# --- the third-party policy -------------------------------------------------------------------------------


def test_third_party_policy_keeps_our_rules_as_warnings_with_the_reason(tmp_path: Path) -> None:
    members = pure_wheel_members("demo", "1.0", requires_python=None)
    members["demo/lib/libnpymath.a"] = b"!<arch>\n"
    wheel = write_wheel(tmp_path / "demo-1.0-py3-none-any.whl", members)
    ours = audit_wheel(wheel, DEFAULT).findings
    assert errors(ours) == {"wheel.static-library", "wheel.requires-python"}
    theirs = audit_wheel(wheel, THIRD).findings
    assert errors(theirs) == set()
    by_rule = {f.rule: f for f in theirs}
    assert by_rule["wheel.static-library"].severity == "info"
    assert "on purpose" in by_rule["wheel.static-library"].message
    assert by_rule["wheel.requires-python"].severity == "warning"
    # what holds for every wheel stays an error under both
    assert THIRD.wheel_budget_bytes == DEFAULT.wheel_budget_bytes
    assert THIRD.variants == DEFAULT.variants
    assert THIRD.exports_applies_to == frozenset()


def test_third_party_by_name_on_the_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    members = pure_wheel_members("demo", "1.0")
    members["demo/libx.a"] = b"!<arch>\n"
    wheel = write_wheel(tmp_path / "demo-1.0-py3-none-any.whl", members)
    assert cli.main([str(wheel)]) == 1
    capsys.readouterr()
    assert cli.main([str(wheel), "--policy", "third-party", "--json", "-"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["policy_name"] == "third-party"
    assert report["passed"]


def test_a_policy_that_extends_itself_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    loop = tmp_path / "loop.toml"
    loop.write_text(f'schema_version = 1\nextends = "{loop.name}"\n')
    code = cli.main(
        [
            str(write_wheel(tmp_path / "demo-1.0-py3-none-any.whl", pure_wheel_members("demo", "1.0"))),
            "--policy",
            str(loop),
        ]
    )
    assert code == 2
    assert "loops back" in capsys.readouterr().err


def test_every_analyzer_in_the_table_is_pure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Read once, then analyze with the file system and subprocesses switched off: no analyzer
    does I/O (cuobjdump, disassembly and file reads all happen in the readers)."""
    import builtins
    import subprocess

    from audits import core

    members = pure_wheel_members("demo", "1.0")
    members["demo/libx.a"] = b"!<arch>\n"
    ctx = core.read_context(write_wheel(tmp_path / "demo-1.0-py3-none-any.whl", members), DEFAULT, None)
    honest_platform([], None)  # auditwheel's policy data, cached before the switch-off

    def no_io(*_: object, **__: object) -> None:
        raise AssertionError("an analyzer did I/O")

    monkeypatch.setattr(builtins, "open", no_io)
    monkeypatch.setattr(subprocess, "run", no_io)
    monkeypatch.setattr(subprocess, "Popen", no_io)
    found = [f for _name, analyze in core.ANALYZERS for f in analyze(ctx, DEFAULT)[0]]
    assert {f.rule for f in found} == {"wheel.static-library"}
    assert len({name for name, _ in core.ANALYZERS}) == len(core.ANALYZERS) >= 15


# --- what auditwheel decides, and where this audit decides otherwise on purpose --------------------------


def test_a_duplicate_nothing_loads_never_decides_the_tag() -> None:
    """A wheel edited after repair: the extension loads the copies beside it (its RUNPATH), the originals in
    pkg.libs/ are loaded by nothing; an original whose own needs do not resolve once made every policy
    linux_x86_64. It is reported (info) and decides nothing, as auditwheel's roots never reach it."""
    tree = [EXT, "pkg/libfoo-ab12cd34.so.1", "pkg.libs/libfoo-ab12cd34.so.1"]
    elfs = [
        elf(EXT, needed=("libfoo-ab12cd34.so.1", "libc.so.6"), runpath=("$ORIGIN",)),
        elf("pkg/libfoo-ab12cd34.so.1", needed=("libc.so.6",), soname="libfoo-ab12cd34.so.1"),
        elf("pkg.libs/libfoo-ab12cd34.so.1", needed=("libbar-99.so.2",), soname="libfoo-ab12cd34.so.1"),
    ]
    chains = load_chains(elfs, tree)
    assert chains.unused == {"pkg.libs/libfoo-ab12cd34.so.1": (EXT, "pkg/libfoo-ab12cd34.so.1")}
    t = platforms.Target("manylinux", "x86_64", platforms.policies("manylinux", "x86_64"), "")
    assert platforms.verdict(t, elfs, chains.where, chains.unused)[0] == "manylinux_2_5_x86_64"
    assert platforms.verdict(t, elfs, chains.where)[0] == "linux_x86_64"  # what counting it gave
    found = rpath("w.whl", elfs, tree, {"libc.so.6"})
    assert [(f.rule, f.severity, f.member) for f in found] == [("elf.unused", "info", "pkg.libs/libfoo-ab12cd34.so.1")]
    assert "resolves to pkg/libfoo-ab12cd34.so.1 for " + EXT in found[0].message


def test_runpath_is_not_passed_down_the_chain_as_glibc_does_and_the_finding_says_auditwheel_differs() -> None:
    """The extension's DT_RUNPATH holds libdep's folder, but libgraft (no RUNPATH of its own) needs libdep:
    glibc searches the RUNPATH for the extension's own needs only, so the import fails. auditwheel's lddtree
    passes RUNPATH down and calls it resolved; this audit follows the loader, and says so."""
    tree = [EXT, "pkg.libs/libgraft.so.1", "pkg.libs/libdep.so.2"]
    elfs = [
        elf(EXT, needed=("libgraft.so.1",), runpath=("$ORIGIN/../pkg.libs",)),
        elf("pkg.libs/libgraft.so.1", needed=("libdep.so.2",)),
        elf("pkg.libs/libdep.so.2"),
    ]
    (f,) = rpath("w.whl", elfs, tree, set())
    assert (f.rule, f.member) == ("rpath.unresolved", "pkg.libs/libgraft.so.1")
    assert "RUNPATH holds it, which auditwheel follows down the chain but the loader does not" in f.message


def test_a_loaded_graft_declaring_an_isa_level_decides_the_tag_an_unused_one_does_not() -> None:
    """auditwheel reads the ISA note of its roots and the system libraries only; a grafted library the
    extension loads runs on the same CPU: its x86-64-v2 note keeps every portable tag out (a deliberate
    difference). A copy nothing loads decides nothing."""
    tree = [EXT, "pkg.libs/libv2.so.1", "other.libs/libv2.so.1"]
    elfs = [
        elf(EXT, needed=("libv2.so.1",), rpath=("$ORIGIN/../pkg.libs",)),
        elf_facts("pkg.libs/libv2.so.1", isa_needed="x86_64_v2"),
        elf_facts("other.libs/libv2.so.1", isa_needed="x86_64_v3"),
    ]
    chains = load_chains(elfs, tree)
    assert list(chains.unused) == ["other.libs/libv2.so.1"]
    t = platforms.Target("manylinux", "x86_64", platforms.policies("manylinux", "x86_64"), "")
    tag, why = platforms.verdict(t, elfs, chains.where, chains.unused)
    assert (tag, why) == (
        "linux_x86_64",
        "pkg.libs/libv2.so.1 declares x86_64_v2 in its GNU property note (ISA_1_NEEDED)",
    )


def test_a_musl_elf_needing_a_literal_libc_so_is_musllinux() -> None:
    """musl's loader answers any libc.* with itself; auditwheel crashes on such a file on a glibc host (it opens
    the host's linker script) and, with the crash avoided, says linux_<arch>. Decided: musllinux, as musl runs it."""
    ext = "pkg/_ext.cpython-312-x86_64-linux-musl.so"
    e = elf_facts(ext, needed=("libc.so",), interp="", py_ext=3)
    t, _ = platforms.target(["musllinux_1_2_x86_64"], [e])
    assert t is not None
    assert platforms.verdict(t, [e], load_chains([e], [ext]).where)[0] == "musllinux_1_2_x86_64"
