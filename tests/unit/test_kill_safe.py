"""Kill-safe: a process replacing dist/ is SIGKILLed at each instant of the swap (and at random instants
of a loop of swaps); dist/ is then the previous complete release or the new one, never absent once the
next run's sweep has run, and the sweep removes every leftover of the killed run."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from base import paths, swap
from tests.conftest import ROOT

CHILD = textwrap.dedent(
    """
    import os, shutil, signal, sys
    from pathlib import Path
    sys.path.insert(0, sys.argv[1])
    from base import swap
    dest, where, mode = Path(sys.argv[2]), sys.argv[3], sys.argv[4]
    def die(*_a, **_k):
        os.kill(os.getpid(), signal.SIGKILL)
    if mode == "two-renames":
        swap.exchange = lambda a, b: False
    if where == "after-exchange" or where == "after-second-rename":
        shutil.rmtree = die
    if where == "between-renames":
        real = Path.rename
        def rename(self, target):
            real(self, target)
            if self.name == dest.name:
                die()
        Path.rename = rename
    def tree(tag):
        new = swap.staging_name(dest)
        new.mkdir()
        for i in range(20):
            (new / f"w{i}.whl").write_text(tag)
        (new / "SHA256SUMS").write_text(tag)
        return new
    if where == "loop":
        n = 0
        while True:
            n += 1
            swap.replace_dir(tree(f"release {n}"), dest)
    swap.replace_dir(tree("new"), dest)
    """
)


@pytest.fixture
def dist(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    dest = tmp_path / "dist"
    dest.mkdir()
    for i in range(20):
        (dest / f"w{i}.whl").write_text("old")
    (dest / "SHA256SUMS").write_text("old")
    for name, value in {
        "DIST": dest,
        "STAGE_CACHE": tmp_path / "build/stage-cache",
        "KERNEL_OUT": tmp_path / "build/kt-kernel/out",
        "CACHE": tmp_path / "build/cache",
    }.items():
        monkeypatch.setattr(paths, name, value)
    return dest


def _release(dest: Path) -> str:
    """The one tag every file of dest carries (a mix is a failure)."""
    tags = {p.read_text() for p in dest.iterdir()}
    assert len(tags) == 1, f"{dest} mixes releases: {tags}"
    assert len(list(dest.iterdir())) == 21, f"{dest} is incomplete"
    return tags.pop()


def _killed(dest: Path, where: str, mode: str) -> subprocess.CompletedProcess[str]:
    args = [sys.executable, "-c", CHILD, str(ROOT), str(dest), where, mode]
    got = subprocess.run(args, capture_output=True, text=True, timeout=60, check=False)
    assert got.returncode == -signal.SIGKILL, got.stderr
    return got


def _hidden(dest: Path) -> list[str]:
    return sorted(p.name for p in dest.parent.iterdir() if p.name.startswith("."))


@pytest.mark.parametrize(
    ("mode", "where", "then"),
    [
        ("exchange", "after-exchange", "new"),
        ("two-renames", "between-renames", "old"),
        ("two-renames", "after-second-rename", "new"),
    ],
)
def test_a_kill_at_each_instant_of_the_swap(dist: Path, mode: str, where: str, then: str) -> None:
    if mode == "exchange" and not swap.exchange(dist, dist):
        pytest.skip("this system has no renameat2(RENAME_EXCHANGE); the two-rename cases cover it")
    _killed(dist, where, mode)
    assert _hidden(dist), "the killed run left its temporary tree"
    if where == "between-renames":
        assert not dist.exists()  # the instant the next run repairs
    removed = swap.sweep(say=False)
    assert _release(dist) == then
    assert _hidden(dist) == []
    assert removed


@pytest.mark.parametrize("mode", ["exchange", "two-renames"])
def test_kills_at_random_instants_leave_a_complete_release(dist: Path, mode: str) -> None:
    rng = random.Random(54)  # noqa: S311 (kill instants, not cryptography)
    for _ in range(8):
        args = [sys.executable, "-c", CHILD, str(ROOT), str(dist), "loop", mode]
        with subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) as child:
            time.sleep(0.15 + rng.random() * 0.3)
            child.send_signal(signal.SIGKILL)
            child.wait(timeout=30)
        if mode == "exchange":
            assert dist.is_dir(), "with an atomic exchange dist/ is never absent, even before the sweep"
        swap.sweep(say=False)
        _release(dist)
        assert _hidden(dist) == []


def test_a_live_run_s_staging_is_not_swept(dist: Path) -> None:
    live = dist.parent / f".dist.kt-{os.getpid()}.staging"
    live.mkdir()
    assert swap.sweep(say=False) == []
    assert live.is_dir()


def test_the_sweep_takes_only_names_its_own_stages_write(dist: Path) -> None:
    """A user's hidden names beside dist/ and in the caches, however they end, are never taken and never
    stop the sweep; a leftover of ours with a pid out of the system's range is one of a dead run."""
    cache = paths.CACHE
    cache.mkdir(parents=True)
    theirs = [
        dist.parent / ".dist-backup-20261205",
        dist.parent / ".snapshot-20261205120000",
        dist.parent / ".dist-old-99999999999999999999999",
        cache / ".mirror-20261205",
        cache / ".x.kt-99999999999.keep",
        dist.parent / ".notes.1234.part",
    ]
    for p in theirs:
        p.mkdir()
    ours = [
        dist.parent / ".dist.kt-999999999.staging",  # out of pid_max: no live process has it
        cache / ".torch-2.14.1-cp311-cp311-manylinux_2_28_x86_64.whl.kt-999999999.part",
    ]
    for p in ours:
        p.mkdir()
    (dist / ".manifest.json.kt-999999998.part").write_text("{")
    removed = swap.sweep(say=False)
    assert sorted(removed) == sorted([*ours, dist / ".manifest.json.kt-999999998.part"])
    assert all(p.is_dir() for p in theirs)


