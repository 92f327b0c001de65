"""The release's Python matrix: one owner (carriers.toml `pythons`), validated on load; per-Python
input selection by wheel tags; the coverage check that refuses a release short of a Python."""

from __future__ import annotations

from pathlib import Path

import pytest

from base.version import python_tag
from carriers import DefinitionError, load
from carriers.assemble import Built, coverage_problems
from carriers.draft import Draft, Finish
from carriers.model import DEFINITIONS
from locks import read as locks
from locks.targets import serves
from maint import lock


def _with_pythons(tmp_path: Path, line: str) -> Path:
    text = DEFINITIONS.read_text()
    start = text.index("pythons = [")
    end = text.index("\n", start)
    path = tmp_path / "carriers.toml"
    path.write_text(text[:start] + line + text[end:])
    return path


def test_the_matrix_is_three_pythons_and_every_reader_takes_it_from_the_model() -> None:
    assert load().pythons == ("3.11", "3.12", "3.13")
    assert lock.matrix() == load().pythons
    assert [python_tag(v) for v in load().pythons] == ["cp311", "cp312", "cp313"]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('pythons = ["3.12", "3.11"]', "ascending"),
        ('pythons = ["3.11", "3.11"]', "each version once"),
        ('pythons = ["3.11", "py3"]', 'CPython "3.N"'),
        ("pythons = []", "list of CPython versions"),
        ('pythons = "3.11"', "list of CPython versions"),
    ],
)
def test_a_bad_matrix_is_a_definition_error_naming_the_fix(tmp_path: Path, line: str, message: str) -> None:
    with pytest.raises(DefinitionError, match=message):
        load(_with_pythons(tmp_path, line), patches_dir=DEFINITIONS.parent / "patches")


def test_a_misspelt_release_key_is_refused_with_a_hint(tmp_path: Path) -> None:
    path = _with_pythons(tmp_path, 'pythons = ["3.11"]\npython = ["3.11"]')
    with pytest.raises(DefinitionError, match="did you mean 'pythons'"):
        load(path, patches_dir=DEFINITIONS.parent / "patches")


@pytest.mark.parametrize(
    ("wheel", "expected"),
    [
        ("sglang-0.5.23-cp311-cp311-manylinux_2_34_x86_64.whl", ["3.11"]),
        ("sglang-0.5.23-cp313-cp313-manylinux_2_34_x86_64.whl", ["3.13"]),
        ("kt_kernel-0.6.1-cp311-abi3-manylinux_2_34_x86_64.whl", ["3.11", "3.12", "3.13"]),
        ("sglang_kernel-0.4.10-cp310-abi3-manylinux2014_x86_64.whl", ["3.11", "3.12", "3.13"]),
        ("peft-0.21.2-py3-none-any.whl", ["3.11", "3.12", "3.13"]),
        ("x-1.0-cp312-abi3-linux_x86_64.whl", ["3.12", "3.13"]),
    ],
)
def test_which_pythons_a_wheel_serves(wheel: str, expected: list[str]) -> None:
    assert [v for v in ("3.11", "3.12", "3.13") if serves(wheel, v)] == expected


def test_a_python_of_the_matrix_without_wheels_is_named_with_its_fix(tmp_path: Path) -> None:
    def built(name: str, kind: str, path: Path) -> Built:
        return Built(name, "0.6.1", kind, Draft(path.name, Finish(name, "0.6.1", "0.6.1"), data=b""), path.parent)

    kt = [built("kt-kernel", "native", tmp_path / "kt_kernel-0.6.1-cp313-cp313-manylinux_2_34_x86_64.whl")]
    assert coverage_problems(kt, ["3.13"]) == []
    (problem,) = coverage_problems(kt, ["3.11", "3.13"])
    assert "kt-kernel has no wheel for CPython 3.11" in problem
    assert "nox -s build_cuda" in problem
    sg = [
        built("sglang-kt", "fork", tmp_path / f"sglang_kt-0.6.1-{t}-{t}-manylinux_2_34_x86_64.whl")
        for t in ("cp311", "cp312")
    ]
    (problem,) = coverage_problems(sg, ["3.11", "3.12", "3.13"])
    assert "sglang-kt has no wheel for CPython 3.13" in problem
    assert "publishes none" in problem


