"""The release report page rendered by a real browser (Debian's chromium, headless): the DOM has
every section with content in it, and a screenshot is left in build/ for CI to keep."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

from base import distdir
from release import report as release_report
from tests.conftest import ROOT
from tests.unit.test_release_report import KT, TF, _candidate, _hermetic  # noqa: F401 (_hermetic: autouse fixture)

SECTIONS = ("verdict", "wheels", "findings", "cpu-matrix", "cuda-matrix", "sizes", "artifacts")


def _chromium() -> str:
    found = shutil.which("chromium")
    if found is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is missing: .ci/run installs Debian's chromium")
        pytest.skip("chromium not installed (Debian package chromium; .ci/run installs it)")
    return found


class _Dom(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.ids: dict[str, str] = {}
        self.cells: list[str] = []
        self._in_td = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for k, v in attrs:
            if k == "id" and v:
                self.ids[v] = tag
        self._in_td = tag == "td"

    def handle_data(self, data: str) -> None:
        if self._in_td and data.strip():
            self.cells.append(data.strip())


def _audit(dist: Path) -> dict[str, object]:
    digests = {w.filename: w.sha256 for w in distdir.read_manifest(dist / distdir.MANIFEST).wheels}
    return {
        "passed": False,
        "elapsed_s": 2.0,
        "wheels": [
            {"filename": KT, "errors": 1, "sha256": digests[KT]},  # the manifest's: this build's audit
            {"filename": TF, "errors": 0, "sha256": digests[TF]},
        ],
        "findings": [
            {
                "rule": "isa.forbidden-feature",
                "severity": "error",
                "wheel": KT,
                "member": "kt_kernel/cpu/libkt_cpu_avx2.so",
                "message": "avx2 uses vpdpbusd",
                "fix": "x",
            },
            {
                "rule": "payload.sass-coverage",
                "severity": "info",
                "wheel": KT,
                "member": "m",
                "message": "by policy",
                "fix": "none needed",
            },
        ],
        "cpu_variants": {
            KT: {
                "avx2": {
                    "marker": "AVX2",
                    "marker_present": True,
                    "features_used": {"AVX2": 5},
                    "forbidden": ["vpdpbusd"],
                }
            }
        },
        "payload": {"coverage": {"kt_kernel/cuda/lib/libkt_cuda.so": {"8.0": "sm_80 SASS", "9.0": None}}},
    }


def test_the_report_page_renders_with_every_section(tmp_path: Path) -> None:
    chromium = _chromium()
    dist = _candidate(tmp_path, audit_passed=True)
    (dist / "audit-report.json").write_text(json.dumps(_audit(dist)))
    baseline = tmp_path / "old-manifest.json"
    old = json.loads((dist / "manifest.json").read_text())
    old["wheels"][0]["size"] = old["wheels"][0]["size"] // 2
    baseline.write_text(json.dumps(old))
    assert (
        release_report.main(
            ["--dist", str(dist), "--evidence", str(tmp_path / "no-evidence"), "--baseline", str(baseline)]
        )
        == 1
    )
    page = (dist / "release-report.html").resolve()
    flags = ["--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--window-size=1300,1800"]
    dom = subprocess.run(
        [chromium, *flags, "--dump-dom", page.as_uri()], capture_output=True, text=True, check=True, timeout=120
    ).stdout
    parsed = _Dom()
    parsed.feed(dom)
    assert [s for s in SECTIONS if s not in parsed.ids] == []
    assert "FAILED" in dom  # the verdict, in colour (class fail)
    assert 'class="badge fail"' in dom
    assert "avx2 uses vpdpbusd" in parsed.cells  # an error finding listed with its message
    assert "+100.0%" in parsed.cells  # the size change against the baseline
    assert "sm_80 SASS" in parsed.cells
    shot = ROOT / "build" / "report-screenshot.png"
    shot.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [chromium, *flags, f"--screenshot={shot}", page.as_uri()], capture_output=True, check=True, timeout=120
    )
    assert shot.stat().st_size > 10_000
