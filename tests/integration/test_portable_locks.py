"""The locks install on a machine without the local wheel directory: the +cpu torch comes from
the PyTorch CPU index the lock names, here stood in for by a real index server on 127.0.0.1
serving the same file (the lock's sha256 decides), with this machine's pip configuration (its
mirror, its extra indexes) switched off."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from locks import indexes
from tests.conftest import ROOT

pytestmark = pytest.mark.network


def _torch_pin(lock: Path) -> tuple[str, str]:
    m = re.search(r"^torch==(\S+) \\\n\s+--hash=sha256:([0-9a-f]{64})", lock.read_text(), re.MULTILINE)
    assert m is not None, f"{lock} pins no torch"
    return m.group(1), m.group(2)


@pytest.mark.parametrize("name", ["runtime-cpu", "sft-cpu", "test"])
def test_every_cpu_lock_names_the_pytorch_cpu_index_and_no_machine_path(name: str) -> None:
    text = (ROOT / "lockfiles" / f"{name}.txt").read_text()
    assert text.splitlines()[1] == f"--extra-index-url {indexes.PYTORCH_CPU_INDEX}"
    assert "/opt/" not in text
    assert "file://" not in text


def test_the_install_source_follows_the_variables(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lock = ROOT / "lockfiles" / "runtime-cpu.txt"
    for var in (indexes.MIRROR_ENV, "PIP_FIND_LINKS", indexes.TORCH_INDEX_ENV):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)  # this machine's pip.conf names a mirror
    assert indexes.INDEX_LINE in indexes.for_install(lock, tmp_path / "a.txt").read_text()
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    monkeypatch.setenv(indexes.MIRROR_ENV, str(mirror))
    # a mirror without the pinned file is not used
    assert indexes.INDEX_LINE in indexes.for_install(lock, tmp_path / "b.txt").read_text()
    version, _ = _torch_pin(lock)
    (mirror / f"torch-{version}-cp311-cp311-manylinux_2_28_x86_64.whl").write_bytes(b"")
    assert f"--find-links {mirror}" in indexes.for_install(lock, tmp_path / "c.txt").read_text()
    monkeypatch.setenv(indexes.TORCH_INDEX_ENV, "http://127.0.0.1:1/simple/")
    text = indexes.for_install(lock, tmp_path / "d.txt", "extra-req==1").read_text()
    assert "--extra-index-url http://127.0.0.1:1/simple/" in text
    assert text.rstrip().endswith("extra-req==1")


def test_runtime_lock_installs_without_the_local_directory(index: tuple[str, Path], tmp_path: Path) -> None:
    url, packages = index
    lock = ROOT / "lockfiles" / "runtime-cpu.txt"
    version, digest = _torch_pin(lock)
    local = indexes.mirror()
    wheel = next(iter(sorted(local.glob(f"torch-{version}-*.whl")))) if local is not None else None
    if wheel is None:
        pytest.fail(f"torch {version} is needed to stand in for the PyTorch CPU index: set {indexes.MIRROR_ENV}")
    (packages / wheel.name).symlink_to(wheel)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "KT_", "UV_"))}
    env |= {
        "PIP_CONFIG_FILE": os.devnull,
        indexes.TORCH_INDEX_ENV: url + "simple/",
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    }
    if os.environ.get("PIP_CERT"):
        env["PIP_CERT"] = os.environ["PIP_CERT"]
    req = tmp_path / "req.txt"
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from pathlib import Path; from locks import indexes; "
            "indexes.for_install(Path(sys.argv[1]), Path(sys.argv[2]))",
            str(lock),
            str(req),
        ],
        env=env,
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    )
    assert f"--extra-index-url {url}simple/" in req.read_text()
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = str(venv / "bin" / "python")
    proc = subprocess.run(
        [
            py,
            "-m",
            "pip",
            "install",
            "-q",
            *indexes.LOCKED_INSTALL,
            "-r",
            str(req),
        ],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = subprocess.run(
        [py, "-c", "import json, torch; print(json.dumps([torch.__version__, torch.__file__]))"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    got, where = json.loads(out)
    assert got == version
    assert str(venv) in where
    assert digest in lock.read_text()


@pytest.mark.parametrize("name", ["lf-standard", "lf-kt"])
def test_gpu_profile_locks_resolve_under_pips_require_hashes(name: str) -> None:
    """pip, what a user runs, accepts each GPU-sized lock whole (verify_install installs them with uv,
    which is laxer): every requirement pinned with == and hashed, extras included. lf-kt's third-party
    closure contains serve's."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull
    cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--disable-pip-version-check"]
    cmd += ["-q", *indexes.LOCKED_INSTALL, "-r", str(ROOT / "lockfiles" / f"{name}.txt")]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
