"""Long work shows progress: a quiet subprocess gets a "still running" line every few seconds in a
log, a loop gets an n/N line per step, and stage times add up in a table."""

from __future__ import annotations

import io
import sys

from base import progress


def test_a_quiet_long_step_says_it_is_still_running() -> None:
    """Non-TTY output of a long step: a line at least every `every` seconds, never silence."""
    log = io.StringIO()
    proc = progress.run_quiet(
        [sys.executable, "-c", "import time; time.sleep(2.6); print('out')"], "demo", every=1.0, stream=log
    )
    assert proc.returncode == 0
    assert proc.stdout == "out\n"
    beats = [ln for ln in log.getvalue().splitlines() if ln.startswith("[demo ") and "still running" in ln]
    assert len(beats) >= 2, log.getvalue()
    steps = io.StringIO()
    assert list(progress.each(["a", "b"], "assemble", stream=steps)) == ["a", "b"]
    assert "1/2 a" in steps.getvalue()
    assert "2/2 b" in steps.getvalue()
    assert "total" in progress.table([("build_all", 70.0), ("audit", 17.2)])
