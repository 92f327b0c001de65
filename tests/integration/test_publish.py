"""Publishing to a real index server (pypiserver on 127.0.0.1): computed order, hash verification, the
plan checked before the first upload (a foreign build of our version, a file over the limit, a conflicting
file: nothing uploaded), only what SHA256SUMS lists, a partial release refused, a killed publish resumed;
the verdict judged again from the evidence for the bytes uploaded (a stored verdict edited, an acceptance
expired, a wheel replaced in dist/ while the upload runs)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from base import distdir, paths
from release.publish import PublishError, publish, upload_order
from tests import distkit
from tests.wheelkit import pure_wheel_members, write_wheel


def _dist(tmp_path: Path, marker: str = "1", specs: dict[str, tuple[str, ...]] | None = None) -> Path:
    """A three-wheel release: top -> mid -> base (and top -> base), unless `specs` says otherwise."""
    dist = tmp_path / f"dist{marker}"
    dist.mkdir()
    specs = specs or {
        "base_kt": (),
        "mid_kt": ("base-kt==1.0",),
        "top_kt": ('mid-kt==1.0; extra == "x"', "base-kt==1.0"),
    }
    wheels = {}
    for name, reqs in specs.items():
        m = pure_wheel_members(name, "1.0", requires=reqs)
        m[f"{name}/__init__.py"] = f"MARK = {marker!r}\n".encode()
        path = write_wheel(dist / f"{name}-1.0-py3-none-any.whl", m)
        wheels[path.name] = path.read_bytes()
    distkit.make_release(dist, wheels)
    # every check's evidence of a passing release, and the verdict release_report writes from it
    assert distkit.judged(dist, paths.BUILD).verdict == "PASSED"
    return dist


@pytest.fixture(autouse=True)
def _evidence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The verification evidence publish judges again, in the test's own build folder."""
    monkeypatch.setattr(paths, "BUILD", tmp_path / "build")
    monkeypatch.setattr(paths, "PUBLISH_WORK", tmp_path / "build" / "publish")  # the snapshot's folder in it


def test_order_is_computed_from_requirements(tmp_path: Path) -> None:
    """Names chosen so that the dependency order is neither alphabetical nor its reverse."""
    specs = {
        "m_base": (),
        "a_mid": ("m-base==1.0",),
        "z_top": ('a-mid==1.0; extra == "x"', "m-base==1.0"),
        "b_leaf": ("z-top==1.0",),
    }
    dist = _dist(tmp_path, "o", specs)
    for given in (sorted(p.name for p in dist.glob("*.whl")), sorted(p.name for p in dist.glob("*.whl"))[::-1]):
        names = [f.split("-")[0] for f in upload_order(dist, given)]
        assert names == ["m_base", "a_mid", "z_top", "b_leaf"]


def test_fresh_then_idempotent(index: tuple[str, Path], tmp_path: Path) -> None:
    url, packages = index
    dist = _dist(tmp_path)
    first = publish(dist, url, url + "simple/", wait_s=30, twine_args=("-u", "kt", "-p", "kt"))
    assert [f for f, _ in first] == upload_order(dist, [p.name for p in dist.glob("*.whl")])
    assert {what for _, what in first} == {"uploaded, verified"}
    assert sorted(p.name for p in packages.iterdir()) == sorted(p.name for p in dist.glob("*.whl"))
    again = publish(dist, url, url + "simple/", wait_s=30, twine_args=("-u", "kt", "-p", "kt"))
    assert {what for _, what in again} == {"already there, identical (not uploaded again)"}


def test_same_name_different_bytes_is_refused_before_any_upload(index: tuple[str, Path], tmp_path: Path) -> None:
    url, packages = index
    other = _dist(tmp_path, marker="2")
    shutil.copy(other / "mid_kt-1.0-py3-none-any.whl", packages)  # an older build already on the index
    dist = _dist(tmp_path, marker="1")
    with pytest.raises(PublishError, match=r"mid_kt-1\.0-py3-none-any\.whl is already on .* with sha256 .*, ours is"):
        publish(dist, url, url + "simple/", wait_s=30, twine_args=KT)
    assert sorted(p.name for p in packages.iterdir()) == ["mid_kt-1.0-py3-none-any.whl"]  # base_kt did not go up


