"""release/vulns.py with pip-audit's answers made up: a fork is asked about as its upstream, the project's
own distributions are not asked about, each Python's pin is asked once; a vulnerability is an error
unless a waiver in force names it (by id or alias) for that package; an expired waiver waives nothing;
a distribution the index has no data for is NOT CHECKED, never a pass; the policy refuses a bad date."""

from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import Any

import pytest

from audits import PolicyError, load_policy
from audits.policy import VulnerabilityWaiver
from base import distdir
from release import osv, vulns
from release.errors import ReleaseError
from tests import distkit

TODAY = datetime.date(2026, 12, 1)


def _dist(tmp_path: Path) -> Path:
    dist = tmp_path / "dist"
    h = " \\\n    --hash=sha256:" + "0" * 64 + "\n"
    install = {
        "install/sft-cp311.txt": "# KT release install file\n--only-binary :all:\n"
        f"transformers-kt==5.19.0.post1{h}kt-kernel==0.6.1{h}urllib3==2.5.0{h}",
        "install/sft-cp312.txt": f"urllib3==2.6.0{h}requests==2.32.5{h}",
    }
    upstream = distdir.Input("transformers", "5.19.0", "transformers-5.19.0-py3-none-any.whl", "1" * 64)
    wheels = {"transformers_kt-5.19.0.post1-py3-none-any.whl": b"t", "kt_kernel-0.6.1-py3-none-any.whl": b"k"}
    records = {"transformers_kt-5.19.0.post1-py3-none-any.whl": {"kind": "fork", "inputs": (upstream,)}}
    distkit.make_release(dist, wheels, install, records=records)
    return dist


def test_forks_are_asked_about_as_their_upstream_and_ours_not_at_all(tmp_path: Path) -> None:
    asked, not_asked = vulns.queries(_dist(tmp_path))
    assert asked == {
        ("transformers", "5.19.0"): ["sft-cp311.txt"],
        ("urllib3", "2.5.0"): ["sft-cp311.txt"],
        ("urllib3", "2.6.0"): ["sft-cp312.txt"],
        ("requests", "2.32.5"): ["sft-cp312.txt"],
    }
    assert list(not_asked) == ["kt-kernel"]


def test_two_versions_of_one_name_go_to_pip_audit_in_two_files(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[list[tuple[str, str]]] = []

    def fake(pins: list[tuple[str, str]], cache: Path) -> list[dict[str, Any]]:
        calls.append(pins)
        return []

    monkeypatch.setattr(vulns, "_pip_audit", fake)
    vulns.pip_audit([("requests", "2.32.5"), ("urllib3", "2.5.0"), ("urllib3", "2.6.0")], Path("unused"))
    assert calls == [[("requests", "2.32.5"), ("urllib3", "2.5.0")], [("urllib3", "2.6.0")]]


def _answers(pins: list[tuple[str, str]], cache: Path) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for name, version in pins:
        if name == "urllib3" and version == "2.5.0":
            out.append(
                {
                    "name": name,
                    "version": version,
                    "vulns": [
                        {"id": "GHSA-aaaa", "aliases": ["CVE-2026-1"], "fix_versions": ["2.6.0"]},
                        {"id": "PYSEC-bbbb", "aliases": [], "fix_versions": []},
                    ],
                }
            )
        elif name == "transformers":
            out.append({"name": name, "version": version, "vulns": [{"id": "GHSA-cccc", "aliases": []}]})
        elif name == "requests":
            reason = f"Dependency not found on PyPI and could not be audited: {name} ({version})"
            out.append({"name": name, "skip_reason": reason})
        else:
            out.append({"name": name, "version": version, "vulns": []})
    return out


def test_found_waived_expired_and_not_checked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vulns, "pip_audit", _answers)
    waivers = (
        VulnerabilityWaiver("CVE-2026-1", "urllib3", "not reachable from our code", datetime.date(2027, 1, 1)),
        VulnerabilityWaiver("PYSEC-bbbb", "urllib3", "was fixed downstream", datetime.date(2026, 11, 30)),
        VulnerabilityWaiver("GHSA-cccc", "numpy", "another package's waiver", datetime.date(2027, 1, 1)),
    )
    v = vulns.check(_dist(tmp_path), waivers, tmp_path / "cache", today=TODAY)
    assert [(w["package"], w["id"]) for w in v.waived] == [("urllib3", "GHSA-aaaa")]  # by its alias
    assert [(f["package"], f["id"], f.get("expired_waiver")) for f in v.found] == [
        ("transformers", "GHSA-cccc", None),  # transformers-kt's upstream: its advisory is the fork's
        ("urllib3", "PYSEC-bbbb", "2026-11-30"),
    ]
    assert list(v.not_checked) == ["requests==2.32.5"]  # pip-audit names the version in its reason only
    text = "\n".join(vulns.lines(v))
    assert "2 found, 1 waived, in 3 of 4 pinned distributions" in text
    assert "error: urllib3 2.5.0: PYSEC-bbbb (no fixed version yet; its waiver expired 2026-11-30)" in text
    assert "INCOMPLETE: 1 of 4 pins NOT CHECKED" in text


