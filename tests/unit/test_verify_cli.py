"""The verification and assembly CLIs on a machine or input that cannot serve them: a clear verdict or
error naming the fix, never a traceback, and (where the machine lacks a tool) NOT VERIFIED, never a pass."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from carriers import __main__ as carriers_cli
from tests import distkit
from verify import interpreters, resolution


def test_no_debootstrap_is_not_verified_with_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("shutil.which", lambda name: None)
    monkeypatch.setattr("os.geteuid", lambda: 0)
    out = tmp_path / "r.json"
    distkit.make_release(tmp_path, {})  # a dist/ of nothing: the verdict is about the machine
    assert interpreters.main(["--dist", str(tmp_path), "--cache", str(tmp_path / "cache"), "--json", str(out)]) == 0
    assert "NOT VERIFIED: debootstrap is not installed: apt-get install debootstrap" in capsys.readouterr().out
    recorded = json.loads(out.read_text())
    assert list(recorded) == ["3.13"]
    # no result, no pass: only why, and the key of the dist/ it was asked about
    assert sorted(recorded["3.13"]) == ["dist_sha256", "installs_from_dist", "not_verified", "outcome", "produced"]
    assert "apt-get install debootstrap" in recorded["3.13"]["not_verified"]


def test_not_root_is_not_verified_even_with_a_root_already_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "cache" / "debian-trixie" / "usr" / "bin").mkdir(parents=True)
    (tmp_path / "cache" / "debian-trixie" / "usr" / "bin" / "python3.13").write_text("")
    monkeypatch.setattr("os.geteuid", lambda: 1000)
    with pytest.raises(interpreters.Unavailable, match="need root"):
        interpreters.debian_root("3.13", tmp_path / "cache")


def test_a_python_without_a_known_suite_is_an_error_not_unavailable(tmp_path: Path) -> None:
    with pytest.raises(interpreters.InterpreterError, match=r"no Debian suite known for CPython 3\.12") as exc:
        interpreters.debian_root("3.12", tmp_path)
    assert not isinstance(exc.value, interpreters.Unavailable)


def test_resolution_of_a_directory_that_is_no_release_names_the_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert resolution.main(["--dist", str(tmp_path / "none"), "--profile", "sft", "--python", "3.11"]) == 1
    err = capsys.readouterr().err
    assert "manifest.json is missing: " in err
    assert "holds no release; build it (nox -s build_all)" in err


def test_a_partial_release_for_a_python_outside_the_matrix_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["assemble", "--kernel", str(tmp_path), "--dist", str(tmp_path / "dist"), "--partial", "3.10"]
    assert carriers_cli.main(argv) != 0
    assert "--partial 3.10: not in the release's Python matrix ['3.11', '3.12', '3.13']" in capsys.readouterr().err
    assert not (tmp_path / "dist").exists()


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("manifest.json", "{not json", "not a release manifest"),
        ("manifest.json", '{"wheels": [{"filename": "x.whl"}]}', "not a release manifest"),
        ("SHA256SUMS", "x  a.whl\n", "is not '<sha256>  <file in this directory>'"),
        ("a-1-py3-none-any.whl", "changed", "differs from SHA256SUMS"),
    ],
)
def test_a_corrupt_release_directory_is_a_bundle_error_naming_the_file(
    tmp_path: Path, name: str, content: str, message: str
) -> None:
    from bundle.build import BundleError, build

    dist = tmp_path / "dist"
    pin = "numpy==2.3.5 \\\n    --hash=sha256:" + "a" * 64 + "\n"
    distkit.make_release(dist, {"a-1-py3-none-any.whl": b"a"}, {"install/sft-cp311.txt": pin})
    (dist / name).write_text(content)
    with pytest.raises(BundleError, match=message) as exc:
        build(dist, "sft", "3.11", tmp_path / "out")
    assert name in str(exc.value)
    assert not (tmp_path / "out").exists()


def test_resolution_over_a_corrupt_manifest_is_an_error_not_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "install").mkdir()
    (tmp_path / "manifest.json").write_text("{not json")
    assert resolution.main(["--dist", str(tmp_path), "--profile", "sft", "--python", "3.11"]) == 1
    assert "error:" in capsys.readouterr().err


def test_the_cp313_result_is_keyed_by_the_debian_root_s_package_list(tmp_path: Path) -> None:
    assert interpreters.package_list("3.13", tmp_path) == "absent"
    status = tmp_path / "debian-trixie" / "var" / "lib" / "dpkg" / "status"
    status.parent.mkdir(parents=True)
    status.write_text("Package: python3.13\nVersion: 3.13.5-2\n\nPackage: libc6\nVersion: 2.41-12\n")
    first = interpreters.package_list("3.13", tmp_path)
    assert first == "libc6=2.41-12\npython3.13=3.13.5-2"
    status.write_text(status.read_text().replace("3.13.5-2", "3.13.7-1"))
    assert interpreters.package_list("3.13", tmp_path) != first


def test_the_published_file_s_third_party_pins_leave_the_release_s_own_wheels_out(tmp_path: Path) -> None:
    text = (
        "# KT release install file\n--only-binary :all:\n"
        "kt-kernel==0.6.1 \\\n    --hash=sha256:" + "a" * 64 + "\n"
        "Transformers_KT==5.19.0.post1 \\\n    --hash=sha256:" + "b" * 64 + "\n"
        "torch==2.15.0 \\\n    --hash=sha256:" + "c" * 64 + "\n"
        "numpy==2.4.0 \\\n    --hash=sha256:" + "d" * 64 + " \\\n    --hash=sha256:" + "e" * 64 + "\n"
    )
    (tmp_path / "sft-cp313.txt").write_text(text)
    out = interpreters._third_party(tmp_path / "sft-cp313.txt", {"kt-kernel", "transformers-kt"})
    assert out.splitlines()[0] == "torch==2.15.0 \\"
    assert "kt-kernel" not in out
    assert "Transformers_KT" not in out
    assert out.count("--hash=sha256:") == 3  # numpy keeps both of its hashes


def test_a_python_without_an_interpreter_here_is_resolved_simulated_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from base import paths

    monkeypatch.setattr(paths, "CACHE", tmp_path)
    assert resolution.how(resolution.HERE) == f"CPython {resolution.HERE}, this interpreter"
    simulated = resolution.how("3.13")
    assert simulated.startswith("simulated: pip --python-version 3.13")
    assert "environment markers are" in simulated
    (tmp_path / "debian-trixie" / "usr" / "bin").mkdir(parents=True)
    (tmp_path / "debian-trixie" / "usr" / "bin" / "python3.13").write_text("")
    monkeypatch.setattr("os.geteuid", lambda: 0)
    monkeypatch.setattr("shutil.which", lambda name: f"/usr/sbin/{name}")
    assert resolution.interpreter_root("3.13") == tmp_path / "debian-trixie"
    assert resolution.how("3.13").startswith("CPython 3.13 in debian-trixie (packages ")
    monkeypatch.setattr("os.geteuid", lambda: 1000)  # no chroot without root: simulated again
    assert resolution.interpreter_root("3.13") is None


def test_the_root_trusts_the_ca_bundle_this_machine_s_pip_trusts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bundle = tmp_path / "site-ca.pem"
    bundle.write_text("-----BEGIN CERTIFICATE-----\n")
    monkeypatch.setenv("PIP_CERT", str(bundle))
    assert resolution.host_ca() == bundle
    monkeypatch.setenv("PIP_CERT", str(tmp_path / "missing.pem"))
    assert resolution.host_ca() != tmp_path / "missing.pem"


def test_one_registry_lists_every_verification_profile() -> None:
    """verify/registry.py: the venv profiles are the ones verify runs, the interpreters' the Debian suites."""
    from verify import __main__ as verify_cli
    from verify import registry

    assert list(verify_cli.RUN) == list(registry.VENV)
    assert interpreters.SUITES == registry.SUITES
    assert [p.name for p in registry.PROFILES if p.runs == "interpreters"] == ["cp313"]
    assert sorted(registry.UPSTREAM_ONLY) == ["lf-standard"]


