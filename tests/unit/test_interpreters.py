"""base.interpreters: each CPython of the matrix found in order (given, PATH, pyenv, uv, a Debian root), each
candidate proving itself by running the probe; one that fails is named with the fix and the next is asked,
and a Python with none says every source it tried and how to provide one."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from base import interpreters


def fake(path: Path, **said: object) -> Path:
    """An executable that answers the probe as an interpreter would (defaults: a good CPython 3.12)."""
    answer = {
        "implementation": "cpython",
        "version": "3.12.7",
        "major_minor": "3.12",
        "executable": str(path),
        "free_threaded": False,
        "venv": True,
        "machine": "x86_64",
        **said,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\necho '{json.dumps(answer)}'\n")
    path.chmod(0o755)
    return path


def broken(path: Path, message: str = "boom", code: int = 127) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\necho '{message}' >&2\nexit {code}\n")
    path.chmod(0o755)
    return path


def env(tmp_path: Path, *path_dirs: Path, pyenv: Path | None = None) -> dict[str, str]:
    """An environment with only these PATH folders, a pyenv root (or a HOME without one), no uv."""
    out = {"PATH": os.pathsep.join(str(d) for d in path_dirs) or str(tmp_path / "empty"), "HOME": str(tmp_path)}
    if pyenv is not None:
        out["PYENV_ROOT"] = str(pyenv)
    return out


def test_the_real_interpreter_running_the_tests_proves_itself(tmp_path: Path) -> None:
    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / f"python{here}").symlink_to(sys.executable)
    found = interpreters.find(here, environ=env(tmp_path, tmp_path / "bin"), sources=("given", "PATH"))
    assert found.interpreter is not None
    assert found.interpreter.source == "PATH"
    assert found.interpreter.version == ".".join(map(str, sys.version_info[:3]))
    assert found.interpreter.native


def test_sources_are_asked_in_order_and_a_failing_candidate_is_named_not_skipped(tmp_path: Path) -> None:
    """PATH holds a python3.12 that is really 3.11 and one that crashes; pyenv has 3.12.1 and 3.12.10:
    the newest pyenv build is used, and both PATH candidates are in `tried` with their problem and fix."""
    wrong = fake(tmp_path / "a" / "python3.12", version="3.11.9", major_minor="3.11")
    crash = broken(tmp_path / "b" / "python3.12", "Segmentation fault", 139)
    pyenv = tmp_path / "pyenv"
    fake(pyenv / "versions" / "3.12.1" / "bin" / "python3.12", version="3.12.1")
    fake(pyenv / "versions" / "3.12.10" / "bin" / "python3.12", version="3.12.10")
    fake(pyenv / "versions" / "3.12.0rc1" / "bin" / "python3.12", version="3.12.0rc1")
    found = interpreters.find("3.12", environ=env(tmp_path, wrong.parent, crash.parent, pyenv=pyenv))
    assert found.interpreter is not None
    assert (found.interpreter.source, found.interpreter.version) == ("pyenv", "3.12.10")
    assert [(a.source, a.path) for a in found.tried] == [("PATH", str(wrong)), ("PATH", str(crash))]
    assert found.tried[0].problem == "reports Python 3.11.9, not 3.12"
    assert "exits 139: Segmentation fault" in found.tried[1].problem
    assert "--interpreter 3.12=PATH" in found.tried[1].fix


def test_a_pyenv_shim_on_path_is_passed_over_for_pyenv_s_own_versions(tmp_path: Path) -> None:
    pyenv = tmp_path / "pyenv"
    broken(pyenv / "shims" / "python3.13", "pyenv: python3.13: command not found")
    fake(pyenv / "versions" / "3.13.1" / "bin" / "python3.13", version="3.13.1", major_minor="3.13")
    found = interpreters.find("3.13", environ=env(tmp_path, pyenv / "shims", pyenv=pyenv))
    assert found.interpreter is not None
    assert found.interpreter.source == "pyenv"
    assert found.tried == ()
    assert "1 pyenv shim passed over" in found.searched[1]


@pytest.mark.parametrize(
    ("said", "problem", "fix"),
    [
        ({"implementation": "pypy"}, "is pypy 3.12.7, not CPython", "name a CPython interpreter"),
        ({"free_threaded": True}, "free-threaded build", "default (GIL) build"),
        ({"venv": False}, "cannot make a venv", "apt-get install python3.12-venv"),
        ({"machine": "aarch64"}, "runs on aarch64", "x86_64"),
    ],
)
def test_an_interpreter_that_cannot_serve_is_named_with_the_fix(
    tmp_path: Path, said: dict[str, object], problem: str, fix: str
) -> None:
    exe = fake(tmp_path / "bin" / "python3.12", **said)
    found = interpreters.find("3.12", environ=env(tmp_path, exe.parent), sources=("PATH",))
    assert found.interpreter is None
    ((attempt,),) = [found.tried]
    assert problem in attempt.problem
    assert fix in attempt.fix
    assert problem in found.why_none()


def test_a_given_interpreter_is_the_only_one_asked(tmp_path: Path) -> None:
    """An explicit choice is not overridden: a broken given interpreter leaves that Python without one,
    even with a good one on PATH."""
    good = fake(tmp_path / "bin" / "python3.12")
    bad = broken(tmp_path / "given" / "python3.12")
    given = interpreters.parse_given([f"3.12={bad}"], {})
    found = interpreters.find("3.12", given, environ=env(tmp_path, good.parent))
    assert found.interpreter is None
    assert [a.source for a in found.tried] == ["given"]
    assert "the interpreter named for it is the only one asked" in found.why_none()
    ok = interpreters.find("3.12", {"3.12": str(good)}, environ=env(tmp_path))
    assert ok.interpreter is not None
    assert ok.interpreter.source == "given"


def test_no_interpreter_anywhere_names_every_source_and_how_to_provide_one(tmp_path: Path) -> None:
    found = interpreters.find("3.12", environ=env(tmp_path), roots=tmp_path / "roots")
    assert found.interpreter is None
    why = found.why_none()
    for source in ("given: none named", "PATH: 0 python3.12", "pyenv: 0 CPython 3.12", "uv: uv is not on PATH"):
        assert source in why
    assert "debian: no Debian suite known for CPython 3.12" in why
    assert "pyenv install 3.12" in why
    assert "--interpreter 3.12=/path/to/python3.12" in why
    assert found.as_dict()["interpreter"] is None


def test_a_debian_root_is_the_last_resort_and_needs_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "roots" / "trixie"
    (root / "usr" / "bin").mkdir(parents=True)
    (root / "usr" / "bin" / "python3.13").write_text("")
    monkeypatch.setattr("os.geteuid", lambda: 1000)
    found = interpreters.find("3.13", environ=env(tmp_path), roots=tmp_path / "roots")
    assert found.interpreter is None
    assert f"debian: {root} needs root and chroot to run" in found.why_none()


def test_debian_roots_never_live_in_the_shared_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    from base import paths

    root = interpreters.debian_root("3.13")
    assert root is not None
    assert paths.CACHE not in root.parents
    assert root.parent == paths.DEBIAN_ROOTS


@pytest.mark.skipif(os.geteuid() != 0, reason="a Debian root runs with chroot, as root only; CI runs as root")
def test_a_debian_root_others_can_write_is_never_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another user plants usr/bin/python3.13 in a root they can write (or a root that is theirs): it is refused
    with the path, the problem and the fix, never run as root, never recorded as an interpreter; a symbolic link
    planted as kt-probe is never written through."""
    roots = tmp_path / "roots"
    root = roots / "trixie"
    ran = tmp_path / "ran"
    planted = fake(root / "usr" / "bin" / "python3.13", version="3.13.5", major_minor="3.13")
    planted.write_text(f"#!/bin/sh\ntouch {ran}\n")
    planted.chmod(0o755)
    for p in (roots, root, root / "usr", root / "usr" / "bin"):
        p.chmod(0o755)
    (root / "usr" / "bin").chmod(0o777)
    found = interpreters.find("3.13", environ=env(tmp_path), roots=roots, sources=("debian",))
    assert found.interpreter is None
    (attempt,) = found.tried
    assert f"{root / 'usr' / 'bin'} is writable by others" in attempt.problem
    assert "chmod go-w" in attempt.fix
    (root / "usr" / "bin").chmod(0o755)
    planted.chmod(0o777)
    found = interpreters.find("3.13", environ=env(tmp_path), roots=roots, sources=("debian",))
    assert found.interpreter is None
    assert "python3.13 is not a file of the running user's" in found.tried[0].problem
    assert not ran.exists()
    planted.chmod(0o755)
    outside = tmp_path / "outside"
    outside.mkdir()
    (root / "kt-probe").symlink_to(outside)
    got = interpreters._candidate("3.13", "debian", "/usr/bin/python3.13", "test", str(root))
    assert isinstance(got, interpreters.Attempt)
    assert "is a symbolic link" in got.problem
    assert list(outside.iterdir()) == []


