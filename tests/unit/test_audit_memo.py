"""A schema check that passed is remembered by the hash of everything it reads, and only a pass:
the same bytes skip the check, other bytes, another validator version or a failure run it."""

from __future__ import annotations

from pathlib import Path

import pytest

from audits import PolicyError, load_policy
from audits.readers import _memo


def test_a_pass_is_remembered_and_nothing_else(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KT_AUDIT_CACHE", str(tmp_path))
    runs: list[bytes] = []

    def check(data: bytes, problem: str = "") -> str:
        runs.append(data)
        return problem

    assert _memo.checked("k", [b"a"], ("jsonschema",), lambda: check(b"a")) == ""
    assert _memo.checked("k", [b"a"], ("jsonschema",), lambda: check(b"a")) == ""
    assert runs == [b"a"]
    assert _memo.checked("k", [b"b"], ("jsonschema",), lambda: check(b"b")) == ""
    assert _memo.checked("other", [b"a"], ("jsonschema",), lambda: check(b"a")) == ""
    assert len(runs) == 3
    for _ in range(2):
        assert _memo.checked("k", [b"bad"], ("jsonschema",), lambda: check(b"bad", "wrong")) == "wrong"
    assert runs[-2:] == [b"bad", b"bad"]
    monkeypatch.setattr(_memo, "_version", lambda dist: "0.0-other")
    _memo.checked("k", [b"a"], ("jsonschema",), lambda: check(b"a"))
    assert len(runs) == 6


def test_an_empty_cache_setting_checks_every_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KT_AUDIT_CACHE", "")
    runs = []
    for _ in range(2):
        _memo.checked("k", [b"a"], ("jsonschema",), lambda: runs.append(1) or "")  # type: ignore[func-returns-value]
    assert len(runs) == 2


def test_a_remembered_policy_is_still_refused_once_edited(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KT_AUDIT_CACHE", str(tmp_path / "memo"))
    good = tmp_path / "p.toml"
    good.write_text('extends = "' + str(load_policy("third-party").source) + '"\n')
    load_policy(good)
    load_policy(good)  # remembered
    good.write_text(good.read_text() + "[size]\nwheel_budget_mib = 'big'\n")
    with pytest.raises(PolicyError, match="wheel_budget_mib"):
        load_policy(good)


def test_a_marker_in_a_folder_others_can_write_never_passes_a_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A shared KT_AUDIT_CACHE where another user planted the marker of a check: the check runs (and fails),
    and no marker is written there; in a folder of one's own the pass is remembered as before."""
    import os

    root = tmp_path / "shared"
    monkeypatch.setenv("KT_AUDIT_CACHE", str(root))
    runs: list[int] = []

    def failing() -> str:
        runs.append(1)
        return "wrong"

    assert _memo.checked("k", [b"a"], ("jsonschema",), lambda: "") == ""  # remembered: a marker now exists
    (marker,) = (root / "k").iterdir()
    assert _memo.checked("k", [b"a"], ("jsonschema",), failing) == ""  # our own marker: trusted
    (root / "k").chmod(0o777)
    assert _memo.checked("k", [b"a"], ("jsonschema",), failing) == "wrong"
    (root / "k").chmod(0o700)
    marker.chmod(0o666)
    assert _memo.checked("k", [b"a"], ("jsonschema",), failing) == "wrong"
    marker.unlink()
    marker.symlink_to(tmp_path)
    assert _memo.checked("k", [b"a"], ("jsonschema",), failing) == "wrong"
    assert len(runs) == 3
    monkeypatch.setattr(os, "geteuid", lambda: 4242)
    (root / "k" / marker.name).unlink()
    assert _memo.checked("k", [b"b"], ("jsonschema",), lambda: "") == ""
    assert list((root / "k").iterdir()) == []  # not ours: nothing written
