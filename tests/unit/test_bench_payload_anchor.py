"""bench/payload_anchor.py, the payload beside KTransformers' carriers: what it downloads is checked by
sha256 and an unreachable index is said, never measured; a child's peak RSS is its own, not this
process's; a busy machine, a page cache it could not evict and a missed bar are said in the table."""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path
from typing import Any

import pytest

from bench import payload_anchor
from bench.errors import BenchError


def _toml(tmp_path: Path, url: str, sha: str) -> Path:
    p = tmp_path / "anchor.toml"
    p.write_text(f'[[wheel]]\nfile = "w-1-py3-none-any.whl"\nurl = "{url}"\nsha256 = "{sha}"\n')
    return p


def test_a_download_with_another_sha256_is_refused_and_not_kept(tmp_path: Path, monkeypatch: Any) -> None:
    src = tmp_path / "src.whl"
    src.write_bytes(b"not the wheel")
    monkeypatch.setattr(payload_anchor, "WHEELS", _toml(tmp_path, src.as_uri(), "0" * 64))
    monkeypatch.setattr(payload_anchor, "CACHE", tmp_path / "cache")
    with pytest.raises(BenchError, match="the download's sha256 is not 0000"):
        payload_anchor.fetch_kt()
    assert list((tmp_path / "cache").iterdir()) == []


def test_the_right_bytes_are_cached_and_not_downloaded_again(tmp_path: Path, monkeypatch: Any) -> None:
    src = tmp_path / "src.whl"
    src.write_bytes(b"the wheel")
    sha = hashlib.sha256(b"the wheel").hexdigest()
    monkeypatch.setattr(payload_anchor, "WHEELS", _toml(tmp_path, src.as_uri(), sha))
    monkeypatch.setattr(payload_anchor, "CACHE", tmp_path / "cache")
    (got,) = payload_anchor.fetch_kt()
    assert got.read_bytes() == b"the wheel"
    src.unlink()  # a second run reads the cache, it does not reach for the URL
    assert payload_anchor.fetch_kt() == [got]


def test_an_unreachable_index_is_not_measured_and_says_so(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setattr(payload_anchor, "WHEELS", _toml(tmp_path, (tmp_path / "gone.whl").as_uri(), "0" * 64))
    monkeypatch.setattr(payload_anchor, "CACHE", tmp_path / "cache")
    with pytest.raises(payload_anchor.Unreachable) as exc:
        payload_anchor.fetch_kt()
    text = "\n".join(payload_anchor.not_measured(str(exc.value)))
    assert "NOT MEASURED" in text
    assert "gone.whl" in text
    assert "|" not in text  # no table, no number


def test_a_childs_peak_rss_is_its_own_not_this_processes() -> None:
    ballast = bytearray(400 << 20)  # this process holds 400 MiB: a wait4 here would report at least that
    ballast[::4096] = b"x" * len(ballast[::4096])
    got = payload_anchor.measured([sys.executable, "-S", "-c", "print('hi')"], {})
    assert got["out"] == "hi"
    assert got["rss_mib"] < 100, got
    assert got["s"] > 0
    assert got["cpu_s"] >= 0
    del ballast


def test_a_failing_command_is_an_error_with_its_stderr() -> None:
    with pytest.raises(BenchError, match=r"exit 3\)?:?\s+went wrong"):
        payload_anchor.measured(
            [sys.executable, "-c", "import sys; print('went wrong', file=sys.stderr); sys.exit(3)"], {}
        )


def _row(s: float, others: float = 0.0) -> dict[str, Any]:
    return {"s": s, "cpu_s": s, "sys_s": s / 4, "rss_mib": 50.0, "others_cpus": others, "out": ""}


def _res(
    ours: float, kt: float, floor: float, others: float = 0.0, eviction: list[str] | None = None
) -> dict[str, Any]:
    return {
        "rows": {
            "ours cold": [_row(ours, others)] * 3,
            "ours warm": [_row(0.07)] * 3,
            "kt cold": [_row(kt)] * 3,
            "kt warm": [_row(0.9)] * 3,
            "floor": [_row(floor)] * 3,
        },
        "eviction": eviction or [],
        "floor": "zstd -d",
        "ours_stream_mib": 169.4,
        "kt_parts_mib": 337.3,
        "extracted_mib": 1147.7,
        "kt_parts": 5,
        "host": "a host",
        "date": "2026-12-06",
        "python": "3.11.7",
    }


def test_the_table_says_whether_each_bar_is_met() -> None:
    met = "\n".join(payload_anchor.table(_res(1.2, 13.0, 1.0)))
    assert "0.092x (bar <= 0.15x: met)" in met
    assert "1.200x (bar <= 1.3x: met)" in met
    assert "a quiet machine" in met
    assert "every part evicted" in met
    missed = "\n".join(payload_anchor.table(_res(2.0, 13.0, 1.0)))
    assert "0.154x (bar <= 0.15x: NOT MET)" in missed
    assert "2.000x (bar <= 1.3x: NOT MET)" in missed


def test_a_busy_machine_and_a_cache_that_kept_the_parts_are_said() -> None:
    text = "\n".join(payload_anchor.table(_res(1.2, 13.0, 1.0, others=0.9, eviction=["169 MiB stayed"])))
    assert "a BUSY machine" in text
    assert "NOT evicted: 169 MiB stayed" in text


def test_fewer_than_three_rounds_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    from bench.payload import main

    with pytest.raises(SystemExit) as exc:
        main(["--rounds", "2"])
    assert exc.value.code == 2
    assert "--rounds 2: the comparison needs at least 3" in capsys.readouterr().err
