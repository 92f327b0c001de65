"""pip and uv for a target Python and platform: the options that make them fetch or resolve wheels of
CPython 3.N on x86_64 manylinux, whatever Python runs them, and which wheels a Python installs. Every
stage that downloads or resolves for another Python (the assembly's inputs, normal resolution, the
other interpreters, offline bundles) takes them from here."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from packaging.utils import parse_wheel_filename

from base import progress
from base.version import python_tag

# Platforms an input wheel may carry (pip matches --platform exactly, so list them).
PLATFORMS = ("manylinux_2_34_x86_64", "manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")


# Every platform tag an x86_64 glibc 2.34 system installs, newest first. pip does not expand --platform
# itself: given manylinux_2_34 alone it skips a manylinux_2_27 wheel, and then backtracks to old releases
# (resolving sft for 3.12 fell back to torch 2.7.1). Resolution, bundles and installs for another Python
# take this chain; the release's own inputs keep PLATFORMS, the tags they are locked and built from.
def manylinux_chain(newest: int) -> tuple[str, ...]:
    """Every x86_64 manylinux tag a glibc 2.`newest` system installs, newest first."""
    return (
        *(f"manylinux_2_{minor}_x86_64" for minor in range(newest, 4, -1)),
        "manylinux2014_x86_64",
        "manylinux2010_x86_64",
        "manylinux1_x86_64",
    )


MANYLINUX_2_34 = manylinux_chain(34)


def download(
    requirements: Sequence[str],
    python: str,
    dest: Path,
    label: str,
    *,
    index_url: str = "https://pypi.org/simple",
    platforms: Sequence[str] = PLATFORMS,
) -> subprocess.CompletedProcess[str]:
    """`pip download --no-deps` of `requirements` (pip's arguments: `name==version`, or `--require-hashes -r
    FILE`) as CPython `python` wheels for `platforms` into `dest`, with "still running" lines meanwhile."""
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--isolated",
        "--no-deps",
        "--index-url",
        index_url,
        *target_args(python, platforms),
        "-d",
        str(dest),
        *requirements,
    ]
    return progress.run_quiet(cmd, label)


def target_args(python: str, platforms: Sequence[str] = PLATFORMS) -> list[str]:
    """pip's options for wheels of CPython `python` ("3.12") on `platforms`, whatever runs pip (pip
    matches --platform exactly: list every tag a target installs)."""
    abi = python_tag(python)
    return [
        "--only-binary",
        ":all:",
        "--python-version",
        python,
        "--implementation",
        "cp",
        "--abi",
        abi,
        *(f"--platform={p}" for p in platforms),
    ]


def python_abis(python: str) -> frozenset[tuple[str, str]]:
    """(interpreter, abi) pairs a CPython `python` ("3.12") installs: cp312-cp312, cp3N-abi3 for
    N <= 12, py3-none and the like (packaging's own tag order, the platform left aside)."""
    from packaging.tags import compatible_tags, cpython_tags

    version = tuple(int(x) for x in python.split("."))
    tags = [*cpython_tags(version, platforms=["any"]), *compatible_tags(version, python_tag(python))]
    return frozenset((t.interpreter, t.abi) for t in tags)


def serves(wheel_name: str, python: str) -> bool:
    """Whether a wheel (by its filename's tags) installs on CPython `python`."""
    pairs = python_abis(python)
    return any((t.interpreter, t.abi) in pairs for t in parse_wheel_filename(wheel_name)[3])
