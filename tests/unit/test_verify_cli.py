"""The verification and assembly CLIs on a machine or input that cannot serve them: a clear verdict or
error naming the fix, never a traceback, and (where the machine lacks a tool) NOT VERIFIED, never a pass."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from base import evidence
from base.interpreters import Found, Interpreter
from carriers import __main__ as carriers_cli
from tests import distkit
from verify import debian, resolution


def test_no_debootstrap_is_not_verified_with_the_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("shutil.which", lambda name: None)
    monkeypatch.setattr("os.geteuid", lambda: 0)
    with pytest.raises(debian.Unavailable, match="apt-get install debootstrap"):
        debian.make_root("3.13", tmp_path / "roots")
    assert not (tmp_path / "roots" / "trixie").exists()


def test_not_root_cannot_make_a_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("os.geteuid", lambda: 1000)
    with pytest.raises(debian.Unavailable, match="need root"):
        debian.make_root("3.13", tmp_path / "roots")


def test_a_python_no_debian_suite_ships_is_unavailable_there(tmp_path: Path) -> None:
    with pytest.raises(debian.Unavailable, match=r"no Debian suite ships CPython 3\.12"):
        debian.make_root("3.12", tmp_path)


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


def test_a_result_in_a_debian_root_is_keyed_by_the_root_s_package_list(tmp_path: Path) -> None:
    root = tmp_path / "debian-trixie"
    assert debian.package_list(root) == "absent"
    status = root / "var" / "lib" / "dpkg" / "status"
    status.parent.mkdir(parents=True)
    status.write_text("Package: python3.13\nVersion: 3.13.5-2\n\nPackage: libc6\nVersion: 2.41-12\n")
    first = debian.package_list(root)
    assert first == "libc6=2.41-12\npython3.13=3.13.5-2"
    status.write_text(status.read_text().replace("3.13.5-2", "3.13.7-1"))
    assert debian.package_list(root) != first


def test_the_published_file_s_third_party_pins_leave_the_release_s_own_wheels_out(tmp_path: Path) -> None:
    text = (
        "# KT release install file\n--only-binary :all:\n"
        "kt-kernel==0.6.1 \\\n    --hash=sha256:" + "a" * 64 + "\n"
        "Transformers_KT==5.19.0.post1 \\\n    --hash=sha256:" + "b" * 64 + "\n"
        "torch==2.15.0 \\\n    --hash=sha256:" + "c" * 64 + "\n"
        "numpy==2.4.0 \\\n    --hash=sha256:" + "d" * 64 + " \\\n    --hash=sha256:" + "e" * 64 + "\n"
    )
    (tmp_path / "sft-cp313.txt").write_text(text)
    out = debian._third_party(tmp_path / "sft-cp313.txt", {"kt-kernel", "transformers-kt"})
    assert out.splitlines()[0] == "torch==2.15.0 \\"
    assert "kt-kernel" not in out
    assert "Transformers_KT" not in out
    assert out.count("--hash=sha256:") == 3  # numpy keeps both of its hashes


def test_a_python_without_an_interpreter_is_resolved_simulated_and_never_passes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no interpreter of that Python the resolution is simulated and says so; finding nothing wrong
    proves nothing (NOT VERIFIED); with one, it says which interpreter ran it."""
    simulated = resolution.how("3.13", None)
    assert simulated.startswith("simulated: pip --python-version 3.13")
    assert "environment markers are" in simulated
    real = Interpreter("3.13", "/opt/py/bin/python3.13", "3.13.2", "pyenv", "pyenv /opt/py")
    assert resolution.how("3.13", real) == "CPython 3.13.2 (pyenv: /opt/py/bin/python3.13)"
    pin = "numpy==2.3.5 \\\n    --hash=sha256:" + "a" * 64 + "\n"
    distkit.make_release(tmp_path, {}, {"install/sft-cp313.txt": pin}, pythons=("3.11", "3.13"))
    monkeypatch.setattr(resolution, "resolve", lambda *a, **k: {"numpy": ("2.3.5", "https://x/numpy.whl")})
    r = resolution.check(tmp_path, "sft", "3.13", [], "http://127.0.0.1:9/simple/", None)
    assert r.simulated
    assert not r.problems
    assert r.not_verified.startswith("simulated (no CPython 3.13 interpreter here)")
    r = resolution.check(tmp_path, "sft", "3.13", [], "http://127.0.0.1:9/simple/", real)
    assert not r.simulated
    assert not r.not_verified
    assert r.as_dict()["ok"]


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
    """verify/registry.py: the venv profiles are the ones verify runs; the published ones run on every
    Python of the matrix, the others on the Python the CPU locks are made for."""
    from locks.read import PYTHON_VERSION
    from verify import __main__ as verify_cli
    from verify import registry

    assert list(verify_cli.RUN) == list(registry.VENV)
    assert registry.PUBLISHED == ("sft", "serve", "lf-kt")
    assert sorted(registry.UPSTREAM_ONLY) == ["lf-standard"]
    matrix = ["3.11", "3.12", "3.13"]
    runs = registry.venv_runs(matrix)
    assert runs[:6] == [(p, PYTHON_VERSION) for p in registry.VENV]
    assert runs[6:] == [(p, v) for v in ("3.12", "3.13") for p in ("sft", "serve", "lf-kt")]
    assert registry.venv_runs(["3.12"]) == [("sft", "3.12"), ("serve", "3.12"), ("lf-kt", "3.12")]
    assert registry.run_name("lf-kt", "3.13") == "lf-kt-cp313"


