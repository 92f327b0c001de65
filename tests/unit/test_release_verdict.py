"""Three verdicts: PASSED only when every check ran for these wheels and passed; FAILED when one found a
problem (no acceptance turns a failure into a pass); INCOMPLETE when one did not run or could not check
(NOT VERIFIED, NOT CHECKED), naming each item and the flag that accepts it. An accepted item is listed
with its reason wherever the verdict is shown, and publish refuses anything else."""

from __future__ import annotations

import dataclasses
import datetime
import json
from pathlib import Path
from typing import Any

import pytest

from audits.policy import IncompleteAcceptance
from base import distdir
from release import verdict as v
from release.errors import ReleaseError
from release.publish import PublishError, rejudge, releasable, snapshot
from tests import distkit

CLEAN = {"asked": 2, "found": [], "waived": [], "not_checked": {}, "source": {"kind": "the index (pip-audit)"}}


def _found(version: str | None) -> dict[str, Any]:
    """base.interpreters.Found.as_dict() of an interpreter of `version` (None: none found)."""
    if version is None:
        return {
            "interpreter": None,
            "tried": [],
            "searched": ["PATH: 0 python3.13", "pyenv: 0 CPython 3.13"],
            "dist_sha256": "k",
        }
    path = f"/usr/bin/python{version.rsplit('.', 1)[0]}"
    return {
        "interpreter": {"version": version, "source": "PATH", "path": path, "root": ""},
        "tried": [],
        "dist_sha256": "k",
    }


def _evidence(cp313: str | None = "3.13.1") -> dict[str, Any]:
    """Two Pythons' evidence (base.evidence): 3.11 ran sft-cpu and resolved sft on the build "k"."""
    return {
        "3.11": {
            "interpreter": _found("3.11.9"),
            "profiles": {"sft-cpu": {"dist_sha256": "k"}},
            "resolution": {"sft": {"dist_sha256": "k", "problems": [], "not_verified": ""}},
        },
        "3.13": {"interpreter": _found(cp313), "profiles": {}, "resolution": {}},
    }


def _items(vulnerabilities: object = CLEAN, cp313: str | None = "3.13.1") -> list[v.Item]:
    ev = _evidence(cp313)
    return [
        *v.dist_items("k"),
        *v.partial_items(distdir.Manifest(1, "1", ("3.11",), "", (), ())),
        *v.audit_items({"passed": True}),
        *v.vulnerability_items(vulnerabilities),
        *v.verify_items([("sft-cpu", "3.11")], ev, "k"),
        *v.resolution_items([("sft", "3.11")], ev, "k"),
        *v.python_items(["3.13"], ev, "k"),
    ]


def test_everything_checked_and_passed_is_passed() -> None:
    judged = v.Verdict(_items())
    assert judged.verdict == v.PASSED
    assert judged.publishable
    assert judged.lines() == ["release verdict: PASSED (7 of 7 checks passed)"]
    assert v.python_items(["3.13"], _evidence(), "k")[0].detail == "CPython 3.13.1 from PATH: /usr/bin/python3.13"


def test_a_pin_not_checked_or_an_interpreter_not_verified_is_incomplete_and_names_its_flag() -> None:
    unchecked = {**CLEAN, "not_checked": {"jinja2==2.10": "no data from the index"}}
    judged = v.Verdict(_items(unchecked, cp313=None))
    assert judged.verdict == v.INCOMPLETE
    assert not judged.publishable
    assert [i.name for i in judged.missing] == ["vulnerabilities:jinja2==2.10", "python:3.13"]
    text = "\n".join(judged.lines())
    assert "missing vulnerabilities:jinja2==2.10: NOT CHECKED: no data from the index" in text
    assert "python:3.13: NOT VERIFIED: no CPython 3.13 interpreter (PATH: 0 python3.13; pyenv: 0" in text
    assert "--accept 'python:3.13=REASON'" in text


