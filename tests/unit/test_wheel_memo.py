"""carriers.wheelio's memo: a wheel of the same members is written from the memo, byte for byte what
encoding it gives; any other member, mode or epoch is encoded anew; a corrupted entry is never used;
the folder stays within its limit, least recently used first out."""

from __future__ import annotations

import hashlib
import io
import os
import time
from pathlib import Path

import pytest

from carriers import wheelio

MEMBERS = {
    "pkg/__init__.py": b"x = 1\n",
    "pkg/_lib.so": b"\x7fELF" + bytes(range(256)) * 64,
    "pkg-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: pkg\nVersion: 1.0\n\n",
    "pkg-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nRoot-Is-Purelib: false\nTag: py3-none-any\n",
}


def _encode(members: dict[str, bytes], executable: frozenset[str] = frozenset()) -> bytes:
    buf = io.BytesIO()
    wheelio.write_to(buf, members, executable)
    return buf.getvalue()


def test_the_same_members_come_from_the_memo_with_the_same_bytes(tmp_path: Path) -> None:
    plain = _encode(MEMBERS)
    with wheelio.memo(tmp_path) as m:
        assert m is not None
        assert _encode(MEMBERS) == plain  # encoded, and remembered
        assert (m.hits, m.misses) == (0, 1)
        assert _encode(dict(reversed(MEMBERS.items()))) == plain  # the order members come in is no part of it
        assert (m.hits, m.misses) == (1, 1)
    assert len(list(tmp_path.glob("*.whl"))) == 1
    assert wheelio.current_memo() is None  # only inside the block


@pytest.mark.parametrize(
    "change",
    [
        lambda ms, ex: ({**ms, "pkg/__init__.py": b"x = 2\n"}, ex),  # one byte of one member
        lambda ms, ex: ({**ms, "pkg/new.py": b""}, ex),  # one more member
        lambda ms, ex: (ms, frozenset({"pkg/_lib.so"})),  # a mode
    ],
)
def test_any_other_content_or_mode_is_encoded_anew(tmp_path: Path, change: object) -> None:
    members, executable = change(MEMBERS, frozenset())  # type: ignore[operator]
    plain = _encode(members, executable)  # outside any memo: what encoding gives
    with wheelio.memo(tmp_path) as m:
        assert m is not None
        _encode(MEMBERS)
        assert _encode(members, executable) == plain
        assert m.hits == 0


def test_the_epoch_is_part_of_the_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with wheelio.memo(tmp_path) as m:
        assert m is not None
        _encode(MEMBERS)
        monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
        dated = _encode(MEMBERS)
        assert m.hits == 0
    assert dated == _encode(MEMBERS)


def test_a_corrupted_entry_is_deleted_and_encoded_again(tmp_path: Path) -> None:
    plain = _encode(MEMBERS)
    with wheelio.memo(tmp_path):
        _encode(MEMBERS)
    (entry,) = tmp_path.glob("*.whl")
    data = entry.read_bytes()
    entry.write_bytes(data[:100] + bytes([data[100] ^ 0xFF]) + data[101:])  # one byte flipped
    with wheelio.memo(tmp_path) as m:
        assert m is not None
        assert _encode(MEMBERS) == plain
        assert (m.hits, m.misses) == (0, 1)
    (again,) = tmp_path.glob("*.whl")  # the bad copy is gone; a good one took its place
    assert hashlib.sha256(again.read_bytes()).hexdigest() == again.stem.split("-", 1)[1]
    assert again.read_bytes() == plain


def test_the_memo_is_pruned_least_recently_used_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def version(i: int) -> dict[str, bytes]:
        return {**MEMBERS, "pkg/__init__.py": f"x = {i}\n".encode()}

    size = len(_encode(MEMBERS))
    monkeypatch.setattr(wheelio, "MEMO_LIMIT", int(size * 2.5))  # room for two wheels
    with wheelio.memo(tmp_path) as m:
        assert m is not None
        for i in range(3):
            before = set(tmp_path.glob("*.whl"))
            _encode(version(i))
            for new in set(tmp_path.glob("*.whl")) - before:  # used longer ago the lower i is
                os.utime(new, (time.time() - 100 + 10 * i, time.time() - 100 + 10 * i))
        assert len(list(tmp_path.glob("*.whl"))) == 2
        hits = m.hits
        _encode(version(2))
        _encode(version(1))
        assert m.hits == hits + 2  # the two used last are kept
        _encode(version(0))
        assert m.hits == hits + 2  # the one used first was pruned


