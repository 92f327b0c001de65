"""Licenses (PEP 639): what the carriers write (carriers/licensing.py) and the audit rules that check it,
each on a wheel built with exactly its defect: license.undeclared, license.invalid (not SPDX, under
Metadata-Version 2.1, a License-File the wheel lacks or that climbs out), license.unlicensed-binary
(compiled code with no license file, a graft without its own, the payload provider without an origin's);
the third-party policy keeps them as warnings and info."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest

from audits import load_policy
from audits.core import run
from carriers import licensing, sbom, wheelio
from carriers.errors import DefinitionError, InputError
from tests.conftest import ROOT, load_source_module
from tests.wheelkit import compile_so, pure_wheel_members, write_wheel

DEFAULT = load_policy()
DI = "demo_pkg-1.0.dist-info"


def _audit(tmp_path: Path, members: dict[str, bytes], policy: str | None = None) -> list[tuple[str, str, str]]:
    write_wheel(tmp_path / "demo_pkg-1.0-py3-none-any.whl", members)
    report = run([tmp_path], load_policy(policy) if policy else DEFAULT)
    found = [(f["rule"], f["member"], f["severity"]) for f in report["findings"]]
    return sorted(f for f in found if f[0].startswith("license."))


def _meta(members: dict[str, bytes], old: str, new: str) -> dict[str, bytes]:
    text = members[f"{DI}/METADATA"].decode()
    assert old in text
    return {**members, f"{DI}/METADATA": text.replace(old, new).encode()}


@pytest.fixture(scope="module")
def elf(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    return compile_so(tmp_path_factory.mktemp("elf"), "libfoo.so", "int foo(void) { return 1; }\n")


def test_a_wheel_that_states_its_license_and_ships_its_text_passes(tmp_path: Path, elf: bytes) -> None:
    assert _audit(tmp_path, {**pure_wheel_members(), "demo_pkg/_ext.so": elf}) == []


def test_no_license_expression_is_undeclared(tmp_path: Path) -> None:
    members = pure_wheel_members(license=None)
    members = _meta(members, "Version: 1.0\n", "Version: 1.0\nLicense: MIT License\n")
    assert _audit(tmp_path, members) == [("license.undeclared", f"{DI}/METADATA", "error")]


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("License-Expression: MIT", "License-Expression: MIT OR Foo-License-9"),  # not SPDX
        ("Metadata-Version: 2.4", "Metadata-Version: 2.1"),  # the headers mean nothing before 2.4
        ("License-File: LICENSE", "License-File: COPYING"),  # names no shipped file
        ("License-File: LICENSE", "License-File: ../LICENSE"),  # climbs out
    ],
)
def test_a_malformed_license_header_is_invalid(tmp_path: Path, old: str, new: str) -> None:
    found = _audit(tmp_path, _meta(pure_wheel_members(), old, new))
    assert found, "no finding"
    assert {r for r, _, _ in found} == {"license.invalid"}, found


@pytest.mark.parametrize("where", ["LICENSE", "licenses/LICENSE"])
def test_a_metadata_2_1_license_file_is_found_where_that_version_puts_it(tmp_path: Path, where: str) -> None:
    """Before PEP 639, setuptools wrote License-File for a file at the .dist-info root (newer setuptools:
    under licenses/ there): a well-formed wheel of that Metadata-Version, no finding."""
    members = {k: v for k, v in pure_wheel_members(license=None).items() if "/licenses/" not in k}
    members = _meta(members, "Metadata-Version: 2.4", "Metadata-Version: 2.1")
    members = _meta(members, "Version: 1.0\n", "Version: 1.0\nLicense-File: LICENSE\n")
    members[f"{DI}/{where}"] = b"MIT\n"
    assert [f for f in _audit(tmp_path, members) if f[0] == "license.invalid"] == []
    del members[f"{DI}/{where}"]  # the file it names is gone: that is still wrong
    (invalid,) = [f for f in _audit(tmp_path, members) if f[0] == "license.invalid"]
    assert invalid[1] == f"{DI}/METADATA"


def test_a_pep_639_license_file_at_the_dist_info_root_is_not_where_2_4_puts_it(tmp_path: Path) -> None:
    members = pure_wheel_members()
    members[f"{DI}/LICENSE"] = members.pop(f"{DI}/licenses/LICENSE")
    found = _audit(tmp_path, members)
    assert ("license.invalid", f"{DI}/METADATA", "error") in found


def test_compiled_code_without_a_license_file_is_unlicensed(tmp_path: Path, elf: bytes) -> None:
    members = {k: v for k, v in pure_wheel_members().items() if "/licenses/" not in k}
    members = _meta(members, "License-File: LICENSE\n", "")
    members["demo_pkg/_ext.so"] = elf
    assert _audit(tmp_path, members) == [("license.unlicensed-binary", "demo_pkg/_ext.so", "error")]


def test_a_grafted_library_needs_a_license_file_of_its_own(tmp_path: Path, elf: bytes) -> None:
    lib = "demo_pkg.libs/libfoo-a34b3233.so.1"
    members = {**pure_wheel_members(), lib: elf}
    assert _audit(tmp_path, members) == [("license.unlicensed-binary", lib, "error")]
    members[f"{DI}/licenses/demo_pkg.libs/libfoo/copyright"] = b"libfoo's copyright file\n"
    listed = "License-File: LICENSE\nLicense-File: demo_pkg.libs/libfoo/copyright\n"
    members = _meta(members, "License-File: LICENSE\n", listed)
    assert _audit(tmp_path, members) == []


def _provider(licenses: dict[str, bytes]) -> dict[str, bytes]:
    members = pure_wheel_members()
    members[DEFAULT.payload.manifest_member if DEFAULT.payload else ""] = b"{}"
    archive = {
        "kt_kernel/cuda/lib/libkt_cuda.so": {"sha256": "a" * 64, "size": 1, "origin": "kt-kernel 0.6.1 (k.whl)"},
        "sgl_kernel/flash_ops.abi3.so": {"sha256": "b" * 64, "size": 1, "origin": "sglang-kernel 0.4.10 (s.whl)"},
    }
    doc = sbom.document("demo-pkg", "1.0", "0.6.1", sbom.Provenance(archive=archive), "MIT")
    members[f"{DI}/{sbom.MEMBER}"] = doc
    for path, data in licensing.payload_licenses({"kt-kernel": licenses}).items():
        members[f"{DI}/licenses/{path}"] = data
    return members


def test_the_payload_provider_ships_the_license_of_every_origin(tmp_path: Path) -> None:
    found = _audit(tmp_path, _provider({"LICENSE": b"Apache-2.0\n"}))
    assert found == [("license.unlicensed-binary", f"{DI}/licenses/payload/sglang-kernel/", "error")]


def test_the_third_party_policy_keeps_the_license_rules_as_warnings_and_info(tmp_path: Path, elf: bytes) -> None:
    members = pure_wheel_members(license=None)
    members["demo_pkg/_ext.so"] = elf
    found = {(r, s) for r, _, s in _audit(tmp_path, members, "third-party")}
    assert found == {("license.undeclared", "info"), ("license.unlicensed-binary", "warning")}
    found = {(r, s) for r, _, s in _audit(tmp_path, _meta(pure_wheel_members(), "MIT", "Nope-1"), "third-party")}
    assert found == {("license.invalid", "warning")}


UPSTREAM_21 = (
    "Metadata-Version: 2.1\nName: demo-pkg\nVersion: 1.0\nSummary: s\n"
    "License:                                  Apache License\n"
    "                                   Version 2.0, January 2004\n"
    "        \n"
    "           TERMS AND CONDITIONS\n"
    "Classifier: License :: OSI Approved :: Apache Software License\n"
    "Classifier: Programming Language :: Python :: 3\n"
    "License-File: LICENSE\n"
    "Requires-Dist: numpy\n\nThe description.\nLicense: in the body stays.\n"
)


def test_the_carriers_state_the_expression_and_list_every_license_file() -> None:
    members = {f"{DI}/METADATA": UPSTREAM_21.encode(), f"{DI}/LICENSE": b"text\n", f"{DI}/NOTICE": b"notice\n"}
    expression = licensing.expression_for("demo-pkg", "Apache-2.0", "demo", UPSTREAM_21)
    licensing.apply(members, DI, expression, "demo", extra={"payload/kt-kernel/LICENSE": b"kt\n"})
    meta = members[f"{DI}/METADATA"].decode()
    head, body = meta.split("\n\n", 1)
    assert head.splitlines() == [
        "Metadata-Version: 2.4",
        "Name: demo-pkg",
        "Version: 1.0",
        "Summary: s",
        "License-Expression: Apache-2.0",
        "License-File: LICENSE",
        "License-File: NOTICE",
        "License-File: payload/kt-kernel/LICENSE",
        "Classifier: Programming Language :: Python :: 3",
        "Requires-Dist: numpy",
    ]
    assert body == "The description.\nLicense: in the body stays.\n"
    assert sorted(n for n in members if "/licenses/" in n) == [
        f"{DI}/licenses/LICENSE",
        f"{DI}/licenses/NOTICE",
        f"{DI}/licenses/payload/kt-kernel/LICENSE",
    ]
    again = dict(members)
    licensing.apply(again, DI, expression, "demo")  # applying twice changes nothing
    assert again == members


def test_an_upstream_expression_wins_and_a_contradicting_one_is_an_error() -> None:
    meta = "Metadata-Version: 2.4\nName: x\nVersion: 1\nLicense-Expression: mit\n\n"
    assert licensing.expression_for("x-kt", "", "x", meta) == "MIT"
    assert licensing.expression_for("x-kt", "MIT", "x", meta) == "MIT"
    with pytest.raises(InputError, match=r"license = 'Apache-2.0', but upstream x declares License-Expression: MIT"):
        licensing.expression_for("x-kt", "Apache-2.0", "x", meta)
    with pytest.raises(InputError, match=r"x declares no License-Expression \(its License header says 'BSD'\)"):
        licensing.expression_for("x-kt", "", "x", "Metadata-Version: 2.1\nName: x\nVersion: 1\nLicense: BSD\n\n")


def test_a_license_file_the_upstream_lists_but_lacks_is_an_input_error() -> None:
    members = {f"{DI}/METADATA": UPSTREAM_21.encode()}
    with pytest.raises(InputError, match="lists License-File LICENSE, which the wheel does not ship"):
        licensing.apply(members, DI, "Apache-2.0", "upstream demo 1.0")


def test_carriers_toml_takes_only_spdx_expressions(tmp_path: Path) -> None:
    from carriers import model

    text = model.DEFINITIONS.read_text().replace('license = "Apache-2.0"', 'license = "Apache 2.0"', 1)
    (tmp_path / "carriers.toml").write_text(text)
    with pytest.raises(DefinitionError, match=r"license = 'Apache 2.0' is not an SPDX license expression"):
        model.load(tmp_path / "carriers.toml", patches_dir=model.DEFINITIONS.parent / "patches")


def test_the_sbom_states_the_wheels_license() -> None:
    members = pure_wheel_members("demo_pkg", "1.0", license="Apache-2.0")
    sbom.add(members, DI, "demo-pkg", "1.0", "0.6.1", sbom.Provenance())
    doc = json.loads(members[f"{DI}/{sbom.MEMBER}"])
    assert doc["metadata"]["component"]["licenses"] == [{"expression": "Apache-2.0"}]
    assert wheelio.dist_info(members) == DI


def test_the_kernel_build_adds_a_license_file_and_keeps_the_wheel_whole(tmp_path: Path) -> None:
    """build_wheel.add_license (the CUDA runtime's license of a CUDA build): the file listed in METADATA,
    the expression extended, RECORD right (the audit finds no integrity or license problem), idempotent."""
    build_wheel = load_source_module("kt_build_wheel_licenses", ROOT / "kernel" / "tools" / "build_wheel.py")
    wheel = write_wheel(tmp_path / "demo_pkg-1.0-py3-none-any.whl", pure_wheel_members(license="Apache-2.0"))
    build_wheel.add_license(wheel, "third_party/x/License.txt", b"terms\n", "LicenseRef-X")
    once = wheel.read_bytes()
    build_wheel.add_license(wheel, "third_party/x/License.txt", b"terms\n", "LicenseRef-X")
    assert wheel.read_bytes() == once
    with zipfile.ZipFile(wheel) as zf:
        meta = zf.read("demo_pkg-1.0.dist-info/METADATA").decode()
    listed = "License-File: LICENSE\nLicense-File: third_party/x/License.txt\n"
    assert f"License-Expression: Apache-2.0 AND LicenseRef-X\n{listed}" in meta
    assert [f["rule"] for f in run([wheel], DEFAULT)["findings"]] == []
