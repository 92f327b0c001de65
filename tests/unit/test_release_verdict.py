"""Three verdicts: PASSED only when every check ran for these wheels and passed; FAILED when one found a
problem (no acceptance turns a failure into a pass); INCOMPLETE when one did not run or could not check
(NOT VERIFIED, NOT CHECKED), naming each item and the flag that accepts it. An accepted item is listed
with its reason wherever the verdict is shown, and publish refuses anything else."""

from __future__ import annotations

import dataclasses
import datetime
from pathlib import Path
from typing import Any

import pytest

from audits.policy import IncompleteAcceptance
from base import distdir
from release import verdict as v
from release.errors import ReleaseError
from release.publish import PublishError, releasable
from tests import distkit

CLEAN = {"asked": 2, "found": [], "waived": [], "not_checked": {}, "source": {"kind": "the index (pip-audit)"}}


def _items(vulnerabilities: object = CLEAN, interpreters: dict[str, object] | None = None) -> list[v.Item]:
    return [
        *v.dist_items("k"),
        *v.partial_items(distdir.Manifest(1, "1", ("3.11",), "", (), ())),
        *v.audit_items({"passed": True}),
        *v.vulnerability_items(vulnerabilities),
        *v.verify_items(["sft-cpu"], {"sft-cpu": {}}, {}),
        *v.resolution_items(
            [("sft", "3.11")],
            {"dist_sha256": "k", "results": [{"profile": "sft", "python": "3.11", "problems": [], "not_verified": ""}]},
            "k",
        ),
        *v.interpreter_items(["3.13"], interpreters if interpreters is not None else {"3.13": {}}, {}),
    ]


def test_everything_checked_and_passed_is_passed() -> None:
    judged = v.Verdict(_items())
    assert judged.verdict == v.PASSED
    assert judged.publishable
    assert judged.lines() == ["release verdict: PASSED (7 of 7 checks passed)"]


def test_a_pin_not_checked_or_an_interpreter_not_verified_is_incomplete_and_names_its_flag() -> None:
    unchecked = {**CLEAN, "not_checked": {"jinja2==2.10": "no data from the index"}}
    judged = v.Verdict(_items(unchecked, {"3.13": {"not_verified": "debootstrap is not installed"}}))
    assert judged.verdict == v.INCOMPLETE
    assert not judged.publishable
    assert [i.name for i in judged.missing] == ["vulnerabilities:jinja2==2.10", "python:3.13"]
    text = "\n".join(judged.lines())
    assert "missing vulnerabilities:jinja2==2.10: NOT CHECKED: no data from the index" in text
    assert "--accept 'python:3.13=REASON'" in text


def test_missing_items_accepted_by_name_or_glob_may_be_published_and_say_so() -> None:
    unchecked = {**CLEAN, "not_checked": {"a==1": "x", "b==2": "y"}}
    accepted = v.parse_accept(["vulnerabilities:*=no per-version data on this mirror"])
    judged = v.Verdict(_items(unchecked), accepted)
    assert judged.verdict == v.INCOMPLETE
    assert judged.publishable
    assert judged.badge == "INCOMPLETE, ACCEPTED (2 items)"
    record = judged.as_dict()
    assert [a["item"] for a in record["accepted"]] == ["vulnerabilities:a==1", "vulnerabilities:b==2"]
    assert record["accepted"][0]["reason"] == "no per-version data on this mirror"
    assert record["accepted"][0]["by"] == "command line"


def test_a_failure_is_never_accepted() -> None:
    found = {**CLEAN, "found": [{"package": "urllib3", "version": "1.24.1", "id": "PYSEC-2019-132"}]}
    judged = v.Verdict(_items(found), v.parse_accept(["*=accept everything"]))
    assert judged.verdict == v.FAILED
    assert not judged.publishable
    assert "FAILED vulnerability:urllib3==1.24.1:PYSEC-2019-132: PYSEC-2019-132 in urllib3 1.24.1" in judged.lines()[1]


def test_a_skipped_or_absent_vulnerability_check_is_missing() -> None:
    for data in (None, {"not_checked": "--no-vulnerabilities"}):
        judged = v.Verdict(_items(data))
        assert [i.name for i in judged.missing] == ["vulnerabilities"]


def test_the_policy_s_acceptances_hold_until_their_date() -> None:
    entries = [
        IncompleteAcceptance("python:3.13", "no root on the runners", datetime.date(2027, 1, 1)),
        IncompleteAcceptance("verify:*", "expired", datetime.date(2026, 1, 1)),
    ]
    accepted = v.from_policy(entries, today=datetime.date(2026, 12, 5))
    assert [(a.pattern, a.source) for a in accepted] == [("python:3.13", "policy (until 2027-01-01)")]