def test_each_run_is_judged_on_this_build_only() -> None:
    """A run from other wheels, a failed run, a NOT VERIFIED one and a simulated resolution: none passes."""
    ev = _evidence()
    ev["3.11"]["profiles"] = {
        "sft-cpu": {"dist_sha256": "other", "produced": "yesterday"},
        "sft": {"dist_sha256": "k", "error": "kt_kernel.sft diverged"},
        "serve": {"dist_sha256": "k", "not_verified": "no interpreter"},
        "lf-standard": {"dist_sha256": "other", "installs_from_dist": False},  # upstream only: any build's
    }
    ev["3.11"]["resolution"]["serve"] = {"dist_sha256": "k", "problems": [], "not_verified": "simulated (no CPython"}
    runs = [("sft-cpu", "3.11"), ("sft", "3.11"), ("serve", "3.11"), ("lf-standard", "3.11"), ("lf-kt", "3.11")]
    items = {i.name: i for i in v.verify_items(runs, ev, "k") + v.resolution_items([("serve", "3.11")], ev, "k")}
    assert items["verify:sft-cpu-cp311"].state == "missing"
    assert (
        "not verified for this build (obtained on other wheels, produced yesterday"
        in items["verify:sft-cpu-cp311"].detail
    )
    assert (items["verify:sft-cp311"].state, items["verify:sft-cp311"].detail) == ("failed", "kt_kernel.sft diverged")
    assert items["verify:serve-cp311"].detail == "NOT VERIFIED: no interpreter"
    assert items["verify:lf-standard-cp311"].state == "passed"
    assert items["verify:lf-kt-cp311"].detail.startswith(
        "not run (nox -s verify_install -- --profile lf-kt --python 3.11"
    )
    assert items["resolve:serve-cp311"].state == "missing"
    assert (
        v.verify_items(runs, ev, None)[0].state == "missing"
    )  # dist/ does not match SHA256SUMS: nothing is this build's


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


def test_a_waiver_is_judged_on_the_day_of_judging_not_the_day_of_the_audit() -> None:
    """The audit waived PYSEC-1 until 2026-12-05; judged that day it waives, judged 30 days later (publish
    re-judging the same evidence) the vulnerability fails, naming the expiry; a waiver without a date never
    waives."""
    waived = {"package": "urllib3", "version": "1.24.1", "id": "PYSEC-1", "reason": "r", "expires": "2026-12-05"}
    data = {**CLEAN, "waived": [waived]}
    then = v.Verdict(v.vulnerability_items(data, datetime.date(2026, 12, 5)))
    assert then.verdict == v.PASSED
    later = v.Verdict(v.vulnerability_items(data, datetime.date(2027, 1, 4)))
    assert later.verdict == v.FAILED
    assert [i.name for i in later.failed] == ["vulnerability:urllib3==1.24.1:PYSEC-1"]
    assert "its waiver expired 2026-12-05" in later.failed[0].detail
    undated = {**CLEAN, "waived": [{**waived, "expires": "someday"}]}
    assert v.Verdict(v.vulnerability_items(undated, datetime.date(2026, 1, 1))).verdict == v.FAILED


def test_an_expired_vulnerability_waiver_is_refused_at_publish(tmp_path: Path) -> None:
    """The stored verdict passed on the waiver's last day; publish judges again today and refuses."""
    dist, evidence = _judged_dist(tmp_path)
    waived = {"package": "urllib3", "version": "1.24.1", "id": "PYSEC-1", "reason": "r", "expires": "2020-01-01"}
    (dist / "vulnerabilities.json").write_text(json.dumps({**CLEAN, "waived": [waived]}))
    with pytest.raises(PublishError, match=r"PYSEC-1 in urllib3 1\.24\.1: its waiver expired 2020-01-01"):
        _releasable(dist, evidence)


def test_the_interpreter_counts_only_for_the_build_it_was_found_for() -> None:
    """`python:3.13` from another build's evidence (or a record without a build) is missing, not passed."""
    for key in ("other", None):
        ev = _evidence()
        ev["3.13"]["interpreter"]["dist_sha256"] = key
        item = v.python_items(["3.13"], ev, "k")[0]
        assert (item.state, item.detail.split(" (")[0]) == ("missing", v.NOT_THIS_BUILD)
    assert v.python_items(["3.13"], _evidence(), None)[0].state == "missing"


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


def _judged_dist(tmp_path: Path, **members: Any) -> tuple[Path, Path]:
    """A release with every check's evidence of a pass (tests/distkit.judged), and the verdict recorded."""
    dist = tmp_path / "dist"
    distkit.make_release(dist, {"a-1-py3-none-any.whl": b"a"}, **members)
    distkit.judged(dist, tmp_path / "build")
    return dist, tmp_path / "build"


def _releasable(dist: Path, evidence: Path, accept: tuple[str, ...] = ()) -> None:
    with snapshot(dist, dist.parent / "publish") as release:
        releasable(release, rejudge(release, accept, evidence), dist)