def test_concurrent_writers_of_one_path_never_share_a_temporary_file(tmp_path: Path) -> None:
    """Two assemblies (two test workers) may put the same memo entry at once: each writes a temporary file
    of its own, so neither fails and the entry is one writer's whole bytes, never a mix."""
    import threading

    target = tmp_path / "entry.whl"
    blobs = [bytes([i]) * (4 << 20) for i in range(8)]
    errors: list[BaseException] = []

    def write(data: bytes) -> None:
        try:
            for _ in range(5):
                wheelio.write_bytes(target, data)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(b,)) for b in blobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert target.read_bytes() in blobs
    assert [p.name for p in tmp_path.iterdir()] == ["entry.whl"]  # no temporary file left behind


def test_pruning_takes_only_the_memo_s_own_names(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A user's wheels beside the memo's entries (the folder was once X/../wheels, a folder nobody named) are
    never pruned, whatever their age or size; only KEY-SHA256.whl entries are."""
    users = {"torch-2.9.1-cp311-cp311-linux_x86_64.whl": 3 << 20, "mine.whl": 10, f"{'a' * 64}-backup.whl": 10}
    for name, size in users.items():
        (tmp_path / name).write_bytes(b"u" * size)
        os.utime(tmp_path / name, (1, 1))  # older than anything the memo writes
    monkeypatch.setattr(wheelio, "MEMO_LIMIT", 1)  # nothing of the memo's fits: all but the newest go
    with wheelio.memo(tmp_path):
        for i in range(3):
            _encode({**MEMBERS, "pkg/__init__.py": f"x = {i}\n".encode()})
    left = sorted(p.name for p in tmp_path.iterdir())
    assert [n for n in left if n in users] == sorted(users)
    assert len([n for n in left if wheelio.MEMO_NAME.fullmatch(n)]) == 1


def test_the_memo_lives_inside_the_inputs_cache_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """KT_RELEASE_CACHE=X puts the memo in X/wheel-memo, never in X/../wheels beside a folder of the user's."""
    from base import paths
    from carriers import assemble

    seen: list[Path | None] = []

    class Seen(Exception):
        pass

    def memo(root: Path | None) -> object:
        seen.append(root)
        raise Seen

    monkeypatch.setattr(wheelio, "memo", memo)
    cache = tmp_path / "inputs"
    with pytest.raises(Seen):
        assemble.build_set(None, tmp_path / "kernel.whl", tmp_path / "out", cache=cache)  # type: ignore[arg-type]
    assert seen == [cache / paths.WHEEL_MEMO]


def test_a_memo_folder_others_can_write_or_own_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another user's bytes are never taken for an encoded wheel: a memo folder writable by others, owned by
    another user, or a symbolic link is refused with the fix, and nothing in it is read or deleted."""
    from base.cachedir import CacheError

    root = tmp_path / "memo"
    with wheelio.memo(root):
        _encode(MEMBERS)
    (entry,) = root.glob("*.whl")
    root.chmod(0o777)
    with pytest.raises(CacheError, match=r"the wheel memo is writable by others .*chmod go-w"), wheelio.memo(root):
        _encode(MEMBERS)
    root.chmod(0o755)
    monkeypatch.setattr(os, "geteuid", lambda: 4242)
    with pytest.raises(CacheError, match=r"belongs to .* not to the running user uid 4242"), wheelio.memo(root):
        _encode(MEMBERS)
    monkeypatch.undo()
    link = tmp_path / "link"
    link.symlink_to(root)
    with pytest.raises(CacheError, match="is a symbolic link"), wheelio.memo(link):
        _encode(MEMBERS)
    assert entry.exists()


def test_the_old_memo_and_frames_beside_the_cache_are_retired_by_name_only(tmp_path: Path) -> None:
    """Entries earlier assemblies wrote in X/../wheels and X/../payload go (they live inside X now); a user's
    files there stay."""
    from carriers import assemble

    inputs = tmp_path / "inputs"
    inputs.mkdir()
    old_memo, old_frames = tmp_path / "wheels", tmp_path / "payload"
    old_memo.mkdir()
    old_frames.mkdir()
    ours = [
        old_memo / f"{'a' * 64}-{'b' * 64}.whl",
        old_frames / f"frame-{'c' * 64}.zst",
        old_frames / f"archive-{'d' * 64}.tar.zst",
    ]
    theirs = [old_memo / "torch-2.9.1-cp311-cp311-linux_x86_64.whl", old_frames / "archive-backup.tar.zst"]
    for p in [*ours, *theirs]:
        p.write_bytes(b"x")
    assemble._retire_beside(inputs)
    assert [p.exists() for p in ours] == [False, False, False]
    assert all(p.exists() for p in theirs)
