"""The README keeps exactly two set-up-to-result commands, and CI runs the second."""

from __future__ import annotations

import re

from tests.conftest import ROOT


def _commands() -> list[str]:
    return re.findall(r"```sh\n(.+?)\n```", (ROOT / "README.md").read_text())


def test_readme_has_two_commands_main_job_then_tests() -> None:
    cmds = _commands()
    assert len(cmds) == 2, cmds
    assert "nox -s" in cmds[0]
    assert cmds[1].endswith("nox -s tests")


def test_ci_runs_the_readme_test_command_then_lint() -> None:
    script = [ln for ln in (ROOT / ".ci" / "run").read_text().strip().splitlines() if ln and not ln.startswith("#")]
    assert script[-2] == _commands()[1]
    assert script[-1] == ".venv/bin/nox -s lint"
