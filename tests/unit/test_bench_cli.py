"""`nox -s bench` passes its arguments to bench/__main__.py, which owns the parser and the dispatch: a
plain run measures the five parts a release engineer compares, in order; --only picks one, with its own
options; the parts a plain run leaves out are named."""

from __future__ import annotations

import pytest

from base import paths
from bench import __main__ as bench


def _modules(argv: list[str]) -> list[str]:
    return [cmd[2] for cmd in bench.commands(bench.parser().parse_args(argv))]


def test_a_plain_run_measures_each_part_beside_its_reference_in_order() -> None:
    assert _modules([]) == ["bench.audit", "bench.payload", "bench.kernel", "bench.sft", "bench.data_prep"]
    assert not {"bench.release", "bench.anchor", "bench.ab"} & set(_modules([]))


def test_only_runs_one_part_with_its_own_options() -> None:
    (payload,) = bench.commands(bench.parser().parse_args(["--only", "payload", "--assembly"]))
    assert payload[2:] == [
        "bench.payload",
        "--dist",
        str(paths.DIST),
        "--kernel",
        str(paths.KERNEL_OUT),
        "--rounds=3",
        "--assembly",
    ]
    (ab,) = bench.commands(bench.parser().parse_args(["--only", "ab", "--against", "HEAD~1", "--tokens", "1,8"]))
    assert ab[2:] == ["bench.ab", "--against=HEAD~1", "--tokens=1,8"]


def test_ab_and_its_revision_go_together(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["--only", "ab"], ["--against", "HEAD~1"]):
        with pytest.raises(SystemExit):
            bench.main(argv)
        assert "--only ab and --against REV go together" in capsys.readouterr().err