@pytest.mark.parametrize("value", ["3.12", "3.12=", "=/usr/bin/python3", "python3.12=/usr/bin/python3.12", "3=/x"])
def test_a_malformed_interpreter_value_is_refused_with_an_example(value: str) -> None:
    with pytest.raises(interpreters.InterpreterError, match=r"e\.g\. --interpreter 3\.12=/usr/bin/python3\.12"):
        interpreters.parse_given([value], {})


def test_the_environment_variable_names_interpreters_like_path(tmp_path: Path) -> None:
    got = interpreters.parse_given(
        ["3.13=/cli/python3.13"], {interpreters.ENV: "3.12=/a/python3.12:3.13=/b/python3.13"}
    )
    assert got == {"3.12": "/a/python3.12", "3.13": "/cli/python3.13"}  # the command line wins


def test_the_key_names_the_interpreter_s_bytes(tmp_path: Path) -> None:
    exe = fake(tmp_path / "bin" / "python3.12")
    found = interpreters.find("3.12", environ=env(tmp_path, exe.parent), sources=("PATH",))
    assert found.interpreter is not None
    before = found.interpreter.key()
    exe.write_text(exe.read_text() + "# rebuilt\n")
    assert found.interpreter.key()["sha256"] != before["sha256"]
    assert (before["version"], before["source"]) == ("3.12.7", "PATH")


def test_a_relative_path_entry_or_given_path_is_made_absolute_before_use(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PATH=bin (relative) finds bin/python3.12 from this directory; the interpreter recorded (and linked by
    ci_local's setup-python from another directory) is its absolute path, as is a given relative path or name."""
    exe = fake(tmp_path / "bin" / "python3.12")
    monkeypatch.chdir(tmp_path)
    found = interpreters.find("3.12", environ={"PATH": "bin", "HOME": str(tmp_path)}, sources=("PATH",))
    assert found.interpreter is not None
    assert found.interpreter.path == str(exe)
    assert interpreters.parse_given(["3.12=bin/python3.12"], {}) == {"3.12": str(exe)}
    named = interpreters.find("3.12", {"3.12": "python3.12"}, environ={"PATH": str(exe.parent), "HOME": str(tmp_path)})
    assert named.interpreter is not None
    assert named.interpreter.path == str(exe)
