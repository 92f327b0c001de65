"""The SBOM rules, each on a wheel built with exactly its defect: sbom.missing (a KT release's wheel
without one; anyone else's wheels are not held to it), sbom.invalid (not JSON, not CycloneDX, not valid
against CycloneDX's schema), sbom.mismatch (another distribution, or an upstream, graft or payload part
left out); the SBOM carriers/sbom.py writes passes them all, byte for byte the same each time."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from audits import load_policy
from audits.core import run
from base import distdir
from carriers import sbom
from tests import distkit
from tests.wheelkit import pure_wheel_members, write_wheel

DEFAULT = load_policy()
LIB = "peft_kt.libs/libgomp-a34b3233.so.1"
PART = "peft_kt/_kt_payload/cuda.tar.zst.02-of-05"
UPSTREAM = sbom.Upstream("peft", "0.21.2", "peft-0.21.2-py3-none-any.whl", "c" * 64)


def _fork(extra: dict[str, bytes] | None = None) -> dict[str, bytes]:
    """A renamed fork of a KT release (its kt_upstream.json), with a library graft and a payload part."""
    members = pure_wheel_members("peft_kt", "0.21.2")
    di = "peft_kt-0.21.2.dist-info"
    members[f"{di}/kt_upstream.json"] = json.dumps({"carrier": "peft-kt", "name": "peft", "version": "0.21.2"}).encode()
    members[LIB] = b"\x7fELF not really"
    members[PART] = b"part bytes"
    members.update(extra or {})
    return members


def _sbom(members: dict[str, bytes], **changes: object) -> bytes:
    prov = sbom.Provenance(
        upstream=UPSTREAM,
        grafted=sbom.grafted(members),
        part=sbom.Part(PART, 2, 5, len(members[PART]), hashlib.sha256(members[PART]).hexdigest()),
    )
    for key, value in changes.items():
        setattr(prov, key, value)
    return sbom.document("peft-kt", str(changes.get("version", "0.21.2")), "0.6.1", prov)


def _audit(tmp_path: Path, members: dict[str, bytes], *others: dict[str, bytes]) -> list[tuple[str, str]]:
    write_wheel(tmp_path / "peft_kt-0.21.2-py3-none-any.whl", members)
    for i, other in enumerate(others):
        write_wheel(tmp_path / f"other{i}-1.0-py3-none-any.whl", other)
    report = run([tmp_path], DEFAULT)
    return sorted((f["rule"], f["member"]) for f in report["findings"] if f["rule"].startswith("sbom."))


def _with_sbom(members: dict[str, bytes], doc: bytes) -> dict[str, bytes]:
    return {**members, f"peft_kt-0.21.2.dist-info/{sbom.MEMBER}": doc}


def test_the_sbom_the_carriers_write_passes_and_is_deterministic(tmp_path: Path) -> None:
    members = _fork()
    assert _sbom(members) == _sbom(members)
    doc = json.loads(_sbom(members))
    assert "serialNumber" not in doc
    from base.version import release_date

    assert doc["metadata"]["timestamp"] == f"{release_date().isoformat()}T00:00:00+00:00"  # the release's date
    assert _audit(tmp_path, _with_sbom(members, _sbom(members))) == []


def test_a_release_wheel_without_an_sbom_is_missing_one(tmp_path: Path) -> None:
    other = pure_wheel_members("other0", "1.0")
    assert _audit(tmp_path, _with_sbom(_fork(), _sbom(_fork())), other) == [("sbom.missing", "")]


def test_wheels_that_are_no_kt_release_are_not_held_to_an_sbom(tmp_path: Path) -> None:
    write_wheel(tmp_path / "demo_pkg-1.0-py3-none-any.whl", pure_wheel_members())
    assert not [f for f in run([tmp_path], DEFAULT)["findings"] if f["rule"].startswith("sbom.")]


SBOM = f"peft_kt-0.21.2.dist-info/{sbom.MEMBER}"

INVALID: dict[str, Callable[[bytes], bytes]] = {
    "not JSON": lambda doc: doc[:-20],
    "not CycloneDX": lambda doc: json.dumps({**json.loads(doc), "bomFormat": "SPDX"}).encode(),
    "against the schema": lambda doc: doc.replace(b'"type": "library"', b'"type": "spaceship"', 1),
    "an unknown spec version": lambda doc: json.dumps({**json.loads(doc), "specVersion": "9.9"}).encode(),
    "nested past the parser (hostile)": lambda doc: b"[" * 200_000 + b"]" * 200_000,
    # IRIs are still checked with rfc3987-syntax left unimported (audits.readers._json.jsonschema_module)
    "an externalReference url that is no IRI": lambda doc: json.dumps(
        {**json.loads(doc), "externalReferences": [{"type": "website", "url": "http://exa mple.com/ a"}]}
    ).encode(),
}


@pytest.mark.parametrize("what", list(INVALID))
def test_an_sbom_that_is_not_valid_cyclonedx_is_invalid(tmp_path: Path, what: str) -> None:
    members = _fork()
    assert _audit(tmp_path, _with_sbom(members, INVALID[what](_sbom(members)))) == [("sbom.invalid", SBOM)]


def test_an_iri_outside_ascii_is_a_valid_reference(tmp_path: Path) -> None:
    members = _fork()
    ref = {"type": "website", "url": "https://例え.jp/パス?q=ü#frag"}
    doc = json.dumps({**json.loads(_sbom(members)), "externalReferences": [ref]}).encode()
    assert _audit(tmp_path, _with_sbom(members, doc)) == []


MISMATCH: dict[str, tuple[Callable[[dict[str, bytes]], bytes], str]] = {
    "another version": (lambda m: _sbom(m, version="0.21.1"), SBOM),
    "the upstream left out": (lambda m: _sbom(m, upstream=None), SBOM),
    "a graft left out": (lambda m: _sbom(m, grafted=[]), LIB),
    "a payload part left out": (lambda m: _sbom(m, part=None), PART),
    "a payload part of other bytes": (
        lambda m: _sbom(m, part=sbom.Part(PART, 2, 5, 10, "0" * 64)),
        PART,
    ),
}


@pytest.mark.parametrize("what", list(MISMATCH))
def test_an_sbom_that_leaves_out_what_the_wheel_holds_is_a_mismatch(tmp_path: Path, what: str) -> None:
    members = _fork()
    make, member = MISMATCH[what]
    assert _audit(tmp_path, _with_sbom(members, make(members))) == [("sbom.mismatch", member)]


def test_the_third_party_policy_keeps_the_sbom_rules_as_warnings(tmp_path: Path) -> None:
    members = _fork()
    write_wheel(tmp_path / "peft_kt-0.21.2-py3-none-any.whl", _with_sbom(members, _sbom(members, upstream=None)))
    write_wheel(tmp_path / "other0-1.0-py3-none-any.whl", pure_wheel_members("other0", "1.0"))
    found = {f["rule"]: f["severity"] for f in run([tmp_path], load_policy("third-party"))["findings"]}
    assert found["sbom.mismatch"] == "warning"
    assert found["sbom.missing"] == "info"


def _manifest(tmp_path: Path, inputs_sha: str, patch_sha: str | None = None) -> None:
    """A release manifest (base.distdir's types, so of the shape the audit's schema asks) recording
    the fork's input and patches."""
    fork = {
        "kind": "fork",
        "inputs": (distdir.Input(UPSTREAM.name, UPSTREAM.version, UPSTREAM.filename, inputs_sha),),
        "patches": (distdir.Patch("0001-x.patch", patch_sha),) if patch_sha else (),
    }
    wheel = distkit.wheel("peft_kt-0.21.2-py3-none-any.whl", b"", **fork)
    manifest = distdir.Manifest(1, "1", ("3.11",), "", (), (wheel,))
    (tmp_path / distdir.MANIFEST).write_text(distdir.manifest_text(manifest))


