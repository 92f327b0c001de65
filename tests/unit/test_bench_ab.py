"""bench/ab.py's inputs: a revision that names no commit, a wheel without the asked variant and a count
below one are usage errors that say what was given and what there is."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest

from bench.ab import commit_of, library_in, main


def test_a_revision_that_is_no_commit_is_named() -> None:
    with pytest.raises(SystemExit, match="--against no-such-rev-3f9: not a commit of this repository"):
        commit_of("no-such-rev-3f9")


def test_head_is_a_commit() -> None:
    assert len(commit_of("HEAD")) == 40


def wheel_with(tmp_path: Path, variants: dict[str, str]) -> Path:
    wheel = tmp_path / "kt_kernel-0-cp311-abi3-linux_x86_64.whl"
    manifest = {"variants": {name: {"file": file, "features": []} for name, file in variants.items()}}
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("kt_kernel/_build.json", json.dumps(manifest))
        for file in variants.values():
            zf.writestr(file, b"\x7fELF")
    return wheel


def test_the_variant_library_is_where_the_wheels_manifest_says(tmp_path: Path) -> None:
    wheel = wheel_with(tmp_path, {"avx2": "kt_kernel/cpu/libkt_cpu_avx2.so"})
    lib = library_in(wheel, "avx2", tmp_path / "unpacked")
    assert lib == tmp_path / "unpacked" / "kt_kernel" / "cpu" / "libkt_cpu_avx2.so"
    assert lib.read_bytes() == b"\x7fELF"


def test_a_wheel_without_the_variant_says_which_it_has(tmp_path: Path) -> None:
    wheel = wheel_with(tmp_path, {"avx2": "kt_kernel/cpu/libkt_cpu_avx2.so"})
    with pytest.raises(SystemExit, match="holds no amx variant \\(it has avx2\\)"):
        library_in(wheel, "amx", tmp_path / "unpacked")


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [("--tokens", "0,8", "every count must be at least 1"), ("--threads", "two", "give comma-separated whole numbers")],
)
def test_a_count_that_is_no_whole_number_of_at_least_one_is_a_usage_error(
    option: str, value: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # Refused by argparse before anything loads or builds (it was a ZeroDivisionError later for 0 tokens).
    with pytest.raises(SystemExit) as exc:
        main(["--against", "HEAD", option, value])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_an_unpacking_left_half_done_is_not_taken_for_the_wheel(tmp_path: Path) -> None:
    wheel = wheel_with(tmp_path, {"avx2": "kt_kernel/cpu/libkt_cpu_avx2.so"})
    (tmp_path / "unpacked.partial" / "kt_kernel").mkdir(parents=True)  # an earlier run stopped mid-way
    lib = library_in(wheel, "avx2", tmp_path / "unpacked")
    assert lib.read_bytes() == b"\x7fELF"
    assert not (tmp_path / "unpacked.partial").exists()
