"""Upgrade verification with real pip and uv in fresh venvs, on wheels made here: the predecessor's kt-kernel
ships deep_gemm/, which the release moves to sgl-deep-gemm. By pip the move loses deep_gemm/ (pip installs
sgl-deep-gemm first, then uninstalls the old kt-kernel by its RECORD: pypa/pip#8509) and the check names the
files, their owner before and the fix; by uv it holds. With the ordering edge (the new owner requires the old
owner's new version, as the release diff demands) pip's move holds too."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from tests.unit.test_release_diff import wheel
from verify import upgrade
from verify.upgrade import Move
from verify.venv import fresh_venv

pytestmark = pytest.mark.integration

DEEP = {f"deep_gemm/m{i}.py": f"# {i}\n".encode() for i in range(5)}


def _wheels(tmp_path: Path, edge: bool) -> Path:
    """The predecessor and the release, side by side in one folder (pip and uv read it with --no-index)."""
    where = tmp_path / "wheels"
    wheel(where, "kt-kernel", "1.0", {"kt_kernel/__init__.py": b"v = 1\n", **DEEP})
    # without the edge, kt-kernel 2.0 pulls sgl-deep-gemm in: pip installs it first, as in the KT 0.7.2 move
    wheel(
        where,
        "kt-kernel",
        "2.0",
        {"kt_kernel/__init__.py": b"v = 2\n"},
        requires=() if edge else ("sgl-deep-gemm==0.2",),
    )
    wheel(where, "sgl-deep-gemm", "0.2", DEEP, requires=("kt-kernel==2.0",) if edge else ())
    return where


ROOTS = ("kt-kernel==2.0", "sgl-deep-gemm==0.2")  # what the release's install file pins


def _moves(where: Path) -> list[Move]:
    uv = shutil.which("uv") or str(Path(sys.executable).parent / "uv")
    offline = ("--no-index", "--find-links", str(where))
    return [
        Move("pip-upgrade", ("{python}", "-m", "pip", "install", "-q", "-U", *offline, *ROOTS)),
        Move("uv-upgrade", (uv, "pip", "install", "--python", "{python}", "-U", *offline, *ROOTS)),
    ]


def _fresh(tmp_path: Path, where: Path) -> upgrade.State:
    venv = fresh_venv(tmp_path / "fresh")
    upgrade.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-index", "--find-links",
                 str(where), *ROOTS], "the fresh install")  # fmt: skip
    return upgrade.state(venv)


def test_pip_loses_a_file_that_changes_owner_and_the_check_names_it(tmp_path: Path) -> None:
    where = _wheels(tmp_path, edge=False)
    fresh = _fresh(tmp_path, where)
    assert fresh.damaged == []
    previous = [["{python}", "-m", "pip", "install", "-q", "--no-index", "--find-links", str(where), "kt-kernel==1.0"]]
    pip_move, uv_move = _moves(where)
    got = upgrade.check_move(tmp_path / "moves", previous, pip_move, fresh)
    assert got["files_missing"] == 5
    (problem,) = got["problems"]
    assert "pip-upgrade (`" in problem
    assert "sgl-deep-gemm 0.2 lacks 5 and has 0 changed of its files (e.g. deep_gemm/m" in problem
    assert "owned before the move by kt-kernel" in problem
    assert "pypa/pip#8509" in problem
    assert "pip install --force-reinstall --no-deps sgl-deep-gemm==0.2" in problem
    (change,) = [c for c in got["owner_changes"] if c["after"] == "sgl-deep-gemm"]
    assert (change["before"], change["paths"], change["safe_for_pip"]) == ("kt-kernel", 5, False)
    by_uv = upgrade.check_move(tmp_path / "moves", previous, uv_move, fresh)
    assert by_uv["problems"] == []
    assert by_uv["files_missing"] == 0


def test_the_ordering_edge_makes_pip_s_move_whole(tmp_path: Path) -> None:
    """sgl-deep-gemm requires kt-kernel==2.0: pip replaces kt-kernel first, then installs deep_gemm/."""
    where = _wheels(tmp_path, edge=True)
    fresh = _fresh(tmp_path, where)
    previous = [["{python}", "-m", "pip", "install", "-q", "--no-index", "--find-links", str(where), "kt-kernel==1.0"]]
    for move in _moves(where):
        got = upgrade.check_move(tmp_path / "moves", previous, move, fresh)
        assert got["problems"] == [], move.name
        assert got["files_missing"] == 0
        assert [c["safe_for_pip"] for c in got["owner_changes"] if c["after"] == "sgl-deep-gemm"] == [True]


def test_a_leftover_of_the_predecessor_and_another_version_are_named(tmp_path: Path) -> None:
    """A predecessor's file nothing owns after the move, and a distribution at another version than a fresh
    install has: both are differences."""
    where = _wheels(tmp_path, edge=True)
    fresh = _fresh(tmp_path, where)
    venv = fresh_venv(tmp_path / "moved")
    upgrade.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-index", "--find-links",
                 str(where), "kt-kernel==1.0"], "the predecessor")  # fmt: skip
    before = upgrade.state(venv)
    stray = upgrade.site_packages(venv) / "deep_gemm" / "built_at_runtime.so"
    stray.write_bytes(b"x")
    moved = upgrade.state(venv)
    problems = upgrade.compare(moved, fresh, before, "test")
    assert any("kt-kernel is 1.0 after the move, 2.0 in a fresh install" in p for p in problems)
    orphan = upgrade.State({**moved.dists, "old-dep": "1", "other-dep": "2"}, moved.unowned, [], moved.owners)
    (line,) = [p for p in upgrade.compare(orphan, fresh, before, "test") if "stay" in p]
    assert "2 distributions of the predecessor stay that a fresh install lacks (old-dep 1, other-dep 2)" in line
    assert any("1 files of the predecessor no installed distribution owns (e.g. deep_gemm/built_at_runtime.so" in p
               for p in problems)  # fmt: skip
