"""bench/anchor.py's inputs: a --kt-python that is no executable, a thread count below one, and a KT
worker that imported another kt-kernel than the anchor's are refused with what was given."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.anchor import check_theirs, main


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--threads", "0,2"], "every count must be at least 1"),
        (["--kt-python", "/no/such/python-3f9"], "--kt-python /no/such/python-3f9: no such executable"),
    ],
)
def test_usage_errors_are_refused_before_anything_loads(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(args)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("version", ["0.6.1", None])
def test_a_kt_worker_with_another_version_stops_the_run(version: str | None) -> None:
    # 0.6.1: what KT's kt_kernel reports when its dist-info is missing (a copied package, not installed).
    with pytest.raises(SystemExit, match=f"py3 imports kt-kernel {version}, not 0.7.2"):
        check_theirs({"version": version, "variant": "avx2"}, Path("py3"))


def test_the_anchors_version_passes() -> None:
    check_theirs({"version": "0.7.2"}, Path("py3"))