def test_a_killed_bundle_s_staging_beside_its_out_is_swept_by_the_next(tmp_path: Path) -> None:
    out = tmp_path / "elsewhere" / "bundle"
    out.parent.mkdir()
    dead = out.parent / ".bundle.kt-999999999.part"
    live = out.parent / f".bundle.kt-{os.getpid()}.part"
    other = out.parent / ".other.kt-999999999.part"
    for p in (dead, live, other):
        p.mkdir()
    assert swap.sweep_beside(out, say=False) == [dead]
    assert live.is_dir()
    assert other.is_dir()


def test_a_publish_snapshot_and_a_bundle_s_staging_left_by_a_kill_are_swept_wherever_out_pointed(
    dist: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """publish stopped by SIGTERM leaves build/publish/.snapshot.kt-PID.part; a bundle killed with --out anywhere
    (inside the checkout too) leaves .OUT.kt-PID.part beside it. Both are the sweep's (and so nox -s clean's);
    a user's names beside them stay."""
    monkeypatch.setattr(paths, "PUBLISH_WORK", tmp_path / "build/publish")
    monkeypatch.setattr(paths, "STAGING_PLACES", tmp_path / "build/staging-places.txt")
    snap = paths.PUBLISH_WORK / ".snapshot.kt-999999999.part"
    (snap / "sub").mkdir(parents=True)
    mine = paths.PUBLISH_WORK / ".snapshot-20261205"
    mine.mkdir()
    out = tmp_path / "checkout" / "my bundle [cp311]"
    out.parent.mkdir()
    swap.remember(out)
    swap.remember(out)  # once is enough
    staging = out.parent / f".{out.name}.kt-999999999.part"
    staging.mkdir()
    user = out.parent / ".my bundle [cp311].backup"
    user.mkdir()
    assert paths.STAGING_PLACES.read_text().splitlines() == [str(out)]
    removed = swap.sweep(say=False)
    assert sorted(removed) == sorted([snap, staging])
    assert mine.is_dir()
    assert user.is_dir()
    assert paths.BUILD / "publish" in paths.LEFTOVERS