def test_a_vulnerability_waiver_needs_a_date(tmp_path: Path) -> None:
    policy = tmp_path / "p.toml"
    shipped = Path(__file__).parents[2] / "audits" / "policy"
    base = (shipped / "default.toml").read_text()
    (tmp_path / "cpu_variants.json").write_text((shipped / "cpu_variants.json").read_text())
    waiver = '\n[[vulnerability_waivers]]\nid = "GHSA-x"\npackage = "urllib3"\nreason = "r"\nexpires = "{}"\n'
    policy.write_text(base + waiver.format("2027-01-01"))
    (w,) = load_policy(policy).vulnerability_waivers
    assert (w.package, w.expires) == ("urllib3", datetime.date(2027, 1, 1))
    policy.write_text(base + waiver.format("2027-02-30"))
    with pytest.raises(PolicyError, match="expires '2027-02-30' is no date"):
        load_policy(policy)
    policy.write_text(base + waiver.format("soon"))
    with pytest.raises(PolicyError):
        load_policy(policy)


OSV: list[dict[str, Any]] = [
    {
        "id": "PYSEC-2019-217",
        "aliases": ["CVE-2019-10906", "GHSA-462w-v97r-4m45"],
        "modified": "2024-11-21T14:22:49Z",
        "affected": [
            {
                "package": {"ecosystem": "PyPI", "name": "Jinja2"},
                "ranges": [{"type": "ECOSYSTEM", "events": [{"introduced": "0"}, {"fixed": "2.10.1"}]}],
            }
        ],
    },
    {
        "id": "PYSEC-2019-132",
        "aliases": ["CVE-2019-11324"],
        "modified": "2025-02-03T08:00:00Z",
        "affected": [{"package": {"ecosystem": "PyPI", "name": "urllib3"}, "versions": ["1.24.1"]}],
    },
    {  # a range that does not reach the pinned requests, and another ecosystem's package of the same name
        "id": "GHSA-xxxx-old",
        "modified": "2020-01-01T00:00:00Z",
        "affected": [
            {
                "package": {"ecosystem": "PyPI", "name": "requests"},
                "ranges": [{"type": "ECOSYSTEM", "events": [{"introduced": "2.0"}, {"last_affected": "2.3"}]}],
            },
            {"package": {"ecosystem": "npm", "name": "urllib3"}, "versions": ["2.32.5"]},
        ],
    },
]


def _pinned(tmp_path: Path) -> Path:
    dist = tmp_path / "dist"
    h = " \\\n    --hash=sha256:" + "0" * 64 + "\n"
    install = {"install/serve-cp311.txt": f"jinja2==2.10{h}urllib3==1.24.1{h}requests==2.32.5{h}"}
    distkit.make_release(dist, {}, install)
    return dist


def _as(form: str, tmp_path: Path) -> Path:
    import zipfile

    if form == "json":
        path = tmp_path / "osv.json"
        path.write_text(json.dumps(OSV))
    elif form == "folder":
        path = tmp_path / "osv"
        path.mkdir()
        for doc in OSV:
            (path / f"{doc['id']}.json").write_text(json.dumps(doc))
    else:
        path = tmp_path / "all.zip"
        with zipfile.ZipFile(path, "w") as zf:
            for doc in OSV:
                zf.writestr(f"{doc['id']}.json", json.dumps(doc))
    return path


@pytest.mark.parametrize("form", ["zip", "folder", "json"])
def test_osv_advisories_on_disk_find_the_known_vulnerable_pins(tmp_path: Path, form: str) -> None:
    advisories = _as(form, tmp_path)
    found = vulns.check(_pinned(tmp_path), (), tmp_path / "cache", TODAY, advisories=advisories)
    assert sorted((f["package"], f["version"], f["id"]) for f in found.found) == [
        ("jinja2", "2.10", "PYSEC-2019-217"),
        ("urllib3", "1.24.1", "PYSEC-2019-132"),
    ]
    assert found.found[0]["fix_versions"] == ["2.10.1"]
    assert found.not_checked == {}
    source = found.as_dict()["source"]
    assert source["kind"] == "advisory file"
    assert source["date"] == "2025-02-03T08:00:00Z"  # the newest advisory's
    assert source["advisories"] == 3
    assert len(source["sha256"]) == 64
    line = "\n".join(vulns.lines(found))
    assert f"data: {advisories} sha256 {source['sha256'][:16]}, as of 2025-02-03T08:00:00Z" in line


def test_an_osv_waiver_by_alias_waives_and_a_version_that_is_no_version_is_not_checked(tmp_path: Path) -> None:
    waiver = VulnerabilityWaiver("CVE-2019-11324", "urllib3", "pinned by a fork", datetime.date(2027, 1, 1))
    found = vulns.check(_pinned(tmp_path), (waiver,), tmp_path / "cache", TODAY, advisories=_as("json", tmp_path))
    assert [w["id"] for w in found.waived] == ["PYSEC-2019-132"]
    data = osv.load(_as("json", tmp_path))
    assert data.dependencies([("jinja2", "not a version")])[0]["skip_reason"].startswith("not a PEP 440 version")


@pytest.mark.parametrize(
    ("content", "match"),
    [("{not json", "not JSON"), ('{"affected": []}', "not an OSV advisory"), ("[]", "holds no OSV advisory")],
)
def test_advisory_data_that_is_not_osv_is_refused_naming_the_file(tmp_path: Path, content: str, match: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(ReleaseError, match=match):
        osv.load(path)
    with pytest.raises(ReleaseError, match="no such file"):
        osv.load(tmp_path / "missing.zip")
