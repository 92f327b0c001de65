"""Lock drift: each lockfiles/NAME.txt matches NAME.in, and a stale lock is caught."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from locks import read as locks
from maint import lock


@pytest.mark.parametrize("name", locks.names())
def test_committed_lock_matches_its_input(name: str) -> None:
    assert lock.check(name) == []


@pytest.fixture
def lockdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for f in locks.LOCKDIR.iterdir():
        shutil.copy(f, tmp_path / f.name)
    monkeypatch.setattr(lock, "LOCKDIR", tmp_path)
    monkeypatch.setattr(locks, "LOCKDIR", tmp_path)
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


def test_a_pin_with_extras_needs_its_plain_twin(lockdir: Path) -> None:
    """pip --require-hashes pins a project only through a line it reads: `x[e]==1` alone leaves
    another package's plain `x>=0.5` "not pinned with ==" (seen on the serve lock's nvidia-cutlass-dsl)."""
    text = (lockdir / "serve.txt").read_text()
    twin = text.index("\nnvidia-cutlass-dsl==")
    end = text.index("\n", twin + 1)
    while text[end + 1 :].startswith("    --hash"):
        end = text.index("\n", end + 1)
    (lockdir / "serve.txt").write_text(text[:twin] + text[end:])
    assert any(
        "nvidia-cutlass-dsl[...]==4.8.0 has no plain nvidia-cutlass-dsl==4.8.0" in p for p in lock.check("serve")
    )


def test_with_plain_pins_adds_each_missing_twin_once() -> None:
    body = "a[x]==1 \\\n    --hash=sha256:aa\nb[y]==2 \\\n    --hash=sha256:bb\nb==2 \\\n    --hash=sha256:bb\n"
    assert lock.with_plain_pins(body) == (
        "a[x]==1 \\\n    --hash=sha256:aa\na==1 \\\n    --hash=sha256:aa\n"
        "b[y]==2 \\\n    --hash=sha256:bb\nb==2 \\\n    --hash=sha256:bb\n"
    )
    assert lock.with_plain_pins(lock.with_plain_pins(body)) == lock.with_plain_pins(body)


def test_one_parser_reads_locks_and_install_files() -> None:
    """An install file's comment and option lines are not pins; extras stay with their name; the hashes
    follow their requirement (bundle/ reads install files with this parser, not its own)."""
    from locks.read import parse_pins

    text = (
        "# KT release install file\n--only-binary :all:\n"
        "kt-kernel==0.6.1 \\\n    --hash=sha256:" + "a" * 64 + "\n"
        "# via ktransformers\npydantic[email]==2.11.0 \\\n    --hash=sha256:" + "b" * 64 + " \\\n"
        "    --hash=sha256:" + "c" * 64 + "\n--extra-index-url https://download.pytorch.org/whl/cpu\n"
    )
    got = {n: (str(p.version), p.hashes) for n, p in parse_pins(text, "sft-cp311.txt").items()}
    assert got == {"kt-kernel": ("0.6.1", ("a" * 64,)), "pydantic": ("2.11.0", ("b" * 64, "c" * 64))}
