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


def test_the_verify_jobs_are_the_release_matrix_each_on_its_own_interpreter() -> None:
    """One verify job per Python of carriers.toml's `pythons`: setup-python installs that Python beside the 3.11
    nox runs on (the last listed is the default), verify_install runs that Python's runs, and the job uploads
    its own evidence file; the verdict and publish jobs take every job's evidence, merged."""
    verify = _job("verify")
    pythons = re.search(r"python: \[([^\]]+)\]", verify)
    assert pythons is not None
    assert [p.strip().strip('"') for p in pythons.group(1).split(",")] == list(model.load().pythons)
    assert "python-version: |\n            ${{ matrix.python }}\n            3.11\n" in verify
    assert 'nox -s verify_install -- --python "${MATRIX_PYTHON}"' in verify
    assert "name: evidence-verify-${{ matrix.python }}" in verify
    assert "path: build/verify-cp*.json" in verify
    assert "resolve:" not in WORKFLOW.split("jobs:", 1)[1].split("verify:", 1)[0]  # no simulating resolve job
    for job in ("verdict", "publish-testpypi", "publish-pypi"):
        body = _job(job)
        assert "pattern: evidence-verify-*" in body
        assert "merge-multiple: true" in body
        assert "nox -s release_report" in body
    assert "needs: [audit, verify]" in _job("verdict")
    for publish in ("publish-testpypi", "publish-pypi"):
        assert "needs: [audit, verify, verdict]" in _job(publish)
