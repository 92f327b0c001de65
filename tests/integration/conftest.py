"""Integration fixtures: the repaired kt-kernel wheel from dist/, installed by
hash into a fresh venv together with the locked CPU runtime."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from base import paths
from locks import indexes
from maint import ci_local
from tests.conftest import ROOT
from verify.venv import venv_env

SCRIPTS = Path(__file__).resolve().parent / "scripts"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/integration" in str(item.path):
            item.add_marker(pytest.mark.integration)


@dataclass(frozen=True)
class Venv:
    root: Path
    python: Path

    def run(
        self,
        *args: str,
        env: dict[str, str] | None = None,
        check: bool = True,
        prefix: tuple[str, ...] = (),
        timeout: float = 900,
    ) -> subprocess.CompletedProcess[str]:
        # as verify's venvs (bytecode written: uv installs none), without the caller's kt_kernel settings
        full_env = {k: v for k, v in venv_env().items() if not k.startswith("KT_KERNEL_")}
        full_env.update(env or {})
        proc = subprocess.run(
            [*prefix, str(self.python), *args],
            capture_output=True,
            text=True,
            env=full_env,
            cwd=self.root,
            check=False,
            timeout=timeout,
        )
        if check and proc.returncode != 0:
            pytest.fail(f"{args} exited {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")
        return proc

    def json(self, *args: str, env: dict[str, str] | None = None) -> Any:
        return json.loads(self.run(*args, env=env).stdout.strip().splitlines()[-1])


@pytest.fixture(scope="session")
def kt_wheel() -> Path:
    dist = Path(os.environ.get("KT_DIST", paths.KERNEL_OUT))
    wheels = sorted(dist.glob("kt_kernel-*manylinux*.whl"))
    if not wheels:
        if os.environ.get("KT_DIST"):  # the tests session built one and said where: its absence is a failure
            pytest.fail(f"no repaired kt_kernel wheel in {dist}, where the tests session built it")
        pytest.skip(f"no repaired kt_kernel wheel in {dist}; run `nox -s build_cuda` (the tests session does)")
    assert len(wheels) == 1, f"several kt_kernel wheels in {dist}: {wheels}"
    return wheels[0]


def _uv() -> str:
    uv = shutil.which("uv")
    if uv is None:
        pytest.fail("uv is not on PATH; run the tests through `nox -s tests` (lockfiles/test.txt pins uv)")
    return uv


def make_venv(where: Path, requirements: list[str], lock: str = "runtime-cpu") -> Venv:
    """A fresh venv with lockfiles/LOCK.txt and `requirements` installed, every hash checked."""
    uv = _uv()
    subprocess.run([uv, "venv", "--quiet", "--python", sys.executable, str(where)], check=True)
    req = indexes.for_install(ROOT / "lockfiles" / f"{lock}.txt", where / "requirements.txt", "\n".join(requirements))
    cmd = [
        uv,
        "pip",
        "install",
        "--quiet",
        "--python",
        str(where / "bin" / "python"),
        "--require-hashes",
        *indexes.UV_ARGS,
        "-r",
        str(req),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        pytest.fail(f"installing into {where} failed:\n{proc.stderr}")
    return Venv(where, where / "bin" / "python")


def wheel_requirement(wheel: Path) -> str:
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    return f"kt-kernel @ {wheel.resolve().as_uri()} --hash=sha256:{digest}"


@pytest.fixture(scope="session")
def fresh_venv(tmp_path_factory: pytest.TempPathFactory, kt_wheel: Path) -> Venv:
    return make_venv(tmp_path_factory.mktemp("fresh") / "venv", [wheel_requirement(kt_wheel)])


@pytest.fixture(scope="session")
def host_report(fresh_venv: Venv) -> dict[str, Any]:
    report: dict[str, Any] = fresh_venv.json(
        "-c", "import json, kt_kernel; print(json.dumps(kt_kernel.cpu_report().as_dict()))"
    )
    return report


@pytest.fixture
def index(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A real index server on 127.0.0.1 (pypiserver, pinned by lockfiles/test.txt): (url, its package dir)."""
    try:
        with ci_local.local_index(tmp_path) as url:
            yield url, tmp_path / "index"
    except ci_local.WorkflowError as exc:
        pytest.fail(str(exc))
