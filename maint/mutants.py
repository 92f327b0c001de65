"""Mutation check for the audit rules: delete each rule in turn and show the suite notices.

    python -m maint.mutants [--rule ID ...] [--json FILE]     (nox -s mutants)

A mutant turns every finding of one rule id into an "info" finding of the id "mutant.deleted"
(the rule still runs, its verdict is gone). For each rule the test files that name it are run
with that mutant in place (this module is also the pytest plugin that installs it); the mutant
is *killed* when they fail. A survivor is a rule no test would miss. Zero survivors is the goal.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from base import paths
from base.paths import ROOT

ENV = "KT_AUDIT_MUTANT"


def finders() -> list[str]:
    """Every module of the audit that imported `finding` by name (each analyzer, and audits.core): a
    module this list missed would keep its rules' verdicts under a mutant, and they would survive
    without any test having been asked (as dist_rules', install_rules', license_rules' and sbom_rules'
    once did, read from a hand-written list)."""
    import importlib
    import pkgutil

    import audits.analyzers

    names = [f"audits.analyzers.{m.name}" for m in pkgutil.iter_modules(audits.analyzers.__path__)]
    return [n for n in (*names, "audits.core") if hasattr(importlib.import_module(n), "finding")]


def pytest_configure(config: Any) -> None:
    """pytest plugin (-p maint.mutants): delete the rule named by $KT_AUDIT_MUTANT."""
    rule = os.environ.get(ENV)
    if not rule:
        return
    import importlib

    from audits.analyzers import _common

    real = _common.finding

    def mutant(r: str, *args: Any, **kwargs: Any) -> Any:
        found = real(r, *args, **kwargs)
        return dataclasses.replace(found, rule="mutant.deleted", severity="info") if r == rule else found

    # Each module imported `finding` by name: replace it where it is looked up.
    for name in finders():
        setattr(importlib.import_module(name), "finding", mutant)  # noqa: B010 - a dynamic module


def _tests_naming(rule: str) -> list[Path]:
    return sorted(p for p in (ROOT / "tests").rglob("test_*.py") if f'"{rule}"' in p.read_text())


def main(argv: list[str] | None = None) -> int:
    """Delete each rule in turn and run the tests that name it; 1 if any rule survives."""
    p = argparse.ArgumentParser(prog="nox -s mutants --", description=__doc__.splitlines()[0])
    p.add_argument("--rule", action="append", default=[], help="only these rule ids")
    p.add_argument("--json", type=Path, default=paths.MUTANTS_JSON)
    args = p.parse_args(argv)
    from audits.model import RULES

    rules = args.rule or sorted(RULES)
    involved = sorted({f for r in rules for f in _tests_naming(r)})
    print(f"baseline: {len(involved)} test files without a mutant ...", flush=True)
    base = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *map(str, involved)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    if base.returncode != 0:
        print(f"error: the tests fail without any mutant; fix them first:\n{base.stdout[-3000:]}", file=sys.stderr)
        return 2
    results: dict[str, Any] = {}
    for i, rule in enumerate(rules, 1):
        files = _tests_naming(rule)
        t0 = time.perf_counter()
        if not files:
            results[rule] = {"killed": False, "tests": [], "why": "no test names this rule"}
        else:
            proc = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "pytest",
                    "-q",
                    "-x",
                    "-p",
                    "maint.mutants",
                    "-p",
                    "no:cacheprovider",
                    *map(str, files),
                ],
                env={**os.environ, ENV: rule},
                cwd=ROOT,
                capture_output=True,
                text=True,
                check=False,
            )
            # exit 1: tests failed (the mutant was noticed); anything else is the harness, not a kill
            if proc.returncode not in (0, 1):
                print(f"error: pytest exited {proc.returncode} for {rule}:\n{proc.stdout[-2000:]}", file=sys.stderr)
                return 2
            results[rule] = {"killed": proc.returncode == 1, "tests": [str(f.relative_to(ROOT)) for f in files]}
        verdict = "killed" if results[rule]["killed"] else "SURVIVED"
        print(f"[{i}/{len(rules)}] {rule}: {verdict} ({time.perf_counter() - t0:.0f}s)", flush=True)
    survivors = sorted(r for r, v in results.items() if not v["killed"])
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(
        json.dumps(
            {"killed": len(rules) - len(survivors), "total": len(rules), "survivors": survivors, "rules": results},
            indent=2,
        )
        + "\n"
    )
    print(f"audit-rule mutants killed: {len(rules) - len(survivors)}/{len(rules)}; survivors: {survivors or 'none'}")
    return 1 if survivors else 0


if __name__ == "__main__":
    raise SystemExit(main())
