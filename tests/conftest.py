"""Shared helpers: paths, and importing kernel sources without building them."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent
KT_SRC = ROOT / "kernel" / "python" / "kt_kernel"


def load_source_module(name: str, path: Path) -> ModuleType:
    """Import one pure-Python file of kt_kernel without importing the package."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(autouse=True)
def _own_stage_records(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Stage records (base.stagecache) a test writes or reads live in its own folder, never build/'s:
    a test never reuses, or leaves behind, a developer's release stage."""
    from base import stagecache

    monkeypatch.setattr(stagecache, "CACHE", tmp_path_factory.mktemp("stage-cache"))


@pytest.fixture(autouse=True, scope="session")
def _own_audit_memo(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The audit's remembered schema checks (audits/readers/_memo.py) go to the session's folder, not
    the user's cache, for the tests and the audits they start."""
    import os

    os.environ.setdefault("KT_AUDIT_CACHE", str(tmp_path_factory.mktemp("kt-audit-cache")))