@pytest.fixture
def lockdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for f in locks.LOCKDIR.iterdir():
        (tmp_path / f.name).write_bytes(f.read_bytes())
    monkeypatch.setattr(lock, "LOCKDIR", tmp_path)
    monkeypatch.setattr(locks, "LOCKDIR", tmp_path)  # the reader's own (pylock_path, names)
    return tmp_path


def test_every_install_profile_has_a_valid_pylock_for_every_python() -> None:
    assert locks.install_profiles() == ["lf-kt", "serve", "sft"]
    for name in locks.install_profiles():
        assert lock.check_pylocks(name) == []
        for python in load().pythons:
            assert locks.read_pylock(locks.pylock_path(name, python)).packages


def test_a_missing_stale_or_broken_pylock_is_drift(lockdir: Path) -> None:
    (lockdir / "pylock.sft-cp312.toml").unlink()
    assert any("pylock.sft-cp312.toml is missing" in p for p in lock.check_pylocks("sft"))
    (lockdir / "pylock.sft-cp310.toml").write_text((lockdir / "pylock.sft-cp311.toml").read_text())
    assert any("CPython 310 is not in the release's matrix" in p for p in lock.check_pylocks("sft"))
    broken = lockdir / "pylock.sft-cp313.toml"
    broken.write_text(broken.read_text().replace('lock-version = "1.0"', 'lock-version = "9.0"'))
    assert any("not a valid PEP 751 lock" in p for p in lock.check_pylocks("sft"))


def test_an_sdist_only_package_is_allowed_but_nothing_at_all_is_not(lockdir: Path) -> None:
    # No package of the release's closures is sdist-only today (sglang-kt moved outlines, whose outlines-core
    # has no CPython 3.13 wheel, to an extra); a package whose wheels are gone but whose sdist is locked is
    # still a valid lock (the install file then says --no-binary), one with neither is not.
    text = (lockdir / "pylock.serve-cp313.toml").read_text()
    assert lock.check_pylocks("serve") == []
    start = text.index('name = "packaging"')
    end = text.index("[[packages]]", start)
    block = text[start:end]
    sdist_only = "\n".join(ln for ln in block.splitlines() if not ln.startswith("wheels ="))
    (lockdir / "pylock.serve-cp313.toml").write_text(text[:start] + sdist_only + "\n\n" + text[end:])
    assert lock.check_pylocks("serve") == []
    stripped = "\n".join(ln for ln in sdist_only.splitlines() if not ln.startswith("sdist ="))
    (lockdir / "pylock.serve-cp313.toml").write_text(text[:start] + stripped + "\n\n" + text[end:])
    # packaging's PEP 751 validator refuses a package with no file at all, naming it
    assert any(
        "not a valid PEP 751 lock" in p and "sdist and wheels are not set" in p for p in lock.check_pylocks("serve")
    )


def test_the_python_tag_and_the_install_file_are_named_in_one_place() -> None:
    """base.version names the tag and base.distdir the install files, for every stage and the assembly."""
    from base.distdir import install_name
    from base.version import python_key

    assert [python_tag(v) for v in ("3.11", "3.13")] == ["cp311", "cp313"]
    assert sorted(["3.13", "3.9", "3.11"], key=python_key) == ["3.9", "3.11", "3.13"]
    assert install_name("sft", "3.12") == "install/sft-cp312.txt"


def _writer(build: str, who: str, n: int) -> None:
    from base import evidence

    for i in range(n):
        evidence.update("3.12", build=Path(build), section="profiles", name=f"{who}-{i}", result={"dist_sha256": "k"})


def test_two_processes_recording_one_python_s_evidence_keep_each_other_s_results(tmp_path: Path) -> None:
    """Two verify runs for one Python, each replacing the file after reading it: without the lock across
    processes each lost results the other had written in between."""
    import multiprocessing

    from base import evidence

    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_writer, args=(str(tmp_path), who, 60)) for who in ("a", "b")]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    got = evidence.load(evidence.path("3.12", tmp_path))["profiles"]
    assert sorted(got) == sorted(f"{w}-{i}" for w in ("a", "b") for i in range(60))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["verify-cp312.json"]  # no lock file, no part left
