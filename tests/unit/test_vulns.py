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


def _one(tmp_path: Path, affected: dict[str, Any], **doc: Any) -> osv.Advisories:
    path = tmp_path / "one.json"
    entry = {"package": {"ecosystem": "PyPI", "name": "pkg"}, **affected}
    path.write_text(json.dumps({"id": "OSV-1", "modified": "2026-01-01T00:00:00Z", "affected": [entry], **doc}))
    return osv.load(path)


def _state(data: osv.Advisories, version: str) -> str:
    (dep,) = data.dependencies([("pkg", version)])
    if "skip_reason" in dep or dep.get("not_evaluated"):
        return "not checked"
    return "affected" if dep["vulns"] else "clean"


@pytest.mark.parametrize(
    ("affected", "version", "state"),
    [
        ({"versions": ["2013b"]}, "2013b0", "affected"),  # PEP 440: the same version
        ({"versions": ["1.0"]}, "1.0.0", "affected"),
        ({"versions": ["2.1.2"]}, "2.1.2+cu121", "affected"),  # a local label is pip's match of 2.1.2
        ({"versions": ["2.1.2+cu121"]}, "2.1.2", "affected"),
        ({"versions": ["2.1.3"]}, "2.1.2+cu121", "clean"),
        (
            {"ranges": [{"type": "ECOSYSTEM", "events": [{"introduced": "0"}, {"last_affected": "2.1.2"}]}]},
            "2.1.2+cu121",
            "affected",
        ),
        (
            {"ranges": [{"type": "ECOSYSTEM", "events": [{"introduced": "0"}, {"fixed": "2.1.2"}]}]},
            "2.1.2+cu121",
            "clean",
        ),
        ({"ranges": [{"type": "ECOSYSTEM", "events": [{"introduced": "1.0"}, {"limit": "1.5"}]}]}, "1.4.9", "affected"),
        ({"ranges": [{"type": "ECOSYSTEM", "events": [{"introduced": "1.0"}, {"limit": "1.5"}]}]}, "1.5", "clean"),
        # several limits are several upper bounds: below a later one is affected (read as `fixed`, it was clean)
        (
            {"ranges": [{"type": "ECOSYSTEM", "events": [{"introduced": "1.0"}, {"limit": "2.0"}, {"limit": "5.0"}]}]},
            "3.0",
            "affected",
        ),
        (
            {"ranges": [{"type": "ECOSYSTEM", "events": [{"introduced": "1.0"}, {"limit": "2.0"}, {"limit": "5.0"}]}]},
            "5.0",
            "clean",
        ),
        ({"ranges": [{"type": "ECOSYSTEM", "events": [{"introduced": "1.0"}, {"limit": "*"}]}]}, "99", "affected"),
        (
            {"ranges": [{"type": "ECOSYSTEM", "events": [{"introduced": "1.0"}, {"fixed": "1.2"}, {"limit": "*"}]}]},
            "1.3",
            "clean",
        ),
        # a limit below an introduced bounds it too: the version is past every limit
        (
            {
                "ranges": [
                    {"type": "ECOSYSTEM", "events": [{"introduced": "0"}, {"limit": "1.0"}, {"introduced": "2.0"}]}
                ]
            },
            "2.5",
            "clean",
        ),
        (
            {
                "ranges": [
                    {"type": "ECOSYSTEM", "events": [{"introduced": "1.0"}, {"fixed": "1.2"}, {"introduced": "1.5"}]}
                ]
            },
            "1.3",
            "clean",
        ),
        (
            {
                "ranges": [
                    {"type": "ECOSYSTEM", "events": [{"introduced": "1.0"}, {"fixed": "1.2"}, {"introduced": "1.5"}]}
                ]
            },
            "1.6",
            "affected",
        ),
        # what cannot be evaluated here is NOT CHECKED, never clean
        (
            {"ranges": [{"type": "ECOSYSTEM", "events": [{"introduced": "0"}, {"fixed": "v2-final"}]}]},
            "1.0",
            "not checked",
        ),
        ({"ranges": [{"type": "SEMVER", "events": [{"introduced": "0"}, {"fixed": "2.0.0"}]}]}, "1.0.0", "not checked"),
        ({"ranges": [{"type": "GIT", "repo": "https://x", "events": [{"introduced": "abc"}]}]}, "1.0", "not checked"),
        (
            {"ranges": [{"type": "GIT", "repo": "https://x", "events": [{"introduced": "abc"}]}], "versions": ["0.9"]},
            "1.0",
            "clean",
        ),  # a GIT range with its versions: the versions say
        ({"versions": ["1.0", "latest"]}, "2.0", "not checked"),
        ({"versions": ["1.0", "latest"]}, "1.0", "affected"),  # a definite match stands
    ],
)
def test_osv_versions_and_ranges_are_read_as_pep_440_and_osv_mean_them(
    tmp_path: Path, affected: dict[str, Any], version: str, state: str
) -> None:
    assert _state(_one(tmp_path, affected), version) == state


