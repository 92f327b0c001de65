"""carriers/sbom.py claims only what it checked: a grafted library is a Debian package's file only when its
bytes are that file's (dpkg's md5sums); the CUDA runtime kt-kernel links statically is a component of its own;
the document is dated with the release, never 1980."""

from __future__ import annotations

import datetime
import hashlib
import json
from pathlib import Path

import pytest

from carriers import sbom


@pytest.fixture
def dpkg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A dpkg database that says libgomp1 installs /usr/lib/x86_64-linux-gnu/libgomp.so.1.0.0 with this md5."""
    info = tmp_path / "info"
    info.mkdir()
    host = b"the host's libgomp.so.1.0.0"
    md5 = hashlib.md5(host, usedforsecurity=False).hexdigest()
    (info / "libgomp1:amd64.md5sums").write_text(f"{md5}  usr/lib/x86_64-linux-gnu/libgomp.so.1.0.0\n")
    monkeypatch.setattr(sbom, "DPKG_INFO", info)
    owner = ("libgomp1:amd64", "12.2.0-14+deb12u1", "/usr/lib/x86_64-linux-gnu/libgomp.so.1.0.0")
    monkeypatch.setattr(sbom, "_dpkg_owner", lambda name: owner if name == "libgomp.so.1.0.0" else None)
    return tmp_path


def _components(members: dict[str, bytes], **prov: object) -> dict[str, dict[str, object]]:
    doc = json.loads(sbom.document("kt-kernel", "0.6.1", "0.6.1", sbom.Provenance(**prov)))  # type: ignore[arg-type]
    return {c["name"]: c for c in doc.get("components", [])}


def _props(c: dict[str, object]) -> dict[str, str]:
    return {p["name"]: p["value"] for p in c.get("properties", [])}  # type: ignore[attr-defined]


def test_a_graft_is_claimed_for_a_package_only_when_its_bytes_are_the_package_s_file(dpkg: Path) -> None:
    patched = b"libgomp after auditwheel's patchelf"  # what a graft really holds: not the package's bytes
    same = b"the host's libgomp.so.1.0.0"
    grafts = sbom.grafted(
        {"kt_kernel.libs/libgomp-a34b3233.so.1.0.0": patched, "other.libs/libgomp-0123abcd.so.1.0.0": same}
    )
    got = _components({}, grafted=grafts)
    assert "kt:build-host-package" not in _props(got["kt_kernel.libs/libgomp-a34b3233.so.1.0.0"])
    verified = _props(got["other.libs/libgomp-0123abcd.so.1.0.0"])
    assert verified["kt:build-host-package"] == "libgomp1:amd64 12.2.0-14+deb12u1"
    assert "dpkg md5sums" in verified["kt:verified"]


def test_the_statically_linked_cuda_runtime_is_a_component(dpkg: Path) -> None:
    build = {
        "cuda": {
            "archive": "release",
            "files": {"lib/libkt_cuda.so": {}, "sm90a/libkt_cuda_sm90a.so": {}},
            "runtime": {"library": "cudart_static", "version": "13.5.37", "source": "pypi:nvidia-cuda-runtime"},
        }
    }
    static = sbom.static({"kt_kernel/_build.json": json.dumps(build).encode(), "kt_kernel/x/_build.json": b"{"})
    assert static == [
        sbom.Static(
            "cudart_static", "13.5.37", "pypi:nvidia-cuda-runtime", ("lib/libkt_cuda.so", "sm90a/libkt_cuda_sm90a.so")
        )
    ]
    c = _components({}, static=static)["cudart_static"]
    assert c["version"] == "13.5.37"
    assert c["purl"] == "pkg:pypi/nvidia-cuda-runtime@13.5.37"
    assert _props(c)["kt:role"] == "library linked statically"
    assert sbom.static({"kt_kernel/_build.json": json.dumps({"cuda": None}).encode()}) == []


def test_the_document_is_dated_with_the_release(monkeypatch: pytest.MonkeyPatch) -> None:
    from base.version import release_date

    monkeypatch.delenv("SOURCE_DATE_EPOCH", raising=False)
    doc = json.loads(sbom.document("x", "1", "1", sbom.Provenance()))
    assert doc["metadata"]["timestamp"].startswith(release_date().isoformat())
    monkeypatch.setenv("SOURCE_DATE_EPOCH", str(int(datetime.datetime(2027, 1, 2, tzinfo=datetime.UTC).timestamp())))
    assert json.loads(sbom.document("x", "1", "1", sbom.Provenance()))["metadata"]["timestamp"].startswith("2027-01-02")
