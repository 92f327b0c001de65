"""The release diff on wheels made here: what changed per distribution, the warnings a reviewer needs (a
raised glibc floor, a dropped Python, growth over the policy), and the rule that keeps `pip install -U`
whole: a path that changes owner is safe only when the new owner requires the old owner's new version."""

from __future__ import annotations

import base64
import hashlib
import json
import zipfile
from pathlib import Path

import pytest

from base import distdir
from locks.previous import PreviousError
from release import diff
from release.diff import DiffError


def _hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def wheel(
    folder: Path,
    name: str,
    version: str,
    files: dict[str, bytes],
    *,
    tag: str = "py3-none-any",
    requires: tuple[str, ...] = (),
    license: str = "MIT",
) -> Path:
    """A wheel with these members, its METADATA and a RECORD with each member's sha256 and size."""
    folder.mkdir(parents=True, exist_ok=True)
    norm = name.replace("-", "_")
    di = f"{norm}-{version}.dist-info"
    members = dict(files)
    members[f"{di}/METADATA"] = (
        f"Metadata-Version: 2.4\nName: {name}\nVersion: {version}\nLicense-Expression: {license}\n"
        + "".join(f"Requires-Dist: {r}\n" for r in requires)
    ).encode()
    members[f"{di}/WHEEL"] = f"Wheel-Version: 1.0\nTag: {tag}\n".encode()
    record = "".join(f"{n},{_hash(d)},{len(d)}\n" for n, d in members.items()) + f"{di}/RECORD,,\n"
    members[f"{di}/RECORD"] = record.encode()
    path = folder / f"{norm}-{version}-{tag}.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for n, d in members.items():
            zf.writestr(n, d)
    return path


def _diff(old: list[Path], new: list[Path]) -> diff.Diff:
    return diff.compare([diff.read_wheel(p) for p in old], [diff.read_wheel(p) for p in new], "3.11", "test")


def test_a_path_moving_to_a_carrier_that_requires_its_old_owner_is_safe(tmp_path: Path) -> None:
    """sgl_kernel/ moves from kt-kernel to sglang-kernel-kt, which requires kt-kernel exactly: pip replaces
    kt-kernel first, so the move is safe and said so."""
    old = [wheel(tmp_path / "old", "kt-kernel", "0.7.2", {"kt_kernel/a.py": b"a", "sgl_kernel/ops.py": b"o"})]
    new = [
        wheel(tmp_path / "new", "kt-kernel", "0.8.0", {"kt_kernel/a.py": b"a2"}),
        wheel(
            tmp_path / "new",
            "sglang-kernel-kt",
            "0.4.10.post1",
            {"sgl_kernel/ops.py": b"o"},
            requires=("kt-kernel==0.8.0",),
        ),
    ]
    d = _diff(old, new)
    assert d.errors == []
    assert d.owners == [
        {
            "before": "kt-kernel",
            "after": "sglang-kernel-kt",
            "paths": 1,
            "examples": ["sgl_kernel/ops.py"],
            "safe_for_pip": True,
        }
    ]


