"""release/report.py on a made-up candidate: every carrier's row and verdict, the payload
line, the kernel size breakdown read from the wheel itself, and the exit status (1 unless the
audit passed)."""

from __future__ import annotations

import dataclasses
import json
import zipfile
from pathlib import Path

import pytest

from base import distdir, evidence, stagecache
from release import report as release_report
from tests import distkit


@pytest.fixture(autouse=True)
def _hermetic(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The report's other inputs (stage records, the kernel stamp, timings) from tmp_path."""
    for name in ("STAGE_CACHE", "KERNEL_OUT", "TIMINGS"):
        monkeypatch.setattr(release_report, name, tmp_path / "build" / name.lower())


INTERPRETER = {"interpreter": {"version": "3.11.9", "source": "PATH", "path": "/usr/bin/python3.11", "root": ""}}


def _results(
    dist: Path,
    evidence_dir: Path,
    results: dict[str, dict[str, object]],
    resolution: dict[str, dict[str, object]] | None = None,
    python: str = "3.11",
) -> Path:
    """CPython `python`'s evidence (base.evidence) in `evidence_dir`: each result obtained on exactly these
    wheels (their key), and the interpreter it ran on."""
    key = distdir.key(dist)
    evidence.update(python, build=evidence_dir, interpreter={**INTERPRETER, "dist_sha256": key})
    for name, r in results.items():
        evidence.update(python, build=evidence_dir, section="profiles", name=name, result={"dist_sha256": key, **r})
    for name, r in (resolution or {}).items():
        evidence.update(python, build=evidence_dir, section="resolution", name=name, result={"dist_sha256": key, **r})
    return evidence_dir


KT = "kt_kernel-0.6.1-cp311-cp311-manylinux_2_34_x86_64.whl"
TF = "transformers_kt-5.19.0.post1-py3-none-any.whl"


def _candidate(tmp_path: Path, *, audit_passed: bool | None) -> Path:
    dist = tmp_path / "dist"
    dist.mkdir()
    with zipfile.ZipFile(dist / KT, "w", zipfile.ZIP_STORED) as zf:
        zf.writestr("kt_kernel/cpu/libkt_cpu_avx2.so", b"a" * 3000)
        zf.writestr("kt_kernel/cuda_archive/kt_cuda.tar.xz", b"c" * 5000)
        zf.writestr("kt_kernel/_core.cpython-311-x86_64-linux-gnu.so", b"b" * 700)
        zf.writestr("kt_kernel/__init__.py", b"x" * 11)
    payload = distdir.Payload(
        archive_sha256="c" * 64,
        archive_size=170 << 20,
        files=7,
        extracted_size=1148 << 20,
        parts=(distdir.Part(1, "kt-kernel", "0.6.1", 44 << 20, "d" * 64), distdir.Part(2, "x", "1", 6 << 20, "e" * 64)),
    )
    manifest = distkit.make_release(
        dist,
        {KT: (dist / KT).read_bytes(), TF: b"tf"},
        records={TF: {"kind": "fork"}},
        pythons=("3.11",),
        torch="==2.14.1",
        kt_version="0.6.1",
        payload=payload,
    )
    digests = {w.filename: w.sha256 for w in manifest.wheels}
    if audit_passed is not None:
        report = {
            "passed": audit_passed,
            "elapsed_s": 1.5,
            "findings": [{"rule": "x"}] * (0 if audit_passed else 2),
            "wheels": [
                {"filename": KT, "errors": 0 if audit_passed else 2, "sha256": digests[KT]},
                {"filename": TF, "errors": 0, "sha256": digests[TF]},
            ],
        }
        (dist / "audit-report.json").write_text(json.dumps(report))
    return dist


ACCEPT_ALL = "--accept=*=a unit test of the report's text, not of the verdict"


def _complete(dist: Path, tmp_path: Path, sft: dict[str, object]) -> Path:
    """Every check's evidence for these wheels: each verification profile on the one Python of the manifest,
    its normal resolutions, the vulnerability check; the evidence folder."""
    from locks.read import install_profiles
    from verify.registry import VENV

    ok = {"problems": [], "not_verified": "", "ok": True}
    where = _results(
        dist,
        tmp_path / "evidence",
        {p: sft if p == "sft-cpu" else {} for p in VENV},
        dict.fromkeys(install_profiles(), ok),
    )
    (dist / "vulnerabilities.json").write_text(json.dumps({"asked": 3, "found": [], "waived": [], "not_checked": {}}))
    return where


def test_a_passing_candidate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dist = _candidate(tmp_path, audit_passed=True)
    verify = _complete(dist, tmp_path, {"install_s": 41.0, "elapsed_s": 90.2})
    assert release_report.main(["--dist", str(dist), "--evidence", str(verify)]) == 0
    out = capsys.readouterr().out
    assert "release verdict: PASSED (14 of 14 checks passed)" in out
    judged = json.loads((dist / "manifest.json").read_text())["release"]
    assert judged["verdict"] == "PASSED"
    assert judged["publishable"] is True
    assert judged["dist_sha256"] == distdir.key(dist)  # the verdict is no input of any stage key
    assert "KT release 0.6.1  (torch ==2.14.1)" in out
    assert "audit: PASSED (0 findings, 1.5s)" in out
    assert "verify_install sft-cpu-cp311: ok (install_s=41.0, elapsed_s=90.2)" in out
    assert "CPython 3.11: CPython 3.11.9 from PATH (/usr/bin/python3.11); resolve: 3 of 3 install profiles" in out
    assert "CUDA payload: 7 files, 1148 MiB -> 170.0 MiB zstd in 2 parts (MiB: kt-kernel 44.0, x 6.0)" in out
    md = (dist / "release-report.md").read_text()
    digests = {w.filename: w.sha256[:16] for w in distdir.open_release(dist).manifest.wheels}
    kt, tf = digests[KT], digests[TF]
    assert f"| kt-kernel | 0.6.1 | native | {(dist / KT).stat().st_size / 2**20:.2f} | `{kt}` | pass |" in md
    assert f"| transformers-kt | 5.19.0.post1 | fork | 0.00 | `{tf}` | pass |" in md
    assert (dist / "release-report.html").read_text().startswith("<!doctype html>")


def test_the_kernel_breakdown_is_read_from_the_wheel(tmp_path: Path) -> None:
    dist = _candidate(tmp_path, audit_passed=True)
    manifest = distdir.read_manifest(dist / "manifest.json")
    assert release_report.kernel_breakdown(dist, manifest) == {
        "CPU variants": 3000,
        "CUDA payload": 5000,
        "baseline core": 700,
        "other": 11,
    }


@pytest.mark.parametrize(("passed", "status"), [(False, 1), (None, 2)])
def test_a_failed_audit_exits_1_and_a_missing_one_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], passed: bool | None, status: int
) -> None:
    dist = _candidate(tmp_path, audit_passed=passed)
    assert release_report.main(["--dist", str(dist), "--evidence", str(tmp_path / "none")]) == status
    out = capsys.readouterr().out
    assert ("release verdict: FAILED" if passed is False else "release verdict: INCOMPLETE") in out
    assert "audit: FAILED or missing" in out
    assert "verify_install: not run" in out
    verdict = "FAIL" if passed is False else "not audited"
    assert f"audit: {verdict}" in out


