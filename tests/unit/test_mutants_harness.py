"""The mutation harness replaces `finding` in every module that looks it up (nox -s mutants)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from base.paths import ROOT
from maint import mutants


def _imports_finding(path: Path) -> bool:
    tree = ast.parse(path.read_text())
    return any(
        isinstance(node, ast.ImportFrom) and any(a.name == "finding" and a.asname is None for a in node.names)
        for node in ast.walk(tree)
    )


def test_every_module_that_imports_finding_is_mutated() -> None:
    wanted = {
        ".".join(p.relative_to(ROOT).with_suffix("").parts)
        for p in (ROOT / "audits").rglob("*.py")
        if _imports_finding(p)
    }
    assert wanted, "no audit module imports finding: the test reads the wrong tree"
    assert wanted <= set(mutants.finders())


def test_mutant_turns_only_its_rule_into_info(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib

    monkeypatch.setenv(mutants.ENV, "elf.textrel")
    for name in mutants.finders():  # monkeypatch puts each module's real `finding` back afterwards
        module = importlib.import_module(name)
        monkeypatch.setattr(module, "finding", module.finding)
    mutants.pytest_configure(None)
    mod = importlib.import_module("audits.analyzers.elf_rules")
    gone = mod.finding("elf.textrel", "w.whl", "x.so", "msg", "fix")
    kept = mod.finding("elf.execstack", "w.whl", "x.so", "msg", "fix")
    assert (gone.rule, gone.severity) == ("mutant.deleted", "info")
    assert (kept.rule, kept.severity) == ("elf.execstack", "error")