def test_a_move_without_the_requirement_is_an_error_naming_path_owners_and_fix(tmp_path: Path) -> None:
    """The synthetic move of the issue: deep_gemm/ goes from kt-kernel to sgl-deep-gemm-kt, which does not
    require kt-kernel: pip installs it first and deletes its files when it uninstalls kt-kernel 0.7.2."""
    old = [wheel(tmp_path / "old", "kt-kernel", "0.7.2", {f"deep_gemm/m{i}.py": b"m" for i in range(3)})]
    new = [
        wheel(tmp_path / "new", "kt-kernel", "0.8.0", {"kt_kernel/a.py": b"a"}),
        wheel(tmp_path / "new", "sgl-deep-gemm-kt", "0.2.3", {f"deep_gemm/m{i}.py": b"m" for i in range(3)}),
    ]
    d = _diff(old, new)
    (error,) = d.errors
    assert "3 paths move from kt-kernel to sgl-deep-gemm-kt (e.g. deep_gemm/m0.py)" in error
    assert "sgl-deep-gemm-kt does not require kt-kernel==0.8.0" in error
    assert "pypa/pip#8509" in error
    assert "Fix: make sgl-deep-gemm-kt require kt-kernel==0.8.0" in error
    assert d.owners[0]["safe_for_pip"] is False
    # a requirement through another carrier counts; a range that excludes the new version does not
    via = wheel(tmp_path / "via", "sgl-deep-gemm-kt", "0.2.3", {}, requires=("ktransformers==0.8.0",))
    umbrella = wheel(tmp_path / "via", "ktransformers", "0.8.0", {}, requires=("kt-kernel==0.8.0",))
    facts = [diff.read_wheel(p) for p in (new[0], via, umbrella)]
    assert diff.replaced_first("sgl-deep-gemm-kt", "kt-kernel", facts)
    stale = wheel(tmp_path / "stale", "sgl-deep-gemm-kt", "0.2.3", {}, requires=("kt-kernel<0.8",))
    assert not diff.replaced_first("sgl-deep-gemm-kt", "kt-kernel", [diff.read_wheel(new[0]), diff.read_wheel(stale)])
    extra = wheel(tmp_path / "extra", "sgl-deep-gemm-kt", "0.2.3", {}, requires=('kt-kernel==0.8.0; extra == "x"',))
    assert not diff.replaced_first("sgl-deep-gemm-kt", "kt-kernel", [diff.read_wheel(new[0]), diff.read_wheel(extra)])


def test_a_path_whose_old_owner_is_no_longer_released_is_an_error(tmp_path: Path) -> None:
    old = [wheel(tmp_path / "old", "kt-extras", "1.0", {"extras/x.py": b"x"})]
    new = [wheel(tmp_path / "new", "kt-kernel", "0.8.0", {"extras/x.py": b"x"})]
    (error,) = _diff(old, new).errors
    assert "kt-extras is no longer released" in error


def test_what_changed_per_distribution_and_the_warnings(tmp_path: Path) -> None:
    """Files added, removed and changed by sha256; requirements and license; a raised glibc floor, a dropped
    Python and growth over the policy's 1 MiB are warnings; an unchanged wheel says so."""
    old = [
        wheel(
            tmp_path / "old",
            "kt-kernel",
            "0.7.2",
            {"kt_kernel/a.py": b"a", "kt_kernel/gone.py": b"g", "kt_kernel/same.py": b"s"},
            tag="cp311-cp311-manylinux_2_28_x86_64",
            requires=("numpy",),
            license="Apache-2.0",
        ),
        wheel(tmp_path / "old", "peft-kt", "0.18.1", {"peft/x.py": b"p"}),
    ]
    incompressible = b"".join(hashlib.sha256(str(i).encode()).digest() for i in range(1 << 16))  # 2 MiB
    new = [
        wheel(
            tmp_path / "new",
            "kt-kernel",
            "0.8.0",
            {"kt_kernel/a.py": b"a2", "kt_kernel/same.py": b"s", "kt_kernel/new.py": incompressible},
            tag="cp312-abi3-manylinux_2_34_x86_64",
            requires=("numpy", "torch==2.14.1"),
            license="Apache-2.0 AND MIT",
        ),
        wheel(tmp_path / "new", "peft-kt", "0.18.1", {"peft/x.py": b"p"}),
    ]
    d = _diff(old, new)
    kt = next(e for e in d.distributions if e["name"] == "kt-kernel")
    assert kt["status"] == "changed"
    assert kt["version"] == {"before": "0.7.2", "after": "0.8.0"}
    assert (kt["files"]["added"], kt["files"]["removed"], kt["files"]["changed"]) == (1, 1, 1)
    assert kt["files"]["examples"]["removed"] == ["kt_kernel/gone.py"]
    assert kt["requirements"] == {"added": ["torch==2.14.1"], "removed": []}
    assert kt["license"] == {"before": "Apache-2.0", "after": "Apache-2.0 AND MIT"}
    assert kt["size"]["top_directories"]["kt_kernel"]["after"] > 2 << 20
    assert diff._serves(["cp311-abi3-manylinux_2_28_x86_64"], "cp312")
    assert not diff._serves(["cp312-abi3-manylinux_2_28_x86_64"], "cp311")
    assert diff._serves(["py3-none-any"], "cp313")
    peft = next(e for e in d.distributions if e["name"] == "peft-kt")
    assert peft["status"] == "unchanged"
    text = "\n".join(d.warnings)
    assert "kt-kernel: the glibc floor rises from 2.28 to 2.34" in text
    assert "kt-kernel: no longer serves cp311" in text
    assert "over the policy's 1 MiB or 5%" in text
    assert "goes backwards" not in text
    back = _diff(
        [wheel(tmp_path / "b-old", "peft-kt", "0.18.1", {})], [wheel(tmp_path / "b-new", "peft-kt", "0.17", {})]
    )
    assert back.warnings == ["peft-kt: 0.18.1 -> 0.17 goes backwards: `pip install -U` keeps 0.18.1, and only an "
                             "exact pin moves users (is the predecessor really older?)"]  # fmt: skip
    lines = diff.summary(d)
    assert lines[0] == "release diff against test: 1 of 2 distributions changed"
    assert "  kt-kernel: changed 0.7.2 -> 0.8.0" in lines[1]