def test_every_input_the_release_manifest_records_is_in_the_sbom_by_its_hash(tmp_path: Path) -> None:
    members = _fork()
    _manifest(tmp_path, UPSTREAM.sha256)
    assert _audit(tmp_path, _with_sbom(members, _sbom(members))) == []
    _manifest(tmp_path, "d" * 64)  # the manifest says the fork was made from other bytes than its SBOM says
    assert _audit(tmp_path, _with_sbom(members, _sbom(members))) == [("sbom.mismatch", "")]
    _manifest(tmp_path, UPSTREAM.sha256, patch_sha="e" * 64)  # a patch the SBOM does not list
    assert _audit(tmp_path, _with_sbom(members, _sbom(members))) == [("sbom.mismatch", "")]


def test_an_unreadable_release_manifest_is_reported_not_trusted(tmp_path: Path) -> None:
    members = _fork()
    (tmp_path / "manifest.json").write_bytes(b"[" * 100_000)
    write_wheel(tmp_path / "peft_kt-0.21.2-py3-none-any.whl", _with_sbom(members, _sbom(members)))
    found = [(f["rule"], f["wheel"]) for f in run([tmp_path], DEFAULT)["findings"] if f["rule"].startswith("sbom.")]
    assert found == [("sbom.mismatch", "manifest.json")]


def test_a_release_manifest_of_the_wrong_shape_is_named_with_the_schema_problem(tmp_path: Path) -> None:
    """The audit reads dist/manifest.json against release-manifest.schema.json (base.distdir's types)."""
    members = _fork()
    _manifest(tmp_path, UPSTREAM.sha256)
    path = tmp_path / distdir.MANIFEST
    path.write_text(path.read_text().replace(UPSTREAM.sha256, UPSTREAM.sha256.upper()))
    write_wheel(tmp_path / "peft_kt-0.21.2-py3-none-any.whl", _with_sbom(members, _sbom(members)))
    (finding,) = [f for f in run([tmp_path], DEFAULT)["findings"] if f["rule"].startswith("sbom.")]
    assert (finding["rule"], finding["wheel"]) == ("sbom.mismatch", "manifest.json")
    assert "not a release-manifest document at $.wheels[0].inputs[0].sha256" in finding["message"]


def test_a_manifest_json_beside_anyone_elses_wheels_is_not_judged(tmp_path: Path) -> None:
    """Only a KT release's manifest.json is the release manifest; another tool's file of that name in a
    folder of third-party wheels gets no finding."""
    (tmp_path / "manifest.json").write_text('{"files": ["other0-1.0-py3-none-any.whl"]}')
    write_wheel(tmp_path / "other0-1.0-py3-none-any.whl", pure_wheel_members("other0", "1.0"))
    assert [f["rule"] for f in run([tmp_path], DEFAULT)["findings"] if f["rule"].startswith("sbom.")] == []