def test_what_an_advisory_cannot_say_leaves_the_pin_not_checked_in_the_release(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    install = {"install/serve-cp311.txt": "pkg==1.0 \\\n    --hash=sha256:" + "0" * 64 + "\n"}
    distkit.make_release(dist, {}, install)
    path = tmp_path / "semver.json"
    entry = {
        "package": {"ecosystem": "PyPI", "name": "pkg"},
        "ranges": [{"type": "SEMVER", "events": [{"introduced": "0"}]}],
    }
    path.write_text(json.dumps({"id": "GHSA-semver", "affected": [entry]}))
    found = vulns.check(dist, (), tmp_path / "cache", TODAY, advisories=path)
    assert found.found == []
    assert list(found.not_checked) == ["pkg==1.0"]
    assert "GHSA-semver: a SEMVER range" in found.not_checked["pkg==1.0"]


def test_a_withdrawn_advisory_is_ignored_and_said_so(tmp_path: Path) -> None:
    data = _one(tmp_path, {"versions": ["1.0"]}, withdrawn="2026-02-01T00:00:00Z")
    assert _state(data, "1.0") == "clean"
    assert data.source["withdrawn"] == ["OSV-1"]
    v = vulns.Vulnerabilities(asked=1, source=data.source)
    assert "1 withdrawn advisories ignored (OSV-1)" in vulns.lines(v)[0]


@pytest.mark.parametrize(
    ("doc", "match"),
    [
        ({"id": "X", "affected": [{"package": "pkg"}]}, r"advisory X: `affected\[0\]\.package` is not an object"),
        (
            {"id": "X", "affected": [{"package": {"name": "p"}, "ranges": {"type": "x"}}]},
            r"`affected\[0\]\.ranges` is not a list",
        ),
        (
            {
                "id": "X",
                "affected": [{"package": {"name": "p"}, "ranges": [{"type": "ECOSYSTEM", "events": [{"fixed": 1}]}]}],
            },
            r"events` is not a list of events with string versions",
        ),
        (
            {"id": "X", "affected": [{"package": {"name": "p"}, "versions": "1.0"}]},
            r"versions` is not a list of strings",
        ),
        ({"id": "X", "affected": ["p"]}, r"`affected\[0\]` is not an object"),
    ],
)
def test_advisory_data_of_the_wrong_shape_is_refused_by_name(tmp_path: Path, doc: dict[str, Any], match: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(ReleaseError, match=match):
        osv.load(path)


def test_deeply_nested_json_and_a_damaged_zip_are_refused_by_name(tmp_path: Path) -> None:
    import zipfile

    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ReleaseError, match="nested deeper than any advisory"):
        osv.load(deep)
    good = _as("zip", tmp_path)
    raw = bytearray(good.read_bytes())
    with zipfile.ZipFile(good) as zf:
        info = zf.infolist()[0]
    start = info.header_offset + 30 + len(info.filename.encode()) + len(info.extra)
    raw[start + 2] ^= 0xFF  # one byte of the first member's data: its CRC no longer holds
    bad = tmp_path / "bad.zip"
    bad.write_bytes(bytes(raw))
    with pytest.raises(ReleaseError, match=rf"{info.filename} is damaged .*download the advisory data again"):
        osv.load(bad)


def test_advisory_archives_are_bounded_in_count_and_total_before_anything_is_inflated(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A small zip of many members, each within the one-member bound, that inflates past the whole's bound is
    refused from its directory alone (no member read), as is one with more members than any export holds."""
    import time
    import zipfile

    monkeypatch.setattr(osv, "_TOTAL_LIMIT", 64 << 20)  # the real bound is 1 GiB: the same check, made quickly
    bomb = tmp_path / "bomb.zip"
    doc = b'{"id": "X"' + b" " * (1 << 20) + b"}"  # valid OSV of 1 MiB; deflates to ~1 KiB
    with zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as zf:
        for n in range(130):  # 130 MiB declared
            zf.writestr(f"X-{n}.json", doc)
    assert bomb.stat().st_size < 1 << 20
    read: list[object] = []

    def reading(*args: object, **kwargs: object) -> bytes:
        read.append(args)
        return b""

    monkeypatch.setattr(zipfile.ZipFile, "read", reading)
    t0 = time.perf_counter()
    with pytest.raises(ReleaseError, match=r"bomb.zip: 0.1 GiB of advisories, more than any OSV export's"):
        osv.load(bomb)
    assert time.perf_counter() - t0 < 2
    assert not read
    monkeypatch.setattr(osv, "_COUNT_LIMIT", 100)
    with pytest.raises(ReleaseError, match="130 documents, more than any OSV export's 100"):
        osv.load(bomb)
    folder = tmp_path / "folder"
    folder.mkdir()
    for n in range(101):
        (folder / f"X-{n}.json").write_text('{"id": "X"}')
    with pytest.raises(ReleaseError, match="101 documents"):
        osv.load(folder)


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


def test_the_audit_s_key_holds_the_waivers_in_force_so_an_expired_one_runs_it_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With an advisory file the key held only its sha256: an audit recorded while a waiver was in force was
    reused after it expired. The set of waivers in force today is in the key now."""
    from release import audit

    waiver = VulnerabilityWaiver("GHSA-x", "urllib3", "r", datetime.date(2026, 12, 5))
    assert audit.in_force((waiver,), datetime.date(2026, 12, 5)) == ["urllib3:GHSA-x until 2026-12-05"]
    assert audit.in_force((waiver,), datetime.date(2026, 12, 6)) == []
    keyed: list[str] = []

    class Stop(Exception):
        pass

    def stage(*args: Any, vulnerabilities: str = "", **kwargs: Any) -> Any:
        keyed.append(vulnerabilities)
        raise Stop

    monkeypatch.setattr("base.stages.audit", stage)
    dist = _pinned(tmp_path)
    for day in (datetime.date(2026, 12, 5), datetime.date(2026, 12, 6)):
        monkeypatch.setattr(
            audit,
            "in_force",
            lambda ws, today=None, day=day: [f"{w.package}:{w.id}" for w in (waiver,) if w.expires >= day],
        )
        with pytest.raises(Stop):
            audit.main(["--dist", str(dist), "--advisories", str(_as("json", tmp_path))])
    assert keyed[0] != keyed[1]
    assert keyed[0].endswith("waivers in force: ['urllib3:GHSA-x']")
    assert keyed[1].endswith("waivers in force: []")
