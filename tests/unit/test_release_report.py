"""release/report.py on a made-up candidate: every carrier's row and verdict, the payload
line, the kernel size breakdown read from the wheel itself, and the exit status (1 unless the
audit passed)."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest

from release import report as release_report

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
    (dist / TF).write_bytes(b"tf")
    wheels = [
        {
            "name": "kt-kernel",
            "version": "0.6.1",
            "kind": "native",
            "filename": KT,
            "sha256": "a" * 64,
            "size": (dist / KT).stat().st_size,
        },
        {
            "name": "transformers-kt",
            "version": "5.19.0.post1",
            "kind": "fork",
            "filename": TF,
            "sha256": "b" * 64,
            "size": 2,
        },
    ]
    payload = {
        "files": 7,
        "extracted_size": 1148 << 20,
        "archive_size": 170 << 20,
        "parts": [{"distribution": "kt-kernel", "size": 44 << 20}, {"distribution": "x", "size": 6 << 20}],
    }
    (dist / "manifest.json").write_text(
        json.dumps({"kt_version": "0.6.1", "torch": "==2.14.1", "wheels": wheels, "payload": payload})
    )
    if audit_passed is not None:
        report = {
            "passed": audit_passed,
            "elapsed_s": 1.5,
            "findings": [{"rule": "x"}] * (0 if audit_passed else 2),
            "wheels": [{"filename": KT, "errors": 0 if audit_passed else 2}, {"filename": TF, "errors": 0}],
        }
        (dist / "audit-report.json").write_text(json.dumps(report))
    return dist


def test_a_passing_candidate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dist = _candidate(tmp_path, audit_passed=True)
    verify = tmp_path / "verify.json"
    verify.write_text(json.dumps({"sft-cpu": {"install_s": 41.0, "elapsed_s": 90.2}}))
    assert release_report.main(["--dist", str(dist), "--verify", str(verify)]) == 0
    out = capsys.readouterr().out
    assert "KT release 0.6.1  (torch ==2.14.1)" in out
    assert "audit: PASSED (0 findings, 1.5s)" in out
    assert "verify_install sft-cpu: ok (install_s=41.0, elapsed_s=90.2)" in out
    assert "CUDA payload: 7 files, 1148 MiB -> 170.0 MiB zstd in 2 parts (MiB: kt-kernel 44.0, x 6.0)" in out
    md = (dist / "release-report.md").read_text()
    assert (
        f"| kt-kernel | 0.6.1 | native | {(dist / KT).stat().st_size / 2**20:.2f} | `aaaaaaaaaaaaaaaa` | pass |" in md
    )
    assert "| transformers-kt | 5.19.0.post1 | fork | 0.00 | `bbbbbbbbbbbbbbbb` | pass |" in md
    assert (dist / "release-report.html").read_text().startswith("<!doctype html>")


def test_the_kernel_breakdown_is_read_from_the_wheel(tmp_path: Path) -> None:
    dist = _candidate(tmp_path, audit_passed=True)
    manifest = json.loads((dist / "manifest.json").read_text())
    assert release_report.kernel_breakdown(dist, manifest) == {
        "CPU variants": 3000,
        "CUDA payload": 5000,
        "baseline core": 700,
        "other": 11,
    }


@pytest.mark.parametrize("passed", [False, None])
def test_a_failed_or_missing_audit_exits_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], passed: bool | None
) -> None:
    dist = _candidate(tmp_path, audit_passed=passed)
    assert release_report.main(["--dist", str(dist), "--verify", str(tmp_path / "none.json")]) == 1
    out = capsys.readouterr().out
    assert "audit: FAILED or missing" in out
    assert "verify_install: not run" in out
    verdict = "FAIL" if passed is False else "not audited"
    assert f"audit: {verdict}" in out


def test_no_manifest_is_an_error_naming_the_session(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert release_report.main(["--dist", str(tmp_path)]) == 1
    assert "manifest.json is missing; run nox -s build_all" in capsys.readouterr().err


def test_the_stage_timing_table_of_this_release_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dist = _candidate(tmp_path, audit_passed=True)
    timings = tmp_path / "timings"
    timings.mkdir()
    (timings / ".release-start").write_text("1000.0\n")
    (timings / "build_all.json").write_text(json.dumps({"start": 1001.0, "seconds": 70.5}))
    (timings / "audit.json").write_text(json.dumps({"start": 900.0, "seconds": 17.0}))  # an earlier run: left out
    assert release_report.main(["--dist", str(dist), "--timings", str(timings)]) == 0
    out = capsys.readouterr().out
    assert "this release's stages:" in out
    assert "build_all" in out
    assert "70.5 s" in out
    assert "audit  " not in out.split("this release's stages:")[1]


def test_a_partial_development_release_is_labelled_and_a_full_one_lists_its_pythons() -> None:
    from release.report import pythons_line

    full = {"pythons": ["3.11", "3.12", "3.13"], "install": [{}] * 18}
    assert pythons_line(full) == "Pythons: 3.11, 3.12, 3.13; 18 install files"
    partial = dict(full, pythons=["3.11"], partial={"pythons": ["3.11"], "missing": ["3.12", "3.13"]})
    assert "PARTIAL DEVELOPMENT RELEASE: no wheels for 3.12, 3.13; not a release" in pythons_line(partial)


def test_the_serving_checks_and_kt_doctor_run_are_shown(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dist = _candidate(tmp_path, audit_passed=True)
    verify = tmp_path / "verify.json"
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
    verify.write_text(json.dumps({"sft-cpu": {"doctor_run": doctor}, "serve": serve}))
    assert release_report.main(["--dist", str(dist), "--verify", str(verify)]) == 0
    out = capsys.readouterr().out
    line = "kt-doctor --run: cpu ok, payload ok, needed ok, gpu skipped: no CUDA device (8.1 s"
    assert f"{line})" in out  # sft-cpu
    assert f"{line}, --deep 9.0 s)" in out  # serve
    assert (
        "serving on CPU: a Kimi-style tokenizer through SGLang's get_tokenizer equals tiktoken (892 ids, 15 texts, "
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