KT = ("-u", "kt", "-p", "kt")


def test_a_foreign_build_of_our_version_is_refused_and_nothing_uploaded(
    index: tuple[str, Path], tmp_path: Path
) -> None:
    """Someone else's mid-kt 1.0 (another file of the same version) is there: an installer could take it."""
    url, packages = index
    foreign = _dist(tmp_path, marker="theirs") / "mid_kt-1.0-py3-none-any.whl"
    shutil.copy(foreign, packages / "mid_kt-1.0-cp311-cp311-manylinux_2_28_x86_64.whl")
    dist = _dist(tmp_path)
    with pytest.raises(PublishError) as exc:
        publish(dist, url, url + "simple/", wait_s=30, twine_args=KT)
    assert "mid-kt 1.0 already exists on" in str(exc.value)
    assert "mid_kt-1.0-cp311-cp311-manylinux_2_28_x86_64.whl" in str(exc.value)
    assert "nothing was uploaded" in str(exc.value)
    assert [p.name for p in packages.iterdir()] == ["mid_kt-1.0-cp311-cp311-manylinux_2_28_x86_64.whl"]
    with pytest.raises(PublishError, match="states none"):  # pypiserver serves no upload times (PEP 700)
        publish(dist, url, url + "simple/", wait_s=30, twine_args=KT, add_to_existing=True)


def test_only_what_sha256sums_lists_goes_up(index: tuple[str, Path], tmp_path: Path) -> None:
    url, packages = index
    dist = _dist(tmp_path)
    stray = write_wheel(dist / "stray_kt-1.0-py3-none-any.whl", pure_wheel_members("stray_kt"))
    done = publish(dist, url, url + "simple/", wait_s=30, twine_args=KT)
    assert stray.name not in [f for f, _ in done]
    assert stray.name not in [p.name for p in packages.iterdir()]
    assert len(done) == 3


def test_a_partial_release_and_one_over_the_limit_are_refused(index: tuple[str, Path], tmp_path: Path) -> None:
    url, packages = index
    dist = _dist(tmp_path)
    rules = tmp_path / "rules.toml"
    rules.write_text(
        "[default]\nfile_limit_mib = 0.001\nproject_quota_gib = 10\nadd_window_days = 14\nlocal_versions = false\n"
    )
    with pytest.raises(PublishError, match=r"over .*'s per-file limit of 0 MiB"):
        publish(dist, url, url + "simple/", wait_s=30, twine_args=KT, rules_file=rules)
    distkit.rewrite(dist, partial=distdir.Partial(("3.11",), ("3.12",)))
    with pytest.raises(PublishError, match="partial development release"):
        publish(dist, url, url + "simple/", wait_s=30, twine_args=KT)
    assert list(packages.iterdir()) == []


def test_a_killed_publish_resumes_without_uploading_anything_twice(index: tuple[str, Path], tmp_path: Path) -> None:
    """SIGKILL once the first file is on the index, then run again: the rest goes up, the first is said to be
    there already, and the plan shows the release half-published."""
    import os
    import signal
    import time

    url, packages = index
    dist = _dist(tmp_path)
    cmd = [sys.executable, "-m", "release.publish", "--repository-url", url, "--dist", str(dist), "--no-verify"]
    cmd += ["--evidence", str(paths.BUILD)]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not list(packages.iterdir()) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    before = sorted(p.name for p in packages.iterdir())
    assert before
    again = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)
    assert again.returncode == 0, again.stdout + again.stderr
    there = {line.split(":")[0] for line in again.stdout.splitlines() if line.endswith("(not uploaded again)")}
    assert there == set(before)
    if len(before) < 3:
        assert "half-published" in again.stdout
    assert sorted(p.name for p in packages.iterdir()) == sorted(p.name for p in dist.glob("*.whl"))


