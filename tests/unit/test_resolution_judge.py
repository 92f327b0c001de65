"""verify.resolution.judge: what makes a normal resolution differ from the release, each case alone."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import distkit
from verify.resolution import judge

KT = "kt_kernel-0.6.1-cp311-abi3-manylinux_2_34_x86_64.whl"
INSTALL = (
    "kt-kernel==0.6.1 \\\n    --hash=sha256:" + "a" * 64 + "\nnumpy==2.3.5 \\\n    --hash=sha256:" + "b" * 64 + "\n"
)
VERSIONS = {"kt-kernel": "0.6.1"}
FILES = {KT}
GOOD = {
    "kt-kernel": ("0.6.1", f"http://127.0.0.1:8080/packages/{KT}#sha256={'a' * 64}"),
    "numpy": ("2.3.5", "https://files.pythonhosted.org/packages/x/numpy-2.3.5-cp311-cp311-manylinux_2_28_x86_64.whl"),
}


def _judge(got: dict[str, tuple[str, str]]) -> list[str]:
    return judge(got, INSTALL, "sft-cp311.txt", VERSIONS, FILES)[0]


def _drift(got: dict[str, tuple[str, str]]) -> list[str]:
    return judge(got, INSTALL, "sft-cp311.txt", VERSIONS, FILES)[1]


def test_the_same_versions_from_the_release_files_is_clean() -> None:
    assert _judge(GOOD) == []


def test_an_upstream_beside_the_forks_is_named() -> None:
    got = dict(GOOD, transformers=("5.19.0", "https://files.pythonhosted.org/transformers-5.19.0-py3-none-any.whl"))
    problems = _judge(got)
    assert "installs upstream transformers 5.19.0 beside (or instead of) its KT fork" in problems


def test_pypis_project_of_the_same_name_is_not_the_release() -> None:
    other = "https://files.pythonhosted.org/packages/5e/kt_kernel-0.6.1-cp311-cp311-manylinux_2_28_x86_64.whl"
    (problem,) = _judge(dict(GOOD, **{"kt-kernel": ("0.6.1", other)}))
    assert "not from the release's own files" in problem


def test_an_older_version_or_a_left_out_package_is_a_problem_a_newer_one_is_drift() -> None:
    assert _judge(dict(GOOD, numpy=("2.2.0", GOOD["numpy"][1]))) == [
        "numpy: resolves to 2.2.0, sft-cp311.txt pins 2.3.5"
    ]
    newer = dict(GOOD, numpy=("2.5.5", GOOD["numpy"][1]))
    assert _judge(newer) == []
    assert _drift(newer) == ["numpy: resolves to 2.5.5, sft-cp311.txt pins 2.3.5"]
    assert _judge(dict(GOOD, **{"kt-kernel": ("0.6.2", GOOD["kt-kernel"][1])}))  # a carrier never drifts
    assert _judge({"kt-kernel": GOOD["kt-kernel"]}) == [
        "numpy==2.3.5 is in sft-cp311.txt but normal resolution does not install it"
    ]


def test_an_sdist_only_package_on_a_python_not_run_here_is_not_verified_not_passed(tmp_path: Path) -> None:
    from verify.resolution import check

    install = {"install/serve-cp313.txt": "--only-binary :all:\n--no-binary outlines-core\n" + INSTALL}
    distkit.make_release(tmp_path, {"ktransformers-0.6.1-py3-none-any.whl": b"k"}, install, pythons=("3.13",))
    result = check(tmp_path, "serve", "3.13", ["ktransformers[serve]"], "http://127.0.0.1:9/unreachable/", None)
    assert "outlines-core has only an sdist for CPython 3.13" in result.not_verified
    assert result.as_dict()["ok"] is False
    assert result.problems == []


def test_a_resolution_from_the_published_index_that_could_not_run_is_no_pass(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """After publishing: a profile NOT VERIFIED from the index (no interpreter for an sdist-only package)
    makes the verification INCOMPLETE (exit 2), a problem makes it fail (exit 1), and only all checked is 0."""
    from verify.resolution import _published_status

    ok = {"profile": "sft", "python": "3.11", "problems": [], "not_verified": ""}
    unchecked = {**ok, "python": "3.12", "not_verified": "xformers has only an sdist for CPython 3.12"}
    wrong = {**ok, "problems": ["kt-kernel 0.6.1 comes from https://pypi.org/..., not from the release's own files"]}
    assert _published_status([ok]) == 0
    assert _published_status([ok, unchecked]) == 2
    assert "not verified from the index: sft on CPython 3.12" in capsys.readouterr().err
    assert _published_status([wrong, unchecked]) == 1