def test_no_manifest_is_an_error_naming_the_session(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert release_report.main(["--dist", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "manifest.json is missing: " in err
    assert "build it (nox -s build_all)" in err


def test_the_stage_timing_table_of_this_release_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dist = _candidate(tmp_path, audit_passed=True)
    timings = tmp_path / "timings"
    timings.mkdir()
    (timings / ".release-start").write_text("1000.0\n")
    (timings / "build_all.json").write_text(json.dumps({"start": 1001.0, "seconds": 70.5}))
    (timings / "audit.json").write_text(json.dumps({"start": 900.0, "seconds": 17.0}))  # an earlier run: left out
    argv = ["--dist", str(dist), "--timings", str(timings), "--evidence", str(tmp_path / "no"), ACCEPT_ALL]
    assert release_report.main(argv) == 0
    out = capsys.readouterr().out
    assert "this release's stages:" in out
    assert "build_all" in out
    assert "70.5 s" in out
    assert "audit  " not in out.split("this release's stages:")[1]


def test_a_partial_development_release_is_labelled_and_a_full_one_lists_its_pythons() -> None:
    from release.report import pythons_line

    files = tuple(distkit.install_file(f"install/p{n}-cp311.txt", "") for n in range(18))
    full = distdir.Manifest(1, "1", ("3.11", "3.12", "3.13"), "", (), (), install=files)
    assert pythons_line(full) == "Pythons: 3.11, 3.12, 3.13; 18 install files"
    partial = dataclasses.replace(full, pythons=("3.11",), partial=distdir.Partial(("3.11",), ("3.12", "3.13")))
    assert "PARTIAL DEVELOPMENT RELEASE: no wheels for 3.12, 3.13; not a release" in pythons_line(partial)


def test_the_serving_checks_and_kt_doctor_run_are_shown(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dist = _candidate(tmp_path, audit_passed=True)
    doctor = {
        "checks": {"cpu": "ok", "payload": "ok", "needed": "ok", "gpu": "skipped: no CUDA device"},
        "seconds": 8.1,
    }
    serve = {
        "install_s": 60.0,
        "tokenizer": {"native_equal": True, "corpus_texts": 15, "ids_compared": 892, "special_tokens": 256},
        "json_schema": {"accepted": 1, "rejected": 3, "strict_thinking": "ok"},
        "doctor": {**doctor, "deep_seconds": 9.0},
    }
    verify = _results(dist, tmp_path / "ev", {"sft-cpu": {"doctor_run": doctor}, "serve": serve})
    assert release_report.main(["--dist", str(dist), "--evidence", str(verify), ACCEPT_ALL]) == 0
    out = capsys.readouterr().out
    line = "kt-doctor --run: cpu ok, payload ok, needed ok, gpu skipped: no CUDA device (8.1 s"
    assert f"{line})" in out  # sft-cpu
    assert f"{line}, --deep 9.0 s)" in out  # serve
    assert (
        "serving on CPU (cp311): a Kimi-style tokenizer through SGLang's get_tokenizer equals tiktoken "
        "(892 ids, 15 texts, "
        "256 special tokens); JSON-schema grammar: 1 valid accepted, 3 invalid rejected, strict thinking ok"
    ) in out
    page = (dist / "release-report.html").read_text()
    assert "<p id=serving>" in page
    assert page.count("<p class=doctor>") == 2


def test_the_installed_torch_reads_as_text() -> None:
    verify = {
        "serve": {"torch": "2.14.1"},
        "lf-standard": {"install_s": 3.0},  # says nothing about torch: left out, not "?"
        "lf-upgrade": {"torch": {"before": "2.14.1", "after": "2.14.1"}},
        "other": {"torch": {"before": "2.9.1", "after": "2.14.1"}},
    }
    assert release_report.installed_torch(verify) == [
        ("serve", "2.14.1"),
        ("lf-upgrade", "2.14.1"),
        ("other", "2.9.1 -> 2.14.1"),
    ]


def test_results_on_other_wheels_are_not_shown_as_this_builds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dist = _candidate(tmp_path, audit_passed=True)
    verify = _results(dist, tmp_path / "ev", {"sft-cpu": {"install_s": 41.0}, "serve": {"install_s": 60.0}})
    file = evidence.path("3.11", verify)
    data = json.loads(file.read_text())
    results = data["profiles"]
    results["serve"].update(dist_sha256="0" * 64, produced="2026-11-30 10:00:00 UTC")  # an earlier dist/
    results["sft-cpu"].update(outcome="reused", produced="2026-12-01 09:00:00 UTC")
    results["lf-kt"] = {"install_s": 3.0}  # from before results carried a key
    results["lf-standard"] = {"install_s": 2.0, "dist_sha256": "1" * 64, "installs_from_dist": False}
    file.write_text(json.dumps(data))
    assert release_report.main(["--dist", str(dist), "--evidence", str(verify)]) == 2  # INCOMPLETE
    out = capsys.readouterr().out
    missing = {i["item"]: i["detail"] for i in json.loads((dist / "manifest.json").read_text())["release"]["missing"]}
    assert missing["verify:serve-cp311"].startswith("not verified for this build (obtained on other wheels")
    assert "verify:sft-cpu-cp311" not in missing  # reused, on these wheels
    assert "verify_install sft-cpu-cp311: ok (install_s=41.0), reused: produced 2026-12-01 09:00:00 UTC" in out
    assert (
        "verify_install serve-cp311: not verified for this build (obtained on other wheels, produced 2026-11-30 "
        "10:00:00 UTC)"
    ) in out
    assert "verify_install lf-kt-cp311: not verified for this build (obtained on other wheels)" in out
    assert "verify_install serve-cp311: ok" not in out
    assert "verify_install lf-standard-cp311: ok (install_s=2.0)" in out  # upstream only: holds for any build
    (dist / TF).write_bytes(b"changed")  # dist/ no longer matches SHA256SUMS: nothing is this build's
    assert release_report.main(["--dist", str(dist), "--evidence", str(verify)]) == 1  # FAILED
    out = capsys.readouterr().out
    assert "FAILED dist: dist/ does not match its SHA256SUMS" in out
    assert "dist/ does not match its SHA256SUMS" in out
    assert "verify_install sft-cpu-cp311: not verified for this build" in out


def test_an_audit_of_other_wheels_is_not_this_builds(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dist = _candidate(tmp_path, audit_passed=True)
    audit = json.loads((dist / "audit-report.json").read_text())
    audit["wheels"][1]["sha256"] = "c" * 64
    (dist / "audit-report.json").write_text(json.dumps(audit))
    assert release_report.main(["--dist", str(dist), "--evidence", str(tmp_path / "no")]) == 2  # no audit of these
    out = capsys.readouterr().out
    assert "missing audit: no audit of these wheels" in out
    assert "audit: the report in dist/ judged other wheels than these; run nox -s audit" in out
    assert "audit: not audited" in out


def test_each_stage_says_ran_or_reused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dist = _candidate(tmp_path, audit_passed=True)
    cache = tmp_path / "cache"
    stagecache.Stage("assemble", {"a": "1"}, cache=cache).done()
    stagecache.Stage("verify-serve", {"a": "1"}, cache=cache).done({"install_s": 1})
    assert stagecache.Stage("verify-serve", {"a": "1"}, cache=cache).reuse() is not None
    (cache / "audit.json").write_text("{not json")  # a corrupted record is not shown (and never trusted)
    kernel = tmp_path / "kernel"
    kernel.mkdir()
    (kernel / release_report.KERNEL_STAMP).write_text(f"{'d' * 64} kt_kernel-0.6.1.whl {'e' * 64}\n")
    argv = ["--dist", str(dist), "--stages", str(cache), "--kernel-out", str(kernel), "--evidence", str(tmp_path)]
    release_report.main(argv)
    out = capsys.readouterr().out.split("stages:")[1].split("report:")[0]
    assert "kt-kernel: reused (key dddddddddddddddd" in out
    assert "assemble: ran (key " in out
    assert "verify-serve: reused (key " in out
    assert "audit" not in out
    assert "<h2 id=stages>" in (dist / "release-report.html").read_text()


def test_the_vulnerability_check_is_shown_and_unchecked_is_never_a_pass(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dist = _candidate(tmp_path, audit_passed=True)
    found = {"package": "urllib3", "version": "2.5.0", "id": "GHSA-aaaa"}
    waived = {"package": "numpy", "id": "PYSEC-1", "expires": "2027-01-01"}
    data = {"asked": 272, "found": [found], "waived": [waived], "not_checked": {"accelerate==1.15.0": "not found"}}
    (dist / "vulnerabilities.json").write_text(json.dumps(data))
    release_report.main(["--dist", str(dist), "--evidence", str(tmp_path / "none")])
    assert (
        "vulnerabilities: 1 found, 1 waived, in 272 pinned distributions; urllib3 2.5.0 GHSA-aaaa; waived numpy "
        "PYSEC-1 until 2027-01-01; NOT CHECKED: 1 (the index gave no vulnerability data for them)"
    ) in capsys.readouterr().out
    (dist / "vulnerabilities.json").write_text(json.dumps({"not_checked": "--no-vulnerabilities"}))
    release_report.main(["--dist", str(dist), "--evidence", str(tmp_path / "none")])
    assert "vulnerabilities: NOT CHECKED (--no-vulnerabilities)" in capsys.readouterr().out


def _members(value: object, at: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
    """Every member path of a JSON value (keys and list indexes), deepest last."""
    out: list[tuple[object, ...]] = []
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else []
    for k, v in items:
        out.append((*at, k))
        out += _members(v, (*at, k))
    return out


def _wrong(value: object) -> object:
    """A value of another JSON type than `value`."""
    return [] if isinstance(value, str | bool | int | float) or value is None else "x"


def test_evidence_with_any_member_of_the_wrong_type_or_missing_is_one_error_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every member of a real evidence file (interpreter, results, the serving and doctor details) given another
    type, or removed, one at a time: release_report either reads it or says `error:` once, naming the file and
    the member; never a traceback. publish --plan reads the evidence through the same loader."""
    dist = _candidate(tmp_path, audit_passed=True)
    doctor = {"checks": {"cpu": "ok"}, "seconds": 8.1, "deep_seconds": 9.0}
    serve = {
        "tokenizer": {"native_equal": True, "corpus_texts": 15, "ids_compared": 892, "special_tokens": 256},
        "json_schema": {"accepted": 1, "rejected": 3, "strict_thinking": "ok"},
        "doctor_run": doctor,
        "torch": {"before": "2.9.1", "after": "2.14.1"},
        "install_file": {"file": "install/serve-cp311.txt", "sha256": "0" * 64},
        "problems": [],
        "distributions": {"peft": "peft-kt"},
    }
    verify = _results(dist, tmp_path / "ev", {"serve": serve}, {"serve": {"ok": True, "simulated": False}})
    file = verify / "verify-cp311.json"
    good = json.loads(file.read_text())
    paths = [p for p in _members(good) if p[0] in ("interpreter", "profiles", "resolution")]
    assert len(paths) > 30
    for path in paths:
        for how in ("type", "remove"):
            data = json.loads(json.dumps(good))
            parent = data
            for k in path[:-1]:
                parent = parent[k]
            if how == "type":
                parent[path[-1]] = _wrong(parent[path[-1]])
            elif isinstance(parent, dict):
                del parent[path[-1]]
            else:
                continue
            file.write_text(json.dumps(data))
            code = release_report.main(["--dist", str(dist), "--evidence", str(verify), ACCEPT_ALL])
            err = capsys.readouterr().err
            if code == 1 and "error:" in err:
                lines = [ln for ln in err.splitlines() if ln.startswith("error:")]
                assert len(lines) == 1, (path, how, err)
                assert str(file) in lines[0], (path, how, err)
                assert "`" + ".".join(map(str, path[:2])) in lines[0] or path[0] == "interpreter", (path, how, err)


def test_the_glibc_floor_names_the_wheel_and_the_elf_that_set_it(tmp_path: Path) -> None:
    """Per install profile: the newest manylinux floor of its closure (the pylock's wheels and ours), a tie
    going to our wheel, whose ELF file the audit names; and the kernel's own binaries."""
    from release.report import glibc_floor
    from tests import distkit

    ours = "kt_kernel-1.0-cp311-abi3-manylinux_2_24_x86_64.whl"
    sg = "sglang_kt-1.0-cp311-cp311-manylinux_2_34_x86_64.whl"
    sha = '{ sha256 = "' + "0" * 64 + '" }'
    pylock = (  # a valid PEP 751 lock, as the release's install files are (packaging.pylock reads it)
        'lock-version = "1.0"\ncreated-by = "test"\n[[packages]]\nname = "torch"\nversion = "2.14.1"\n'
        f'wheels = [{{ url = "https://x/torch-2.14.1-cp311-cp311-manylinux_2_28_x86_64.whl", hashes = {sha} }}]\n'
        '[[packages]]\nname = "sglang-kt"\nversion = "1.0"\n'
        f'wheels = [{{ name = "{sg}", path = "../{sg}", hashes = {sha} }}]\n'
        '[[packages]]\nname = "crypto"\nversion = "1"\n'
        f'wheels = [{{ url = "https://x/crypto-1-cp311-abi3-manylinux_2_34_x86_64.whl", hashes = {sha} }}]\n'
    )
    dist = tmp_path / "dist"
    manifest = distkit.make_release(
        dist,
        wheels={ours: b"k", sg: b"s"},
        install={
            "install/pylock.serve-cp311.toml": pylock,
            "install/pylock.sft-cp311.toml": pylock.split('[[packages]]\nname = "sglang-kt"', maxsplit=1)[0],
        },
    )
    audit = {
        "wheels": [
            {"filename": ours, "glibc_needed": {"version": "GLIBC_2.16", "elf": "kt_kernel/cpu/libkt_cpu_amx.so"}},
            {"filename": sg, "glibc_needed": {"version": "GLIBC_2.34", "elf": "sglang/srt/x.so"}},
        ]
    }
    line = glibc_floor(dist, manifest, audit)
    assert f"serve 2.34 (set by {sg} (sglang/srt/x.so needs GLIBC_2.34))" in line
    assert "sft 2.28 (set by torch-2.14.1-cp311-cp311-manylinux_2_28_x86_64.whl)" in line
    assert f"kt-kernel's own binaries: {ours} (kt_kernel/cpu/libkt_cpu_amx.so needs GLIBC_2.16)" in line
