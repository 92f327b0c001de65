"""The payload cache belongs to its user (as ssh's and gpg's do): a root or entry another user owns,
that others can write, or that is a link is refused with the fix; the lock and the log are never
opened through a planted link; the runtime never writes past a file's declared size; a full disk is
a PayloadError naming the directory and the need; `prune` removes other releases' entries, never
one in use."""

from __future__ import annotations

import errno
import fcntl
import json
import os
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import KT_SRC, load_source_module
from tests.payloadkit import FakeRelease, compressible, installed

payload: Any = load_source_module("kt_payload_cache_under_test", KT_SRC / "payload.py")

FILES = {
    "sgl_kernel/sm90/common_ops.abi3.so": compressible(300_000, 2),
    "kt_kernel/cuda/lib/libkt_cuda.so": compressible(100_000, 4),
}


@pytest.fixture
def release(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeRelease:
    return installed(tmp_path, monkeypatch, FILES)


def test_a_root_owned_by_another_user_is_refused(release: FakeRelease, monkeypatch: pytest.MonkeyPatch) -> None:
    payload.materialize(release.manifest)  # a good cache of the current user
    me = os.getuid()
    monkeypatch.setattr(payload.os, "getuid", lambda: me + 1)  # the same directory, seen by someone else
    with pytest.raises(payload.PayloadError, match=rf"belongs to uid {me}, not to you \(uid {me + 1}\)"):
        payload.materialize(release.manifest)


def test_a_root_writable_by_others_is_refused(release: FakeRelease, tmp_path: Path) -> None:
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache").chmod(0o777)
    with pytest.raises(payload.PayloadError, match=r"writable by others \(mode 777\).*chmod go-w"):
        payload.materialize(release.manifest)


def test_a_planted_entry_link_is_never_loaded(release: FakeRelease, tmp_path: Path) -> None:
    planted = tmp_path / "elsewhere"
    for name, data in FILES.items():
        (planted / name).parent.mkdir(parents=True, exist_ok=True)
        (planted / name).write_bytes(data)  # the right sizes: a size check alone would trust it
    (planted / payload.COMPLETE).write_text("x\n")
    (tmp_path / "cache").mkdir(mode=0o700)
    (tmp_path / "cache" / release.data()["archive"]["sha256"]).symlink_to(planted)
    with pytest.raises(payload.PayloadError, match="is a symbolic link"):
        payload.materialize(release.manifest)


@pytest.mark.parametrize("planted", ["lock", "log"])
def test_lock_and_log_are_never_opened_through_a_link(release: FakeRelease, tmp_path: Path, planted: str) -> None:
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    victim = tmp_path / "victim"
    victim.write_text("keep me\n")
    name = f"{release.data()['archive']['sha256']}.lock" if planted == "lock" else "extractions.log"
    (cache / name).symlink_to(victim)
    with pytest.raises(payload.PayloadError, match="is a symbolic link"):
        payload.materialize(release.manifest)
    assert victim.read_text() == "keep me\n"


def test_a_relative_cache_variable_is_made_absolute_once(
    release: FakeRelease, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KT_KERNEL_CACHE_DIR", "relative-cache")
    first = payload.cache_root()
    assert first == tmp_path / "relative-cache"
    monkeypatch.chdir(tmp_path / "site")
    assert payload.cache_root() == first
    assert payload.materialize(release.manifest).parent == first


def test_a_file_larger_than_declared_is_refused_before_a_byte_is_written(
    release: FakeRelease, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    doc = release.data()
    doc["files"]["sgl_kernel/sm90/common_ops.abi3.so"]["size"] = 1000  # the archive holds 300 000 bytes
    release.manifest.write_text(json.dumps(doc))
    written: list[int] = []
    real = payload._Sink.put

    def counted(self: Any, chunk: bytes) -> None:
        written.append(len(chunk))
        real(self, chunk)

    monkeypatch.setattr(payload._Sink, "put", counted)
    with pytest.raises(payload.PayloadError, match=r"is 300000 bytes in the archive, the manifest says 1000"):
        payload.materialize(release.manifest)
    assert sum(written) <= 100_000  # only files before it (libkt_cuda.so, 100 000 bytes) were written
    assert not list((tmp_path / "cache").glob(".tmp-*"))


def test_a_full_disk_is_a_payload_error_with_the_need(
    release: FakeRelease, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    def full(self: Any, chunk: bytes) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(payload._Sink, "put", full)
    with pytest.raises(
        payload.PayloadError, match=r"cannot write the cache .*No space left on device \(it needs 0 MiB\)"
    ):
        payload.materialize(release.manifest)
    assert not list((tmp_path / "cache").glob(".tmp-*"))


def test_prune_removes_other_releases_but_never_one_in_use(release: FakeRelease, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    current = payload.materialize(release.manifest)
    old, busy = cache / ("a" * 64), cache / ("b" * 64)
    for entry in (old, busy):
        (entry / "lib").mkdir(parents=True)
        (entry / "lib" / "x.so").write_bytes(b"x" * 4096)
    (cache / "not-an-entry").mkdir()
    fd = os.open(cache / f"{'b' * 64}.use", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_SH)  # another process has `busy` loaded
    try:
        said = payload.prune({release.data()["archive"]["sha256"]}, cache)
    finally:
        os.close(fd)
    assert not old.exists()
    assert busy.exists()
    assert current.exists()
    assert (cache / "not-an-entry").exists()
    assert any(line.startswith(f"removed {old}") for line in said)
    assert f"kept {busy}: in use by another process" in said


def test_prune_cli_also_prunes_the_kernels_own_cuda_cache(
    release: FakeRelease, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("KT_KERNEL_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    stale = tmp_path / "xdg" / "kt-kernel" / "cuda" / ("c" * 64)
    (stale / "lib").mkdir(parents=True)
    (stale / "lib" / "libkt_cuda.so").write_bytes(b"x" * 100)
    stale.parent.chmod(0o700)
    assert payload.main(["prune", "--manifest", str(release.manifest)]) == 0
    out = capsys.readouterr().out
    assert f"removed {stale}" in out
    assert not stale.exists()