def test_the_plan_prints_its_table_and_uploads_nothing(index: tuple[str, Path], tmp_path: Path) -> None:
    url, packages = index
    dist = _dist(tmp_path)
    cmd = [sys.executable, "-m", "release.publish", "--repository-url", url, "--dist", str(dist), "--plan"]
    cmd += ["--evidence", str(paths.BUILD)]
    got = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)
    assert got.returncode == 0, got.stderr
    assert "  file  " in got.stdout
    assert "base_kt-1.0-py3-none-any.whl" in got.stdout
    assert "base-kt: new on this index" in got.stdout  # pypiserver's fallback redirect is not its project
    assert got.stdout.rstrip().endswith("plan: OK: 3 to upload, 0 already there")
    assert list(packages.iterdir()) == []


def test_no_release_in_dist_is_one_line_not_a_traceback(tmp_path: Path) -> None:
    empty = tmp_path / "dist"
    empty.mkdir()
    cmd = [sys.executable, "-m", "release.publish", "--repository-url", "http://127.0.0.1:9/", "--dist", str(empty)]
    got = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)
    assert got.returncode == 1
    assert "Traceback" not in got.stderr
    assert "holds no release" in got.stderr


ROOT = Path(__file__).resolve().parents[2]


def test_cli_reports_unreachable_index(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "release.publish",
            "--repository-url",
            "http://127.0.0.1:9/",
            "--dist",
            str(_dist(tmp_path)),
            "--wait",
            "1",
            "--evidence",
            str(paths.BUILD),
        ],
        capture_output=True,
        text=True,
        check=False,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert proc.returncode == 1
    assert "cannot reach the index" in proc.stderr


def test_a_requirement_cycle_is_uploaded_as_one_group_after_its_dependencies(tmp_path: Path) -> None:
    """sglang-kt -> sglang-kernel-kt -> (every part carrier, sglang-kt among them): no CycleError;
    the cycle's members go together, after what they require and before what requires them."""
    dist = _dist(
        tmp_path,
        "c",
        {
            "a_part": (),
            "loop_b": ("loop-a==1.0", "a-part==1.0"),
            "loop_a": ("loop-b==1.0",),
            "z_user": ("loop-a==1.0",),
        },
    )
    order = upload_order(dist, sorted(p.name for p in dist.glob("*.whl"))[::-1])
    names = [f.split("-")[0] for f in order]
    assert names == ["a_part", "loop_a", "loop_b", "z_user"]


def test_every_python_wheel_of_a_distribution_is_uploaded(tmp_path: Path) -> None:
    """kt-kernel ships one wheel per Python: both go up, at kt-kernel's place in the order."""
    dist = _dist(tmp_path, "p", {"base_kt": (), "top_kt": ("base-kt==1.0",)})
    (cp311,) = dist.glob("base_kt-*.whl")
    shutil.copy(cp311, dist / "base_kt-1.0-cp312-cp312-manylinux_2_28_x86_64.whl")
    cp311.rename(dist / "base_kt-1.0-cp311-cp311-manylinux_2_28_x86_64.whl")
    order = upload_order(dist, sorted(p.name for p in dist.glob("*.whl"))[::-1])
    assert order == [
        "base_kt-1.0-cp311-cp311-manylinux_2_28_x86_64.whl",
        "base_kt-1.0-cp312-cp312-manylinux_2_28_x86_64.whl",
        "top_kt-1.0-py3-none-any.whl",
    ]


@pytest.mark.network
def test_the_index_behind_is_added_only_where_the_index_does_not_serve_it_itself(index: tuple[str, Path]) -> None:
    """pypiserver with its fallback serves PyPI's projects itself: users point pip at it alone. TestPyPI
    does not: users add PyPI with --extra-index-url, and the post-publish resolution does the same."""
    from verify.resolution import PUBLIC, _falls_back

    url, _ = index
    assert _falls_back(url + "simple/", PUBLIC)
    assert not _falls_back("https://test.pypi.org/simple/", PUBLIC)
    assert _falls_back(PUBLIC, PUBLIC)


