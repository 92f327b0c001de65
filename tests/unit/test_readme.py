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


def test_the_readme_is_a_front_door() -> None:
    """At most 150 lines of at most 120 characters; every source path it names exists, every link resolves.

    What the first command writes (`dist/`, `build/`) is not in a clean clone, so it is not looked for.
    """
    text = (ROOT / "README.md").read_text()
    lines = text.splitlines()
    assert len(lines) <= 150
    assert [ln for ln in lines if len(ln) > 120] == []
    for link in re.findall(r"\]\(([^)#]+)\)", text):
        assert (ROOT / link).exists(), link
    named = set(re.findall(r"`((?:[a-z_]+/)+[A-Za-z0-9_.-]*)`", text))
    outputs = ("dist/", "build/")
    sources = [p for p in sorted(named) if "NAME" not in p and not p.startswith(outputs)]
    missing = [p for p in sources if not (ROOT / p.rstrip("/")).exists()]
    assert missing == []


def test_every_doc_link_resolves() -> None:
    for doc in sorted((ROOT / "docs").glob("*.md")):
        for link in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", doc.read_text()):
            assert (doc.parent / link).exists(), f"{doc.name}: {link}"