def test_the_written_diff_follows_its_schema(tmp_path: Path) -> None:
    jsonschema = pytest.importorskip("jsonschema", reason="jsonschema is in the tests' lock")
    old = [wheel(tmp_path / "old", "kt-kernel", "0.7.2", {"sgl_kernel/a.py": b"a"})]
    new = [
        wheel(tmp_path / "new", "kt-kernel", "0.8.0", {}),
        wheel(tmp_path / "new", "sglang-kernel-kt", "1", {"sgl_kernel/a.py": b"a"}),
    ]
    data = _diff(old, new).as_json()
    schema = json.loads(diff.SCHEMA.read_text())
    jsonschema.Draft202012Validator(schema).validate(data)
    bad = {**data, "distributions": [{**data["distributions"][0], "status": "moved"}]}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft202012Validator(schema).validate(bad)


def test_a_predecessor_that_cannot_be_read_is_named_with_the_fix(tmp_path: Path) -> None:
    with pytest.raises(PreviousError, match="no such folder; give an earlier dist/"):
        diff.previous_wheels(str(tmp_path / "nowhere"), "3.11")
    (tmp_path / "empty").mkdir()
    with pytest.raises(PreviousError, match="holds no wheel"):
        diff.previous_wheels(str(tmp_path / "empty"), "3.11")
    bad = tmp_path / "bad" / "kt_kernel-0.7.2-py3-none-any.whl"
    bad.parent.mkdir()
    bad.write_bytes(b"not a zip")
    with pytest.raises(DiffError, match=r"kt_kernel-0\.7\.2-py3-none-any\.whl: not a readable wheel"):
        diff.read_wheel(bad)
    for spec in ("https://x/simple::kt-kernel>=0.7", "ftp://x::kt-kernel==1", "https://x/simple::"):
        with pytest.raises(PreviousError):
            diff.previous_wheels(spec, "3.11", tmp_path / "cache")