def test_a_stored_verdict_is_never_trusted(index: tuple[str, Path], tmp_path: Path) -> None:
    """Publish judges again from the evidence: a failed audit refuses whatever manifest.json says, a stored
    verdict edited (FAILED yet publishable) disagrees with the one judged now, and evidence that is gone
    leaves the release INCOMPLETE; nothing goes up."""
    import dataclasses
    import json

    url, packages = index
    dist = _dist(tmp_path)
    audit = json.loads((dist / "audit-report.json").read_text())
    audit["passed"] = False
    (dist / "audit-report.json").write_text(json.dumps(audit))
    with pytest.raises(PublishError, match="the release is FAILED, judged now for the bytes to upload"):
        publish(dist, url, url + "simple/", wait_s=30, twine_args=KT)
    audit["passed"] = True
    (dist / "audit-report.json").write_text(json.dumps(audit))
    manifest = distdir.read_manifest(dist / distdir.MANIFEST)
    assert manifest.release is not None
    forged = dataclasses.replace(manifest.release, verdict="FAILED", publishable=True)
    (dist / distdir.MANIFEST).write_text(distdir.manifest_text(dataclasses.replace(manifest, release=forged)))
    with pytest.raises(
        PublishError, match=r"stored in .*\(FAILED, publishable True\) disagrees with the verdict judged now"
    ):
        publish(dist, url, url + "simple/", wait_s=30, twine_args=KT)
    (paths.BUILD / "verify-cp311.json").unlink()  # the evidence gone: INCOMPLETE now
    with pytest.raises(PublishError, match=r"the release is INCOMPLETE, judged now .*python:3\.11 \(not run"):
        publish(dist, url, url + "simple/", wait_s=30, twine_args=KT)
    assert list(packages.iterdir()) == []


def test_what_goes_up_is_the_snapshot_that_was_judged(
    index: tuple[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An assembly replacing dist/ while the upload runs changes nothing that goes up: the files come from
    the snapshot judged before the first upload, and each is served with the judged sha256."""
    import hashlib

    from release import publish as publishing

    url, packages = index
    dist = _dist(tmp_path)
    judged = {w.filename: w.sha256 for w in distdir.read_manifest(dist / distdir.MANIFEST).wheels}
    real = publishing._upload

    def replace_dist_then_upload(path: Path, repository_url: str, twine_args: tuple[str, ...]) -> None:
        for wheel in dist.glob("*.whl"):
            wheel.write_bytes(b"a later build, never judged")
        real(path, repository_url, twine_args)

    monkeypatch.setattr(publishing, "_upload", replace_dist_then_upload)
    publish(dist, url, url + "simple/", wait_s=30, twine_args=KT)
    served = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in packages.iterdir()}
    assert served == judged
    assert not list(paths.PUBLISH_WORK.iterdir())  # the snapshot is gone afterwards


def test_the_plan_is_a_dry_run_whatever_the_verdict_and_needs_only_the_index(
    index: tuple[str, Path], tmp_path: Path
) -> None:
    url, packages = index
    dist = _dist(tmp_path)
    (paths.BUILD / "verify-cp311.json").unlink()  # INCOMPLETE now
    cmd = [sys.executable, "-m", "release.publish", "--index-url", url + "simple/", "--dist", str(dist), "--plan"]
    got = subprocess.run([*cmd, "--evidence", str(paths.BUILD)], cwd=ROOT, capture_output=True, text=True, check=False)
    assert got.returncode == 0, got.stderr
    assert "plan: OK: 3 to upload, 0 already there" in got.stdout
    assert "the verdict would refuse this release: the release is INCOMPLETE" in got.stdout
    assert list(packages.iterdir()) == []
    bare_cmd = [sys.executable, "-m", "release.publish", "--plan"]
    bare = subprocess.run(bare_cmd, cwd=ROOT, capture_output=True, text=True, check=False)
    assert bare.returncode == 2
    assert "--plan --index-url URL" in bare.stderr