def test_verify_install_dispatches_each_profile_to_its_entry_point(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from verify import __main__ as verify_cli

    ran: list[tuple[str, list[str]]] = []

    def stand_in(kind: str, status: int) -> Callable[..., int]:
        def run(*args: Any) -> int:
            ran.append((kind, args[-1]))
            return status

        return run

    monkeypatch.setattr(verify_cli, "run_venv", stand_in("venv", 0))
    monkeypatch.setattr(interpreters, "main", stand_in("interpreters", 2))
    monkeypatch.setattr(resolution, "main", stand_in("resolution", 0))
    dist = ["--dist", str(tmp_path)]
    assert verify_cli.main(dist) == 2  # one part could not check: not a pass, not a failure
    assert [k for k, _ in ran] == ["venv", "interpreters", "resolution"]
    assert ran[0][1] == ["sft-cpu", "sft", "serve", "lf-standard", "lf-kt", "lf-upgrade"]
    assert "--python=3.13" in ran[1][1]
    ran.clear()
    assert verify_cli.main([*dist, "--index", "http://127.0.0.1:9/simple/", "--python", "3.12"]) == 0
    ((kind, argv),) = ran
    assert kind == "resolution"
    assert argv[argv.index("--index") + 1] == "http://127.0.0.1:9/simple/"
    assert "--python=3.12" in argv
    for wrong in (["--index", "http://x/", "--profile", "sft"], ["--python", "3.12", "--profile", "sft"]):
        with pytest.raises(SystemExit):
            verify_cli.main([*dist, *wrong])
        assert "goes with --profile resolve" in capsys.readouterr().err


def test_a_failing_venv_profile_does_not_stop_the_others(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each venv profile runs even when one before it failed; the failure is named, its earlier success is
    dropped from the results, the others are recorded, and the exit status is the failure's."""
    from verify import __main__ as verify_cli
    from verify.venv import VerifyError

    def sft(dist: Path, work: Path) -> dict[str, Any]:
        raise VerifyError("the sft profile's probe failed")

    monkeypatch.setitem(verify_cli.RUN, "sft", sft)
    monkeypatch.setitem(verify_cli.RUN, "serve", lambda dist, work: {"served": True})
    distkit.make_release(tmp_path / "dist", {})
    out = tmp_path / "verify.json"
    out.write_text(json.dumps({"sft": {"stale": "an earlier success"}}))
    argv = ["--dist", str(tmp_path / "dist"), "--json", str(out), "--work", str(tmp_path / "w"), "--fresh"]
    assert verify_cli.main([*argv, "--profile", "sft", "--profile", "serve"]) == 1
    err = capsys.readouterr().err
    assert "error: sft: the sft profile's probe failed" in err
    assert "1 of 2 venv profiles failed: sft" in err
    recorded = json.loads(out.read_text())
    assert "sft" not in recorded
    assert recorded["serve"]["served"] is True


def test_the_audit_stage_over_no_release_names_the_fix(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from release import audit

    assert audit.main(["--dist", str(tmp_path / "none")]) == 2
    assert "does not exist: run `nox -s build_all` first, or name wheels" in capsys.readouterr().out
    assert not (tmp_path / "none").exists()
