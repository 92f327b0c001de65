"""The import layers ([tool.importlinter] in pyproject.toml, run by `nox -s lint`): the repository
keeps them, and a planted upward import, an audit importing what it checks, a third-party import
in the stdlib-only bottom layer, an import circle inside a package or a stage reaching into another
stage's internals sideways breaks them, naming the import."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")
CONFIG = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """The root packages' Python files and the contract, nothing else."""
    if not LINT_IMPORTS.exists():
        pytest.fail(f"{LINT_IMPORTS} is missing: lockfiles/test.txt pins import-linter (nox -s tests installs it)")
    for package in CONFIG["root_packages"]:
        for src in (ROOT / package).rglob("*.py"):
            dest = tmp_path / src.relative_to(ROOT)
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, dest)
    shutil.copyfile(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def lint(tree: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"], cwd=tree, capture_output=True, text=True, check=False, timeout=300
    )


def plant(tree: Path, module: str, line: str) -> None:
    path = tree / module
    path.write_text(path.read_text() + f"\n{line}\n")


def test_the_repository_keeps_every_contract(tree: Path) -> None:
    proc = lint(tree)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"Contracts: {len(CONFIG['contracts'])} kept, 0 broken." in proc.stdout


@pytest.mark.parametrize(
    ("module", "line", "named"),
    [
        ("base/paths.py", "import verify.venv  # noqa", "base.paths -> verify.venv"),
        ("locks/read.py", "from carriers import model  # noqa", "locks.read -> carriers"),
        ("carriers/graph.py", "import release.publish  # noqa", "carriers.graph -> release.publish"),
        ("verify/serve.py", "import bench.kernel  # noqa", "verify.serve -> bench.kernel"),
        ("audits/core.py", "import carriers.wheelio  # noqa", "audits.core -> carriers.wheelio"),
        ("base/version.py", "import packaging.version  # noqa", "base.version -> packaging"),
        ("carriers/model.py", "import carriers.assemble  # noqa", ".model -> .assemble"),
        ("bundle/build.py", "from carriers.inputs import fetch  # noqa", "bundle.build -> carriers.inputs"),
        ("release/report.py", "import verify.venv  # noqa", "release.report -> verify.venv"),
    ],
)
def test_a_planted_import_breaks_a_contract(tree: Path, module: str, line: str, named: str) -> None:
    plant(tree, module, line)
    proc = lint(tree)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "BROKEN" in proc.stdout
    assert named in proc.stdout, proc.stdout