def test_publish_takes_a_passed_release(tmp_path: Path) -> None:
    _releasable(*_judged_dist(tmp_path))
    assert not list((tmp_path / "publish").iterdir())  # the snapshot is removed


def test_publish_refuses_an_incomplete_release_naming_what_it_lacks(tmp_path: Path) -> None:
    dist, evidence = _judged_dist(tmp_path)
    (evidence / "verify-cp311.json").unlink()
    with pytest.raises(PublishError, match=r"the release is INCOMPLETE, judged now .*: python:3\.11 \(not run"):
        _releasable(dist, evidence)


def test_publish_refuses_a_verdict_on_other_files(tmp_path: Path) -> None:
    dist, evidence = _judged_dist(tmp_path)
    distkit.rewrite(dist, kt_version="changed after the verdict")
    distkit.judged(dist, evidence, record=False)  # the evidence is of the new bytes; the stored verdict is not
    with pytest.raises(PublishError, match="judged other files"):
        _releasable(dist, evidence)


def test_publish_refuses_no_verdict_a_partial_release_and_no_release(tmp_path: Path) -> None:
    with pytest.raises(PublishError, match="holds no release; build it"):
        _releasable(tmp_path / "nowhere", tmp_path)
    dist, evidence = _judged_dist(tmp_path, partial=distdir.Partial(("3.11",), ("3.12",)))
    with pytest.raises(PublishError, match="partial development release"):
        _releasable(dist, evidence)
    distkit.rewrite(dist, release=None, partial=None)
    distkit.judged(dist, evidence, record=False)
    with pytest.raises(PublishError, match="no release verdict: run nox -s release"):
        _releasable(dist, evidence)


def test_an_expired_acceptance_accepts_nothing_at_publish(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The stored verdict was accepted by a policy entry that has expired since: judged again today, the item
    is missing and publish refuses."""
    from audits import policy as audit_policy

    dist, evidence = _judged_dist(tmp_path)
    (evidence / "verify-cp311.json").unlink()
    entry = IncompleteAcceptance("*", "a mirror outage", datetime.date(2026, 12, 4))
    real = audit_policy.load_policy

    def with_entry(*args: Any, **kwargs: Any) -> Any:
        return dataclasses.replace(real(*args, **kwargs), incomplete_acceptances=(entry,))

    monkeypatch.setattr("release.judge.load_policy", with_entry)
    from release import judge as judging

    manifest = distdir.read_manifest(dist / distdir.MANIFEST)
    ev = judging.collect(dist, distdir.key(dist), evidence, manifest)
    then = judging.judge(ev, today=datetime.date(2026, 12, 1))
    assert then.publishable
    assert then.verdict == v.INCOMPLETE
    distdir.record_verdict(dist, {**then.as_dict(), "dist_sha256": distdir.key(dist), "judged": "then"})
    with pytest.raises(PublishError, match="the release is INCOMPLETE, judged now"):
        _releasable(dist, evidence)


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
    current = {
        "sft-cp311": {"install_file": {"file": "install/sft-cp311.txt", "sha256": "a" * 64}},
        "sft-cpu-cp311": {},
        "sft-cp312": {"install_file": {"file": "install/sft-cp312.txt", "sha256": "d" * 64}, "error": "failed"},
    }
    items = {i.name: i for i in v.published_items(manifest, current.values())}
    assert sorted(items) == ["published:serve-cp311.txt", "published:sft-cp311.txt", "published:sft-cp312.txt"]
    assert items["published:sft-cp311.txt"].state == "passed"
    assert items["published:serve-cp311.txt"].state == "missing"
    assert "--profile serve --python 3.11" in items["published:serve-cp311.txt"].detail
    assert items["published:sft-cp312.txt"].state == "missing"  # a failed run exercised nothing
    assert "not exercised on CPython 3.12" in items["published:sft-cp312.txt"].detail


def test_a_profile_whose_closure_the_link_check_could_not_have_is_incomplete_not_passed() -> None:
    """The audit passed, but the serve profile's closure could not be installed for the link rules: a
    `links:serve-cp311` item is missing (INCOMPLETE, naming why), never folded into the audit's pass."""
    audit = {"passed": True, "links_not_checked": {"serve-cp311": "serve-cp311: NOT CHECKED: offline"}}
    items = v.audit_items(audit)
    assert [(i.name, i.state) for i in items] == [("audit", "passed"), ("links:serve-cp311", "missing")]
    judged = v.Verdict([*_items()[:2], *items])
    assert judged.verdict == v.INCOMPLETE
