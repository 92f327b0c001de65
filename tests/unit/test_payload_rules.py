"""The payload rules on made-up facts: a clean release passes with no error, and each
defect yields exactly its rule id. Plus the compute-capability compatibility table."""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path
from typing import Any

import pytest

from audits.analyzers.payload_rules import analyze, runs_on
from audits.policy import load_policy
from audits.readers._elf import ElfFacts
from audits.readers._payload import ArchivedFile, ArchiveFacts, PartMember, WheelSummary
from tests.factkit import elf_facts

POLICY = load_policy()
MANIFEST = "sgl_kernel/_kt_payload.json"
PLATFORM = "manylinux_2_34_x86_64"
CARRIERS = [
    ("kt-kernel", "0.6.1", "cp311-cp311"),
    ("ktransformers", "0.6.1", "py3-none"),
    ("sglang-kt", "0.6.1", "cp311-cp311"),
    ("transformers-kt", "5.19.0.post1", "py3-none"),
    ("accelerate-kt", "1.15.0.post1", "py3-none"),
]
FILES = {
    "sgl_kernel/sm100/common_ops.abi3.so": ({"sm_80", "sm_89", "sm_90a", "sm_120a"}, set()),
    "kt_kernel/cuda/lib/libkt_cuda.so": ({"sm_80", "sm_86", "sm_89", "sm_90", "sm_120"}, {"compute_120"}),
}


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _elf(path: str, needed: tuple[str, ...] = ("libc.so.6",), runpath: tuple[str, ...] = ()) -> ElfFacts:
    return elf_facts(f"payload!{path}", needed=needed, runpath=runpath)


def release() -> tuple[list[WheelSummary], ArchiveFacts]:
    parts, summaries, manifest_parts = [], [], []
    archive = b"".join(f"part{i}".encode() * 100 for i in range(5))
    chunks = [archive[i * 500 : (i + 1) * 500] for i in range(5)]
    for i, ((name, version, pyabi), blob) in enumerate(zip(CARRIERS, chunks, strict=True), 1):
        member = f"{name.split('-')[0]}/_kt_payload/cuda.tar.zst.{i:02d}-of-05"
        parts.append(PartMember(member, len(blob), _sha(blob)))
        manifest_parts.append(
            {
                "index": i,
                "distribution": name,
                "version": version,
                "member": member,
                "size": len(blob),
                "sha256": _sha(blob),
            }
        )
        summaries.append(
            WheelSummary(
                Path(f"{name}.whl"),
                f"{name}-{version}.whl",
                name,
                version,
                (f"{pyabi}-{PLATFORM}",),
                (),
                (parts[-1],),
                None,
                "",
                (),
            )
        )
    files = {
        p: {"size": 10, "sha256": _sha(p.encode()), "sass": sorted(s), "ptx": sorted(x)} for p, (s, x) in FILES.items()
    }
    manifest: dict[str, Any] = {
        "schema_version": 1,
        "release": "0.6.1",
        "archive": {"size": len(archive), "sha256": _sha(archive), "window_log": 27},
        "parts": manifest_parts,
        "files": files,
    }
    requires = (*tuple(f"{n}=={v}" for n, v, _ in CARRIERS), "torch==2.14.1")
    summaries.append(
        WheelSummary(
            Path("p.whl"),
            "sglang_kernel_kt-0.4.10.post1.whl",
            "sglang-kernel-kt",
            "0.4.10.post1",
            (f"cp310-abi3-{PLATFORM}",),
            requires,
            (),
            manifest,
            "",
            (),
        )
    )
    summaries[2] = dataclasses.replace(summaries[2], requires=("sglang-kernel-kt==0.4.10.post1",))
    archived = tuple(
        ArchivedFile(p, "file", 10, _sha(p.encode()), elf=_elf(p), sass=frozenset(s), ptx=frozenset(x))
        for p, (s, x) in FILES.items()
    )
    return summaries, ArchiveFacts(len(archive), _sha(archive), "", archived, True)


def rules(summaries: list[WheelSummary], archive: ArchiveFacts | None) -> set[str]:
    findings, _ = analyze(summaries, archive, POLICY, frozenset({"libc.so.6"}))
    errors = {f.rule for f in findings if f.severity == "error"}
    # the kt library's per-library CUDA rules need cuobjdump facts these made-up files lack
    return errors - {"cuda.arch-set"}


def _manifest(s: list[WheelSummary]) -> dict[str, Any]:
    m = s[-1].manifest
    assert m is not None
    return m


def test_clean_release_has_no_payload_error() -> None:
    assert rules(*release()) == set()


def test_part_missing_from_its_wheel() -> None:
    s, _a = release()
    s[1] = dataclasses.replace(s[1], parts=())
    assert rules(s, None) == {"payload.part-missing", "payload.archive-mismatch"}


