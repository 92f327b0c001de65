"""The audit as a tool: `pip install .` builds kt-audit (the audits package, its policies, the CPU
ladder the policy names and the report schema), and its console script works in a fresh venv whose
dependencies come from the hash-locked audit lock."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

from tests.conftest import ROOT
from tests.wheelkit import pure_wheel_members, write_wheel


def test_the_kt_audit_console_script_in_a_fresh_venv(tmp_path: Path) -> None:
    out = tmp_path / "wheels"
    subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(out), str(ROOT)],
        check=True,
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    (wheel,) = out.glob("kt_audit-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
    assert {
        "audits/policy/default.toml",
        "audits/policy/third-party.toml",
        "audits/policy/cpu_variants.json",
        "audits/policy/schema.json",
        "audits/schemas/audit-report.schema.json",
    } <= names
    assert not any(
        n.startswith(("tests/", "base/", "locks/", "verify/", "release/", "carriers/", "kernel/")) for n in names
    )
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    subprocess.run([*pip, "--require-hashes", "-r", str(ROOT / "lockfiles" / "audit.txt")], check=True)
    subprocess.run([*pip, "--no-deps", str(wheel)], check=True)
    script = str(venv / "bin" / "kt-audit")
    help_text = subprocess.run([script, "--help"], capture_output=True, text=True, check=True, cwd=tmp_path).stdout
    assert "usage: kt-audit" in help_text
    assert "wheel.unsafe-path:" in help_text
    assert str(venv) in help_text  # the policy file in use: the installed one
    target = write_wheel(
        tmp_path / "demo-1.0-py3-none-any.whl", {**pure_wheel_members("demo", "1.0"), "demo/libx.a": b"!<arch>\n"}
    )
    ours = subprocess.run([script, str(target)], capture_output=True, text=True, check=False, cwd=tmp_path)
    assert ours.returncode == 1
    assert "wheel.static-library" in ours.stdout
    theirs = subprocess.run(
        [script, "--policy", "third-party", str(target)], capture_output=True, text=True, check=False, cwd=tmp_path
    )
    assert theirs.returncode == 0, theirs.stdout + theirs.stderr
