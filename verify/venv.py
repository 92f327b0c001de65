"""Fresh venvs and what runs in them: the release's carrier files by hash, pip and uv as a user on a
clean machine runs them, the probes of verify/probes/ run by path. The one error root of the
verify stages is `VerifyError` (exit 1)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from packaging.utils import parse_wheel_filename

from base import distdir, progress
from base.errors import StageError
from base.interpreters import Interpreter
from locks import indexes

PROBES = Path(__file__).resolve().parent / "probes"


class VerifyError(StageError):
    """An install verification failed; the message says what and where (the verify stages' root)."""


def probe(name: str) -> str:
    """verify/probes/NAME.py, run by path inside a venv."""
    return str(PROBES / f"{name}.py")


def carrier_lines(
    dist: Path, names: list[str], extras: dict[str, str] | None = None, python: str | None = None
) -> list[str]:
    """`name[extra] @ file://... --hash=sha256:...` for each carrier's wheel for CPython `python` (default:
    this interpreter's; dist/ opened and re-hashed once)."""
    extras = extras or {}
    lines = []
    python = python or f"{sys.version_info.major}.{sys.version_info.minor}"
    for w in sorted(distdir.open_release(dist).wheels_for(python), key=lambda w: w.filename):
        name = parse_wheel_filename(w.filename)[0]
        if name in names:
            extra = f"[{extras[name]}]" if name in extras else ""
            lines.append(f"{name}{extra} @ {(dist / w.filename).resolve().as_uri()} --hash=sha256:{w.sha256}")
    return lines


def published(dist: Path, profile: str, python: str | None = None) -> tuple[Path, str]:
    """The pip install file users get for `profile` on CPython `python` (default: this interpreter's;
    dist/install/, as manifest.json lists it, not the PEP 751 lock beside it) and its sha256, checked
    against SHA256SUMS: what the profile installs, as published."""
    python = python or f"{sys.version_info.major}.{sys.version_info.minor}"
    return distdir.open_release(dist).install_file(profile, python)


def install_published(
    venv: Path,
    dist: Path,
    profile: str,
    *,
    python: str | None = None,
    index_url: str | None = None,
    behind: tuple[str, ...] = (),
) -> tuple[dict[str, str], dict[str, str]]:
    """The published install file of `profile` for CPython `python` (default: this interpreter's),
    installed by hash into `venv` exactly as a user would (`pip install --require-hashes -r FILE`): the
    release's wheels found beside it, or, with `index_url`, taken from the index the release was published
    to (the indexes `behind` it merged in). (What uv installed, {"file", "sha256"} of the file exercised.)"""
    path, digest = published(dist, profile, python)
    where = f" from {index_url}" if index_url else ""
    print(f"{profile}: installing the published {path.name}{where} into {venv} (several GB) ...", flush=True)
    if index_url is None:
        out = uv_install(venv, path, f"the published {path.name}", "--find-links", str(dist))
    else:
        locked = (*indexes.locked_install(index_url, behind), *indexes.UV_ARGS)
        out = uv_install(venv, path, f"the published {path.name}{where}", locked=locked)
    return uv_installed(out), {"file": str(path.relative_to(dist)), "sha256": digest}  # as manifest.json names it


def venv_env() -> dict[str, str]:
    """The environment of the processes run in a fresh venv: this one's, with Python writing bytecode as
    it does by default (PYTHONDONTWRITEBYTECODE dropped), so that each of a venv's later probes imports
    what its first compiled: uv installs no bytecode, and torch, transformers and LlamaFactory compiled
    again by every probe cost seconds each (the lf-kt profile 63 -> 46 s). The venvs are this
    verification's own and thrown away after it."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def clean_env() -> dict[str, str]:
    """The venv environment without pip/uv settings and colour forcing (a user's clean shell)."""
    return {k: v for k, v in venv_env().items() if not k.startswith(("PIP_", "UV_", "FORCE_COLOR", "CLICOLOR"))}


def pip(venv: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """pip as a user on a clean machine would run it: no config files, no PIP_* settings
    (this machine's pip.conf adds local indexes and caps torch), only what we pass."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull
    base = [str(venv / "bin" / "python"), "-m", "pip", "--disable-pip-version-check"]
    if os.environ.get("PIP_CERT"):
        base += ["--cert", os.environ["PIP_CERT"]]
    return progress.run_quiet([*base, *args], f"verify {venv.parent.name}/{venv.name}: pip {args[0]}", env=env)


def install(venv: Path, req: Path) -> None:
    """`req` is a lock (plus carrier lines) adapted to this machine by locks.indexes.for_install."""
    # --no-compile: pip byte-compiles every module it writes (20 of 41 s for the CPU lock here); Python
    # compiles what is imported anyway, and the venv's processes keep it (venv_env), and a module that
    # does not compile is only ever a warning from pip
    proc = pip(venv, "install", *indexes.LOCKED_INSTALL, "--no-compile", "-r", str(req))
    if proc.returncode != 0:
        raise VerifyError(f"pip install -r {req} failed:\n{proc.stderr[-3000:]}")


def pip_check(venv: Path) -> None:
    """`pip check` in the venv, or VerifyError with its output."""
    proc = pip(venv, "check")
    if proc.returncode != 0:
        raise VerifyError(f"pip check failed in {venv}:\n{proc.stdout}{proc.stderr}")


def uv_install(venv: Path, req: Path, what: str, *extra: str, locked: tuple[str, ...] = indexes.LOCKED_INSTALL) -> str:
    """uv pip install --require-hashes of `req` into `venv` (the GPU-sized profiles: uv links files from
    its cache, where pip would copy several GB); uv's output, whose ` + name==version` lines say
    what it installed."""
    uv = shutil.which("uv")
    if uv is None:
        raise VerifyError("uv is not on PATH; install lockfiles/verify.txt (nox -s verify_install does)")
    # --color never: the installed names are read from uv's output, and CI sets FORCE_COLOR (release.yml
    # env), which colours every line (a local run of the workflow found the verify job failing on that)
    cmd = [uv, "pip", "install", "--color", "never", "--python", str(venv / "bin" / "python")]
    proc = progress.run_quiet(
        [*cmd, *locked, *extra, "-r", str(req)],
        f"verify {venv.parent.name}/{venv.name}: uv pip install",
        env=clean_env(),
    )
    if proc.returncode != 0:
        raise VerifyError(f"installing {what} into {venv} failed:\n{proc.stderr[-3000:]}")
    return proc.stdout + proc.stderr


def uv_installed(out: str) -> dict[str, str]:
    """name -> version of each ` + name==version` line of uv's output (a file reference without a
    version, ` + name @ file://...`, maps to "")."""
    found = {}
    for m in re.finditer(r"^ \+ ([A-Za-z0-9._-]+)(?:==(\S+))?", out, re.MULTILINE):
        found[m.group(1).lower().replace("_", "-")] = m.group(2) or ""
    return found


def fresh_venv(venv: Path, interpreter: Interpreter | None = None) -> Path:
    """An empty venv (with pip, as `python -m venv` makes it) at `venv`, replacing what was there, made by
    `interpreter` (default: the one running this). A venv that cannot be made is a VerifyError naming
    the interpreter and what it said."""
    shutil.rmtree(venv, ignore_errors=True)
    exe = interpreter.path if interpreter is not None else sys.executable
    made = subprocess.run([exe, "-m", "venv", str(venv)], capture_output=True, text=True, check=False)
    if made.returncode != 0:
        raise VerifyError(
            f"{exe} -m venv {venv} failed (exit {made.returncode}): {made.stderr.strip()[-1500:]}; give a working "
            "interpreter with --interpreter 3.N=PATH, or repair this one's venv support"
        )
    return venv


def venv_json(venv: Path, what: str, *args: str) -> Any:
    """Run the venv's python with `args`; the JSON on its last output line, or VerifyError naming `what`."""
    proc = subprocess.run(
        [str(venv / "bin" / "python"), *args], capture_output=True, text=True, check=False, env=venv_env()
    )
    if proc.returncode != 0:
        raise VerifyError(f"{what} failed in {venv}:\n{proc.stdout[-2000:]}{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_probe(venv: Path, what: str, name: str, *args: str) -> Any:
    """verify/probes/NAME.py run by path with the venv's python; its JSON line."""
    return venv_json(venv, what, probe(name), *args)


def load_by_path(name: str, path: Path) -> Any:
    """A stdlib-only module of this repository, by path: the verify session lacks what its package
    needs around it (the audit's other readers need iced-x86; kt_kernel its compiled core)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up while the class is built
    spec.loader.exec_module(mod)
    return mod


def doctor(venv: Path, *options: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    """kt-doctor's JSON report of the venv (its console script, as a user runs it), with the wall time
    it took (`seconds`)."""
    cmd = [str(venv / "bin" / "kt-doctor"), "--json", *options]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, env=venv_env() if env is None else env)
    if proc.returncode not in (0, 1):
        raise VerifyError(f"kt-doctor failed in {venv} (exit {proc.returncode}):\n{proc.stderr[-2000:]}")
    report: dict[str, Any] = json.loads(proc.stdout)
    report["seconds"] = round(time.perf_counter() - t0, 1)
    return report


def doctor_run(venv: Path, *options: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    """`kt-doctor --run` in the venv; VerifyError naming every problem it finds. The summary: each
    check's state (a skip with its reason) and the time taken."""
    return run_summary(venv, doctor(venv, "--run", *options, env=env))


def run_summary(venv: Path, report: dict[str, Any]) -> dict[str, Any]:
    """The summary of a `kt-doctor --run --json` report, or VerifyError naming every conflict and problem."""
    problems = [f"{c['name']}: {c['detail']} (fix: {c['fix']})" for c in report["checks"] if c["state"] == "problem"]
    conflicts = [f"{p['package']}: {p['problem']}" for p in report["packages"] if p["state"] == "conflict"]
    files = report.get("files") or {}
    damaged = [
        f"{d['distribution']} {d['version']}: {len(d['missing'])} missing, {len(d['changed'])} changed "
        f"({', '.join((d['missing'] + d['changed'])[:3])}; repair: {d['repair']})"
        for d in files.get("damaged", [])
    ]
    if problems or conflicts or damaged:
        wrong = conflicts + damaged + problems
        raise VerifyError(f"kt-doctor --run finds problems in {venv}:\n  " + "\n  ".join(wrong))
    checks = {c["name"]: c["state"] if c["state"] != "skipped" else f"skipped: {c['detail']}" for c in report["checks"]}
    return {"checks": checks, "seconds": report["seconds"], "files_checked": files.get("checked", 0)}
