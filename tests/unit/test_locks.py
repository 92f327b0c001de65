"""Lock drift: each lockfiles/NAME.txt matches NAME.in, and a stale lock is caught."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tools import lock


@pytest.mark.parametrize("name", lock.names())
def test_committed_lock_matches_its_input(name: str) -> None:
    assert lock.check(name) == []


@pytest.fixture
def lockdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for f in lock.LOCKDIR.iterdir():
        shutil.copy(f, tmp_path / f.name)
    monkeypatch.setattr(lock, "LOCKDIR", tmp_path)
    return tmp_path


def test_new_requirement_in_input_is_drift(lockdir: Path) -> None:
    (lockdir / "nox.in").write_text((lockdir / "nox.in").read_text() + "rich>=13\n")
    assert any("rich" in p and "not locked" in p for p in lock.check("nox"))


def test_tightened_bound_is_drift(lockdir: Path) -> None:
    (lockdir / "nox.in").write_text("nox>=9999\nuv>=0.6\n")
    assert any("does not satisfy nox>=9999" in p for p in lock.check("nox"))


def test_pin_without_hash_is_rejected(lockdir: Path) -> None:
    text = (lockdir / "nox.txt").read_text()
    first_hash = text.index(" \\\n    --hash")
    end = text.index("\n", text.index("--hash", first_hash) + 1)
    while text[end + 1 :].startswith("    --hash"):
        end = text.index("\n", end + 1)
    (lockdir / "nox.txt").write_text(text[:first_hash] + text[end:])
    assert any("has no --hash" in p for p in lock.check("nox"))


def test_machine_path_is_rejected(lockdir: Path) -> None:
    (lockdir / "nox.txt").write_text((lockdir / "nox.txt").read_text() + "--find-links file:///opt/wheels\n")
    assert any("machine path" in p for p in lock.check("nox"))
