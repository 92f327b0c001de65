"""The release workflow builds one abi3 kernel wheel for every Python of the matrix and hands every
kernel artifact to the assembly; its Python matrices come from carriers.toml's `pythons`."""

from __future__ import annotations

import re

from base.version import python_tag
from carriers import model
from tests.conftest import ROOT

WORKFLOW = (ROOT / ".github" / "workflows" / "release.yml").read_text()


def _job(name: str) -> str:
    m = re.search(rf"^  {name}:\n(.*?)(?=^  [a-z][\w-]*:\n|\Z)", WORKFLOW, re.MULTILINE | re.DOTALL)
    assert m is not None, name
    return m.group(1)


def test_the_carriers_job_downloads_every_kernel_artifact() -> None:
    kernel = _job("kernel")
    assert "matrix" not in kernel, "one abi3 wheel serves every Python: no per-Python kernel job"
    assert "build_wheels -- --python cp311" in kernel
    assert "name: kernel-abi3" in kernel
    carriers = _job("carriers")
    assert "pattern: kernel-*" in carriers
    assert "merge-multiple: true" in carriers
    assert "name: kernel-cp" not in carriers


def test_the_kernel_wheel_is_abi3_for_the_oldest_python_of_the_matrix() -> None:
    pyproject = (ROOT / "kernel" / "pyproject.toml").read_text()
    oldest = model.load().pythons[0]
    assert f'wheel.py-api = "{python_tag(oldest)}"' in pyproject
    assert f'requires-python = ">={oldest}"' in pyproject
    assert f"USE_SABI {oldest}" in (ROOT / "kernel" / "CMakeLists.txt").read_text()
    assert (
        f"Py_LIMITED_API 0x030{int(oldest.split('.')[1]):X}0000"
        in (ROOT / "kernel" / "src" / "core" / "module.cpp").read_text()
    )


def test_the_resolve_jobs_python_matrix_is_the_release_matrix() -> None:
    resolve = _job("resolve")
    pythons = re.search(r"python: \[([^\]]+)\]", resolve)
    assert pythons is not None
    assert [p.strip().strip('"') for p in pythons.group(1).split(",")] == list(model.load().pythons)
    assert "--profile resolve --python" in resolve
    for publish in ("publish-testpypi", "publish-pypi"):
        assert "needs: [audit, verify, resolve]" in _job(publish)