def _release(tmp_path: Path) -> Path:
    dist = tmp_path / "dist"
    distkit.make_release(dist, {}, pythons=("3.11", "3.12"))
    return dist


def test_every_run_goes_into_its_python_s_evidence_and_a_failure_stops_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each venv run happens even when another failed; the failure is recorded as such (never as a pass,
    never left out), each success with the interpreter it ran on; the exit status is 1."""
    from verify import __main__ as verify_cli
    from verify.venv import VerifyError

    here = Interpreter("3.11", sys.executable, "3.11.9", "PATH", "python3.11 on PATH")
    other = Interpreter("3.12", "/opt/python3.12", "3.12.7", "pyenv", "pyenv /opt")
    monkeypatch.setattr(
        "base.interpreters.find", lambda python, given=None, **_: Found(python, here if python == "3.11" else other)
    )

    def sft(dist: Path, work: Path, interpreter: Interpreter) -> dict[str, Any]:
        if interpreter.python == "3.12":
            raise VerifyError("the sft profile's probe failed")
        return {"python": interpreter.python}

    monkeypatch.setitem(verify_cli.RUN, "sft", sft)
    monkeypatch.setitem(verify_cli.RUN, "serve", lambda dist, work, interpreter: {"served": interpreter.python})
    dist = _release(tmp_path)
    argv = ["--dist", str(dist), "--evidence", str(tmp_path / "build"), "--work", str(tmp_path / "w"), "--fresh"]
    assert verify_cli.main([*argv, "--profile", "sft", "--profile", "serve", "--jobs", "2"]) == 1
    assert "error: sft-cp312: the sft profile's probe failed" in capsys.readouterr().err
    got = evidence.load_all(tmp_path / "build")
    assert sorted(got) == ["3.11", "3.12"]
    assert got["3.12"]["profiles"]["sft"]["error"] == "the sft profile's probe failed"
    assert got["3.12"]["profiles"]["serve"]["served"] == "3.12"
    assert got["3.12"]["profiles"]["serve"]["interpreter"]["version"] == "3.12.7"
    assert got["3.11"]["profiles"]["sft"]["python"] == "3.11"
    assert got["3.12"]["interpreter"]["interpreter"]["source"] == "pyenv"
    key = distdir_key(dist)
    assert {r["dist_sha256"] for d in got.values() for r in d["profiles"].values()} == {key}


def distdir_key(dist: Path) -> str:
    from base import distdir

    return distdir.key(dist)


def test_a_python_without_an_interpreter_is_not_verified_never_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from verify import __main__ as verify_cli

    none = Found("3.12", None, (), ("PATH: 0 python3.12",))
    monkeypatch.setattr("base.interpreters.find", lambda python, given=None, **_: none)
    monkeypatch.setitem(verify_cli.RUN, "sft", lambda *a: pytest.fail("ran without an interpreter"))
    dist = _release(tmp_path)
    argv = ["--dist", str(dist), "--evidence", str(tmp_path / "b"), "--work", str(tmp_path / "w"), "--fresh"]
    assert verify_cli.main([*argv, "--profile", "sft", "--python", "3.12"]) == 2
    assert "CPython 3.12: NOT VERIFIED: no CPython 3.12 interpreter (PATH: 0 python3.12" in capsys.readouterr().out
    recorded = evidence.load_all(tmp_path / "b")["3.12"]
    assert recorded["profiles"]["sft"]["not_verified"].startswith("no CPython 3.12 interpreter")
    assert recorded["interpreter"]["interpreter"] is None


def test_a_python_outside_the_release_and_a_bad_interpreter_value_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from verify import __main__ as verify_cli

    dist = _release(tmp_path)
    assert verify_cli.main(["--dist", str(dist), "--python", "3.14"]) == 2
    assert "--python 3.14: not a Python of this release (3.11, 3.12" in capsys.readouterr().err
    assert verify_cli.main(["--dist", str(dist), "--interpreter", "python3.12"]) == 2
    assert "e.g. --interpreter 3.12=/usr/bin/python3.12" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        verify_cli.main(["--dist", str(dist), "--index", "http://x/", "--profile", "sft"])
    assert "goes with --profile resolve" in capsys.readouterr().err


def test_the_audit_stage_over_no_release_names_the_fix(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from release import audit

    assert audit.main(["--dist", str(tmp_path / "none")]) == 2
    assert "does not exist: run `nox -s build_all` first, or name wheels" in capsys.readouterr().out
    assert not (tmp_path / "none").exists()


def test_with_a_predecessor_each_published_profile_s_upgrade_is_recorded_and_judged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """verify_install --previous SPEC moves each published profile from the predecessor on the first Python
    (verify/upgrade.py, stubbed here); a move that loses files fails `upgrade:PROFILE-cp3NN`, one that cannot
    have its predecessor is an error naming why; without --previous there is no upgrade item at all."""
    from release import verdict
    from verify import __main__ as verify_cli
    from verify import upgrade
    from verify.venv import VerifyError

    here = Interpreter("3.11", sys.executable, "3.11.9", "PATH", "python3.11 on PATH")
    monkeypatch.setattr("base.interpreters.find", lambda python, given=None, **_: Found(python, here))
    monkeypatch.setitem(verify_cli.RUN, "sft", lambda dist, work, interpreter: {})
    monkeypatch.setitem(verify_cli.RUN, "serve", lambda dist, work, interpreter: {})

    def moved(dist: Path, work: Path, interpreter: Interpreter, spec: str, profile: str) -> dict[str, Any]:
        if profile == "sft":
            raise VerifyError(f"the predecessor ({spec}) has no ktransformers")
        return {"previous": spec, "moves": [], "problems": ["pip-file: sgl-deep-gemm lacks 821 files"], "seconds": 1.0}

    monkeypatch.setattr(upgrade, "upgrade_profile", moved)
    dist = _release(tmp_path)
    argv = ["--dist", str(dist), "--evidence", str(tmp_path / "b"), "--work", str(tmp_path / "w"), "--fresh"]
    argv += ["--profile", "sft", "--profile", "serve", "--python", "3.11"]
    assert verify_cli.main([*argv, "--previous", str(tmp_path / "old")]) == 1
    assert "upgrade:serve-cp311: FAILED" in capsys.readouterr().out
    got = evidence.load_all(tmp_path / "b")
    items = {i.name: i for i in verdict.upgrade_items(got, distdir_key(dist))}
    assert items["upgrade:serve-cp311"].state == "failed"
    assert "sgl-deep-gemm lacks 821 files" in items["upgrade:serve-cp311"].detail
    assert (items["upgrade:sft-cp311"].state, items["upgrade:sft-cp311"].detail) == (
        "failed",
        f"the predecessor ({tmp_path / 'old'}) has no ktransformers",
    )
    other = tmp_path / "b2"
    assert verify_cli.main([*argv[:2], "--evidence", str(other), *argv[4:]]) == 0
    assert verdict.upgrade_items(evidence.load_all(other), distdir_key(dist)) == []


def test_the_predecessor_is_installed_as_its_users_have_it(tmp_path: Path) -> None:
    """An earlier dist/ with an install file for the profile and Python: that file, by hash; a folder of wheels:
    the profile's root at the predecessor's version; a predecessor without the root is named."""
    from tests import distkit
    from tests.unit.test_release_diff import wheel
    from verify import upgrade
    from verify.venv import VerifyError

    earlier = tmp_path / "earlier"
    distkit.make_release(earlier, {"ktransformers-0.5.3-py3-none-any.whl": b"k"}, {"install/serve-cp311.txt": "x\n"})
    cmds, what = upgrade.predecessor_install(str(earlier), "ktransformers[serve]", "serve", "3.11")
    assert cmds[0][-3:] == ["--require-hashes", "-r", str(earlier / "install" / "serve-cp311.txt")]
    assert what.startswith("install/serve-cp311.txt of the release in")
    wheels = tmp_path / "wheels"
    wheel(wheels, "ktransformers", "0.7.2", {})
    cmds, what = upgrade.predecessor_install(str(wheels), "ktransformers[serve]", "serve", "3.11")
    assert cmds[0][-1] == "ktransformers[serve]==0.7.2"
    assert cmds[0][-3:-1] == ["--find-links", str(wheels)]
    other = tmp_path / "other"
    wheel(other, "peft-kt", "0.18.1", {})
    with pytest.raises(VerifyError, match=r"has no ktransformers: its users never installed ktransformers\[serve\]"):
        upgrade.predecessor_install(str(other), "ktransformers[serve]", "serve", "3.11")


def test_an_unreachable_predecessor_leaves_the_upgrade_not_checked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from locks.previous import Unreachable
    from release import verdict
    from verify import __main__ as verify_cli
    from verify import upgrade

    here = Interpreter("3.11", sys.executable, "3.11.9", "PATH", "python3.11 on PATH")
    monkeypatch.setattr("base.interpreters.find", lambda python, given=None, **_: Found(python, here))
    monkeypatch.setitem(verify_cli.RUN, "serve", lambda dist, work, interpreter: {})

    def unreachable(*args: Any, **kwargs: Any) -> dict[str, Any]:
        raise Unreachable("--previous: downloading kt-kernel==0.7.2 from https://x/simple failed (unreachable")

    monkeypatch.setattr(upgrade, "upgrade_profile", unreachable)
    dist = _release(tmp_path)
    argv = ["--dist", str(dist), "--evidence", str(tmp_path / "b"), "--work", str(tmp_path / "w"), "--fresh"]
    argv += ["--profile", "serve", "--python", "3.11", "--previous", "https://x/simple::kt-kernel==0.7.2"]
    assert verify_cli.main(argv) == 2  # NOT VERIFIED
    (item,) = verdict.upgrade_items(evidence.load_all(tmp_path / "b"), distdir_key(dist))
    assert item.state == "missing"
    assert "NOT VERIFIED: --previous: downloading kt-kernel==0.7.2" in item.detail