def test_part_carrier_absent_from_the_release() -> None:
    s, _ = release()
    del s[4]
    assert "payload.part-missing" in rules(s, None)
    assert rules(s, None) <= {"payload.part-missing", "payload.archive-mismatch", "payload.closure"}


def test_part_listed_twice() -> None:
    s, a = release()
    m = _manifest(s)
    m["parts"].append(dict(m["parts"][0], index=6))
    assert rules(s, a) == {"payload.part-duplicate"}


def test_unlisted_part_member() -> None:
    s, a = release()
    s[0] = dataclasses.replace(s[0], parts=(*s[0].parts, PartMember("kt_kernel/_kt_payload/old", 3, "0" * 64)))
    assert rules(s, a) == {"payload.part-duplicate"}


def test_parts_out_of_order() -> None:
    s, a = release()
    m = _manifest(s)
    m["parts"][1], m["parts"][2] = m["parts"][2], m["parts"][1]
    assert rules(s, a) == {"payload.part-order"}


def test_part_from_another_version() -> None:
    s, a = release()
    s[3] = dataclasses.replace(s[3], version="5.19.0.post2")
    assert rules(s, a) == {"payload.part-version"}


def test_part_bytes_differ_from_manifest() -> None:
    s, a = release()
    _manifest(s)["parts"][2]["sha256"] = "f" * 64
    assert rules(s, a) == {"payload.part-mismatch"}


def test_archive_differs_from_manifest() -> None:
    s, a = release()
    assert rules(s, dataclasses.replace(a, size=a.size - 1)) == {"payload.archive-mismatch"}
    assert rules(s, dataclasses.replace(a, error="Zstd decompress error")) == {"payload.archive-mismatch"}


def test_archived_file_missing_extra_or_different() -> None:
    s, a = release()
    assert rules(s, dataclasses.replace(a, files=a.files[:1])) == {"payload.file-mismatch"}
    changed = dataclasses.replace(a.files[0], sha256="0" * 64)
    assert rules(s, dataclasses.replace(a, files=(changed, a.files[1]))) == {"payload.file-mismatch"}
    claimed_arch = dataclasses.replace(a.files[0], sass=frozenset({"sm_80"}))
    found = rules(s, dataclasses.replace(a, files=(claimed_arch, a.files[1])))
    assert "payload.file-mismatch" in found


def _messages(summaries: list[WheelSummary], archive: ArchiveFacts, rule: str) -> list[str]:
    findings, _ = analyze(summaries, archive, POLICY, frozenset({"libc.so.6"}))
    return [f.message for f in findings if f.rule == rule and f.severity == "error"]


def test_a_file_archived_twice_is_reported_as_the_runtime_refuses_it() -> None:
    s, a = release()
    again = dataclasses.replace(a, files=(*a.files, a.files[0]))
    assert rules(s, again) == {"payload.file-mismatch"}
    assert _messages(s, again, "payload.file-mismatch") == [
        "appears twice in the archive: kt_kernel.payload refuses the archive"
    ]
    # "./x" names the file the runtime writes as "x": the same file twice
    dotted = dataclasses.replace(a.files[0], path="./" + a.files[0].path)
    assert "appears twice" in " ".join(
        _messages(s, dataclasses.replace(a, files=(*a.files, dotted)), "payload.file-mismatch")
    )


def test_a_window_over_the_policys_is_reported_as_the_runtime_refuses_it() -> None:
    s, a = release()
    assert POLICY.payload is not None
    _manifest(s)["archive"]["window_log"] = POLICY.payload.zstd_window_log + 1
    (message,) = _messages(s, a, "payload.archive-mismatch")
    assert f"window_log {POLICY.payload.zstd_window_log + 1}" in message
    assert "kt_kernel.payload refuses it" in message
    _manifest(s)["archive"]["window_log"] = POLICY.payload.zstd_window_log
    assert rules(s, a) == set()


@pytest.mark.parametrize(
    ("name", "kind"), [("../../etc/evil", "file"), ("sgl_kernel/link.so", "link"), ("sgl_kernel/fifo", "special")]
)
def test_unsafe_archive_member(name: str, kind: str) -> None:
    s, a = release()
    bad = ArchivedFile(name, kind, 0, "", linkname="/etc/passwd" if kind == "link" else "")
    assert rules(s, dataclasses.replace(a, files=(*a.files, bad))) == {"payload.unsafe-member"}


def test_payload_carrier_tagged_any() -> None:
    s, a = release()
    s[1] = dataclasses.replace(s[1], tags=("py3-none-any",))
    assert rules(s, a) == {"payload.carrier-any"}


def test_part_carrier_outside_the_closure() -> None:
    s, a = release()
    req = tuple(r for r in s[-1].requires if not r.startswith("ktransformers"))
    s[-1] = dataclasses.replace(s[-1], requires=req)
    assert rules(s, a) == {"payload.closure"}