def test_release_report_writes_the_diff_and_an_unsafe_move_fails_the_verdict_and_publish(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """nox -s release -- --previous DIR: dist/release-diff.json for exactly these wheels, its summary on the
    screen and in the report, and the verdict's `diff` item failed by an unsafe move; publish, judging again,
    refuses it."""
    from release import report as release_report
    from release.publish import PublishError, rejudge, releasable, snapshot
    from tests import distkit

    previous = tmp_path / "previous"
    wheel(previous, "kt-kernel", "0.7.2", {"deep_gemm/m.py": b"m", "kt_kernel/a.py": b"a"})
    made = tmp_path / "made"
    ours = {
        p.name: p.read_bytes()
        for p in (
            wheel(made, "kt-kernel", "0.8.0", {"kt_kernel/a.py": b"a2"}),
            wheel(made, "sgl-deep-gemm-kt", "0.2.3", {"deep_gemm/m.py": b"m"}),
        )
    }
    dist = tmp_path / "dist"
    distkit.make_release(dist, ours)
    distkit.judged(dist, tmp_path / "build", record=False)
    argv = ["--dist", str(dist), "--evidence", str(tmp_path / "build"), "--previous", str(previous)]
    assert release_report.main(argv) == 1  # FAILED
    out = capsys.readouterr().out
    assert "release diff against 1 wheels in" in out
    assert "paths changing owner: kt-kernel -> sgl-deep-gemm-kt (1 paths, UNSAFE)" in out
    assert "FAILED diff: 1 paths move from kt-kernel to sgl-deep-gemm-kt" in out
    data = json.loads((dist / "release-diff.json").read_text())
    assert data["dist_sha256"] == distdir.key(dist)
    assert "## Release diff" in (dist / "release-report.md").read_text()
    with snapshot(dist, tmp_path / "publish") as release, pytest.raises(PublishError, match="diff \\(1 paths move"):
        releasable(release, rejudge(release, (), tmp_path / "build"), dist)


def test_the_default_predecessor_is_the_newest_older_release_on_the_index(monkeypatch: pytest.MonkeyPatch) -> None:
    """`--previous auto` (nox -s release's default for the diff): per name, the newest final release older than
    ours; an index that cannot be read, or holds nothing older, is no predecessor (said), never an error."""
    from locks import previous, simple

    served = {"kt-kernel": ["0.5.0", "0.6.0rc1", "0.7.2", "0.6.0"], "peft-kt": ["0.18.1"], "new-kt": []}

    def state(index: str, name: str, sizes: bool = True) -> simple.ProjectState:
        files = {
            f"{name}-{v}.tar.gz": simple.IndexFile(f"{name}-{v}.tar.gz", "u", None, None, None) for v in served[name]
        }
        return simple.ProjectState(name, bool(files), files, "PEP 691 JSON")

    monkeypatch.setattr(simple, "project_state", state)
    spec, why = previous.newest_older({"kt-kernel": "0.6.1", "peft-kt": "0.21.2", "new-kt": "1"}, "https://i/simple")
    assert spec == "https://i/simple::kt-kernel==0.6,peft-kt==0.18.1"  # the index's normalized versions
    assert "kt-kernel==0.6," in why
    assert previous.newest_older({"new-kt": "1"}, "https://i/simple")[0] is None

    def unreachable(index: str, name: str, sizes: bool = True) -> simple.ProjectState:
        raise simple.IndexPageError("cannot reach the index")

    monkeypatch.setattr(simple, "project_state", unreachable)
    spec, why = previous.newest_older({"kt-kernel": "0.6.1"}, "https://i/simple")
    assert spec is None
    assert "cannot be read" in why


def test_a_bit_flipped_member_of_a_predecessor_wheel_is_named_not_a_traceback(tmp_path: Path) -> None:
    good = wheel(tmp_path / "w", "kt-kernel", "0.7.2", {"kt_kernel/lib.so": b"\x7fELF" + bytes(range(256)) * 64})
    with zipfile.ZipFile(good) as zf:
        info = zf.getinfo("kt_kernel/lib.so")
    raw = bytearray(good.read_bytes())
    start = info.header_offset + 30 + len(info.filename.encode()) + len(info.extra)
    raw[start + 10] ^= 0xFF  # one byte of the member: its CRC no longer holds
    good.write_bytes(bytes(raw))
    with pytest.raises(DiffError, match=r"kt_kernel/lib\.so is damaged .*download the wheel again"):
        diff.read_wheel(good)


def test_a_cached_predecessor_is_reused_only_with_the_sha256s_it_was_downloaded_with(tmp_path: Path) -> None:
    from locks import previous

    where = tmp_path / "entry"
    w = wheel(where, "kt-kernel", "0.7.2", {"kt_kernel/a.py": b"a"})
    assert not previous._intact(where)  # no record: never reused
    (where / previous.SUMS).write_text(json.dumps({w.name: hashlib.sha256(w.read_bytes()).hexdigest()}))
    assert previous._intact(where)
    w.write_bytes(w.read_bytes() + b"planted")
    assert not previous._intact(where)
    w.unlink()
    assert not previous._intact(where)