@pytest.mark.parametrize("value", ["python:3.13", "python:3.13=", "=reason"])
def test_an_acceptance_without_a_reason_is_refused(value: str) -> None:
    with pytest.raises(ReleaseError, match="give the item's name and a reason"):
        v.parse_accept([value])


def _judged_dist(tmp_path: Path, verdict: str, publishable: bool, **members: Any) -> Path:
    dist = tmp_path / "dist"
    distkit.make_release(dist, {"a-1-py3-none-any.whl": b"a"}, **members)
    missing = [] if publishable else [{"item": "python:3.13", "detail": "NOT VERIFIED: no root"}]
    judged = {"verdict": verdict, "publishable": publishable, "dist_sha256": distdir.key(dist), "judged": "now"}
    distdir.record_verdict(dist, {**judged, "passed": [], "failed": [], "missing": missing, "accepted": []})
    return dist


def test_publish_takes_a_passed_or_accepted_release(tmp_path: Path) -> None:
    assert releasable(_judged_dist(tmp_path, "PASSED", True)).manifest.wheels


def test_publish_refuses_an_incomplete_release_naming_what_it_lacks(tmp_path: Path) -> None:
    with pytest.raises(PublishError, match=r"the release is INCOMPLETE, not published: python:3\.13 \(NOT VERIFIED"):
        releasable(_judged_dist(tmp_path, "INCOMPLETE", False))


def test_publish_refuses_a_verdict_on_other_files(tmp_path: Path) -> None:
    dist = _judged_dist(tmp_path, "PASSED", True)
    distkit.rewrite(dist, kt_version="changed after the verdict")
    with pytest.raises(PublishError, match="judged other files"):
        releasable(dist)


def test_publish_refuses_no_verdict_a_partial_release_and_no_release(tmp_path: Path) -> None:
    with pytest.raises(PublishError, match="holds no release; build it"):
        releasable(tmp_path / "nowhere")
    dist = _judged_dist(tmp_path, "PASSED", True, partial=distdir.Partial(("3.11",), ("3.12",)))
    with pytest.raises(PublishError, match="partial development release"):
        releasable(dist)
    distkit.rewrite(dist, release=None, partial=None)
    with pytest.raises(PublishError, match="no release verdict: run nox -s release"):
        releasable(dist)


def test_many_missing_items_of_one_family_are_one_line_with_their_glob() -> None:
    unchecked = {**CLEAN, "not_checked": {f"p{n}==1": "no data" for n in range(272)}}
    judged = v.Verdict(_items(unchecked))
    lines = judged.lines()
    assert len(lines) == 2
    assert lines[1].startswith("  missing vulnerabilities:* (272 items, e.g. vulnerabilities:p0==1: NOT CHECKED")
    assert "--accept 'vulnerabilities:*=REASON'" in lines[1]
    assert len(judged.as_dict()["missing"]) == 272  # manifest.json keeps each one
    accepted = v.Verdict(_items(unchecked), v.parse_accept(["vulnerabilities:*=offline mirror"]))
    assert accepted.lines()[1] == "  accepted vulnerabilities:* (272 items) (by command line: offline mirror)"


def test_each_published_install_file_is_an_item_passed_only_when_installed_as_published() -> None:
    manifest = distdir.Manifest(1, "1", ("3.11",), "", (), ())
    files = ("install/sft-cp311.txt", "install/pylock.sft-cp311.toml", "install/serve-cp311.txt")
    install = [
        dataclasses.replace(distkit.install_file(f, ""), sha256=c * 64) for f, c in zip(files, "abc", strict=True)
    ]
    install.append(dataclasses.replace(distkit.install_file("install/sft-cp312.txt", ""), sha256="d" * 64))
    manifest = dataclasses.replace(manifest, install=tuple(install))
    current = {"sft": {"install_file": {"file": "install/sft-cp311.txt", "sha256": "a" * 64}}, "sft-cpu": {}}
    items = {i.name: i for i in v.published_items(manifest, current.values(), "3.11")}
    assert sorted(items) == ["published:serve-cp311.txt", "published:sft-cp311.txt", "published:sft-cp312.txt"]
    assert items["published:sft-cp311.txt"].state == "passed"
    assert items["published:serve-cp311.txt"].state == "missing"
    assert "--profile serve" in items["published:serve-cp311.txt"].detail
    assert "no environment of CPython 3.12 runs the sft profile here" in items["published:sft-cp312.txt"].detail
    elsewhere = {i.name: i for i in v.published_items(manifest, [], "3.11", {"3.12": ("sft",)})}
    assert "--profile cp312" in elsewhere["published:sft-cp312.txt"].detail
