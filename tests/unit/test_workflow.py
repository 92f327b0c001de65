"""The release workflow hands every Python's kernel wheel to the assembly (the cp312 wheel once
never left its job)."""

from __future__ import annotations

import re

from tests.conftest import ROOT

WORKFLOW = (ROOT / ".github" / "workflows" / "release.yml").read_text()


def _job(name: str) -> str:
    m = re.search(rf"^  {name}:\n(.*?)(?=^  [a-z][\w-]*:\n|\Z)", WORKFLOW, re.MULTILINE | re.DOTALL)
    assert m is not None, name
    return m.group(1)


def test_the_carriers_job_downloads_every_kernel_artifact() -> None:
    kernel = _job("kernel")
    pythons = re.search(r"python: \[([^\]]+)\]", kernel)
    assert pythons is not None
    assert [p.strip() for p in pythons.group(1).split(",")] == ["cp311", "cp312"]
    assert "name: kernel-${{ matrix.python }}" in kernel
    carriers = _job("carriers")
    assert "pattern: kernel-*" in carriers
    assert "merge-multiple: true" in carriers
    assert "name: kernel-cp" not in carriers