def test_manifest_missing_or_unreadable() -> None:
    s, a = release()
    assert rules(s[:-1], a) == {"payload.manifest"}
    s[-1] = dataclasses.replace(s[-1], manifest=None, manifest_error="Expecting value: line 1")
    assert rules(s, a) == {"payload.manifest"}


def test_unresolved_library_inside_the_archive() -> None:
    s, a = release()
    lonely = dataclasses.replace(a.files[1], elf=_elf(a.files[1].path, needed=("libkt_helper.so",)))
    assert rules(s, dataclasses.replace(a, files=(a.files[0], lonely))) == {"rpath.unresolved"}


def test_origin_rpath_resolves_inside_the_archive_and_driver_is_external() -> None:
    s, a = release()
    hopper = ArchivedFile(
        "kt_kernel/cuda/sm90a/libkt_cuda_sm90a.so",
        "file",
        10,
        "x",
        elf=_elf("kt_kernel/cuda/sm90a/libkt_cuda_sm90a.so", ("libkt_cuda.so", "libcuda.so.1"), ("$ORIGIN/../lib",)),
    )
    findings, _ = analyze(s, dataclasses.replace(a, files=(*a.files, hopper)), POLICY, frozenset({"libc.so.6"}))
    assert not [f for f in findings if f.rule.startswith("rpath.")]
    # ... but our own library may not link the driver
    assert {f.rule for f in findings if f.member.endswith("sm90a.so") and f.severity == "error"} >= {
        "elf.needed-forbidden"
    }


def test_torch_libraries_resolve_only_when_torch_is_required() -> None:
    s, a = release()
    ops = dataclasses.replace(a.files[0], elf=_elf(a.files[0].path, needed=("libtorch.so", "libcudart.so.13")))
    arch = dataclasses.replace(a, files=(ops, a.files[1]))
    assert rules(s, arch) == set()
    s[-1] = dataclasses.replace(s[-1], requires=tuple(r for r in s[-1].requires if not r.startswith("torch")))
    assert rules(s, arch) == {"rpath.unresolved"}


def test_missing_sass_is_an_error_only_where_nothing_runs() -> None:
    s, a = release()
    only_hopper = dataclasses.replace(a.files[0], sass=frozenset({"sm_90a"}))
    _manifest(s)["files"][a.files[0].path]["sass"] = ["sm_90a"]
    findings, section = analyze(s, dataclasses.replace(a, files=(only_hopper, a.files[1])), POLICY, frozenset())
    errors = [f for f in findings if f.rule == "payload.sass-coverage" and f.severity == "error"]
    assert sorted(f.message.split("capability ")[1].split(":")[0] for f in errors) == ["12.0", "8.0", "8.6", "8.9"]
    assert section["coverage"][a.files[0].path]["9.0"] == "sm_90a SASS"


@pytest.mark.parametrize(
    ("cc", "sass", "ptx", "expected"),
    [
        ("8.6", {"sm_80"}, set(), "sm_80 SASS"),  # same major, lower minor runs
        ("8.9", {"sm_80", "sm_86"}, set(), "sm_86 SASS"),  # the newest that fits
        ("8.0", {"sm_86"}, set(), None),  # a newer minor never runs on an older one
        ("9.0", {"sm_80"}, set(), None),  # SASS never crosses a major
        ("9.0", {"sm_90a"}, set(), "sm_90a SASS"),
        ("10.0", {"sm_90a"}, set(), None),  # arch-specific: only its own CC
        ("12.0", {"sm_120a"}, set(), "sm_120a SASS"),
        ("12.0", {"sm_80"}, {"compute_80"}, "compute_80 PTX (JIT)"),  # PTX JIT-compiles forward
        ("8.6", set(), {"compute_90"}, None),  # ... never backward
        ("12.0", set(), {"compute_90a"}, None),  # arch-specific PTX: only its own CC
    ],
)
def test_compatibility_rules(cc: str, sass: set[str], ptx: set[str], expected: str | None) -> None:
    assert runs_on(cc, frozenset(sass), frozenset(ptx)) == expected


def test_a_binary_cuobjdump_cannot_read_is_reported_once() -> None:
    s, a = release()
    unreadable = dataclasses.replace(a.files[0], cuda_error="cuobjdump fatal   : Uncompress failed")
    assert rules(s, dataclasses.replace(a, files=(unreadable, a.files[1]))) == {"cuda.fatbin-unreadable"}
    # a file whose bytes already differ from the manifest gets the mismatch only
    both = dataclasses.replace(unreadable, sha256="0" * 64)
    assert rules(s, dataclasses.replace(a, files=(both, a.files[1]))) == {"payload.file-mismatch"}
