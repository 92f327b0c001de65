"""Install the candidate the way users will, and prove it (`nox -s verify_install`).

sft-cpu: a fresh venv; pip --require-hashes --only-binary :all: of the locked
third-party closure plus the carriers from dist/ (each by its SHA256SUMS hash,
as a direct file reference, so no same-named PyPI project can stand in); pip
check; imports; the forks, not upstream, provide transformers/accelerate/peft/
trl; adding peft-kt/trl-kt leaves the core carriers' files unchanged; and the
training/resume control. serve: resolution only (pip --dry-run --report).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tools.profiles import carrier_metadata, closure  # noqa: E402

UPSTREAM = ("transformers", "accelerate", "peft", "trl", "sglang", "compressed-tensors", "xgrammar")
PROFILES = {"sft-cpu": "ktransformers[sft]", "serve": "ktransformers[serve]"}
CORE = ("kt-kernel", "ktransformers", "transformers-kt", "accelerate-kt")


class VerifyError(Exception):
    pass


def sums(dist: Path) -> dict[str, str]:
    path = dist / "SHA256SUMS"
    if not path.exists():
        raise VerifyError(f"{path} is missing; build the candidate first (nox -s build_all)")
    out = {}
    for line in path.read_text().splitlines():
        digest, name = line.split(maxsplit=1)
        actual = hashlib.sha256((dist / name).read_bytes()).hexdigest()
        if actual != digest:
            raise VerifyError(f"{dist / name}: sha256 {actual} differs from SHA256SUMS ({digest}); rebuild dist/")
        out[name] = digest
    return out


def carrier_lines(dist: Path, names: list[str], extras: dict[str, str] | None = None) -> list[str]:
    """`name[extra] @ file://... --hash=sha256:...` for each carrier."""
    extras = extras or {}
    by_file = sums(dist)
    lines = []
    for fname, digest in sorted(by_file.items()):
        name = fname.split("-")[0].replace("_", "-").lower()
        if name in names:
            extra = f"[{extras[name]}]" if name in extras else ""
            lines.append(f"{name}{extra} @ {(dist / fname).resolve().as_uri()} --hash=sha256:{digest}")
    return lines


def pip(venv: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """pip as a user on a clean machine would run it: no config files, no PIP_* settings
    (this machine's pip.conf adds local indexes and caps torch), only what we pass."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull
    base = [str(venv / "bin" / "python"), "-m", "pip", "--disable-pip-version-check"]
    if os.environ.get("PIP_CERT"):
        base += ["--cert", os.environ["PIP_CERT"]]
    return subprocess.run([*base, *args], capture_output=True, text=True, check=False, env=env)


def install(venv: Path, req: Path, find_links: str | None) -> None:
    args = ["install", "--require-hashes", "--only-binary", ":all:", "--index-url", "https://pypi.org/simple",
            "-r", str(req)]  # fmt: skip
    if find_links and Path(find_links).is_dir():
        args += ["--find-links", find_links]
    proc = pip(venv, *args)
    if proc.returncode != 0:
        raise VerifyError(f"pip install -r {req} failed:\n{proc.stderr[-3000:]}")


def venv_json(venv: Path, what: str, *args: str) -> Any:
    """Run the venv's python with `args`; the JSON on its last output line, or VerifyError naming `what`."""
    proc = subprocess.run([str(venv / "bin" / "python"), *args], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise VerifyError(f"{what} failed in {venv}:\n{proc.stdout[-2000:]}{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def snapshot(venv: Path, names: tuple[str, ...]) -> dict[str, dict[str, str]]:
    code = ("import hashlib, json, sys\nfrom importlib.metadata import distribution\nout = {}\n"
            "for n in sys.argv[1:]:\n    d = distribution(n)\n"
            "    out[n] = {str(f): hashlib.sha256(f.locate().read_bytes()).hexdigest() for f in d.files or []"
            " if f.locate().is_file() and not str(f).endswith('.pyc')}\nprint(json.dumps(out))")  # fmt: skip
    data: dict[str, dict[str, str]] = venv_json(venv, f"snapshot of {names}", "-c", code, *names)
    return data


FORKS = """
import json, sys
from importlib.metadata import PackageNotFoundError, distribution
out = {}
for up in sys.argv[1:]:
    try:
        distribution(up)
        out[up] = "UPSTREAM INSTALLED"
        continue
    except PackageNotFoundError:
        pass
    try:
        d = distribution(up + "-kt")
    except PackageNotFoundError:
        out[up] = "MISSING"
        continue
    # The fork must be what provides the import package, file for file.
    mine = any(str(f).startswith(up.replace("-", "_") + "/") for f in d.files or [])
    out[up] = d.metadata["Name"] if mine else "files not from the fork"
print(json.dumps(out))
"""
SMOKE = """
import importlib, json
out = {"imports": {}}
for mod in ("kt_kernel", "transformers", "accelerate", "peft", "trl"):
    m = importlib.import_module(mod)
    out["imports"][mod] = getattr(m, "__version__", "?")
import kt_kernel
out["cpu_variant"] = kt_kernel.__cpu_variant__
print(json.dumps(out))
"""


def fork_status(venv: Path, names: tuple[str, ...]) -> dict[str, str]:
    """upstream name -> the distribution providing it ("<name>-kt" when the fork does)."""
    status: dict[str, str] = venv_json(venv, "fork check", "-c", FORKS, *names)
    return status


def verify_sft_cpu(dist: Path, work: Path, find_links: str | None) -> dict[str, Any]:
    lock = ROOT / "lockfiles" / "sft-cpu.txt"
    venv = work / "sft-cpu"
    shutil.rmtree(venv, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    t0 = time.perf_counter()
    core = work / "sft-cpu-core.txt"
    core.write_text(lock.read_text() + "\n".join(carrier_lines(dist, list(CORE))) + "\n")
    install(venv, core, find_links)
    before = snapshot(venv, CORE)
    full = work / "sft-cpu-full.txt"
    reached, _ = closure(dist, PROFILES["sft-cpu"])
    full.write_text(lock.read_text() + "\n".join(carrier_lines(dist, reached, {"ktransformers": "sft"})) + "\n")
    install(venv, full, find_links)
    after = snapshot(venv, CORE)
    t1 = time.perf_counter()
    changed = sorted(n for n in CORE if before[n] != after[n])
    if changed:
        raise VerifyError(f"adding peft-kt/trl-kt changed the installed files of {changed}")
    check = pip(venv, "check")
    if check.returncode != 0:
        raise VerifyError(f"pip check failed in {venv}:\n{check.stdout}{check.stderr}")
    result: dict[str, Any] = venv_json(venv, "import smoke test", "-c", SMOKE)
    result["forks"] = fork_status(venv, ("transformers", "accelerate", "peft", "trl"))
    bad = {k: v for k, v in result["forks"].items() if not v.endswith("-kt")}
    if bad:
        raise VerifyError(f"upstream distributions provide {sorted(bad)} instead of the forks: {bad}")
    result["train_resume"] = venv_json(venv, "training/resume control", str(ROOT / "tools" / "train_control.py"))
    result["install_s"] = round(t1 - t0, 1)
    result["core_unchanged"] = list(CORE)
    return result


def verify_serve(dist: Path, work: Path) -> dict[str, Any]:
    lock = ROOT / "lockfiles" / "serve.txt"
    venv = work / "serve"
    shutil.rmtree(venv, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    reached, _ = closure(dist, PROFILES["serve"])
    req = work / "serve.txt"
    req.write_text(lock.read_text() + "\n".join(carrier_lines(dist, reached, {"ktransformers": "serve"})) + "\n")
    # uv's resolver reads index metadata only: the GPU closure (several GB) is never downloaded.
    uv = shutil.which("uv")
    if uv is None:
        raise VerifyError("uv is not on PATH; install lockfiles/verify.txt (nox -s verify_install does)")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "UV_"))}
    proc = subprocess.run([uv, "pip", "install", "--dry-run", "--python", str(venv / "bin" / "python"),
                           "--require-hashes", "--only-binary", ":all:", "--index-url", "https://pypi.org/simple",
                           "-r", str(req)], capture_output=True, text=True, check=False, env=env)  # fmt: skip
    if proc.returncode != 0:
        raise VerifyError(f"the serve closure does not resolve:\n{proc.stderr[-3000:]}")
    names = sorted(
        re.split(r"[=@ ]", line[3:], maxsplit=1)[0].lower().replace("_", "-")
        for line in (proc.stdout + proc.stderr).splitlines() if line.startswith(" + ")
    )  # fmt: skip
    upstream = [n for n in names if n in UPSTREAM]
    if upstream:
        raise VerifyError(f"the serve closure installs upstream {upstream} beside the forks")
    missing = sorted(set(reached) - set(names))
    if missing:
        raise VerifyError(f"the serve closure lacks the carriers {missing}")
    result: dict[str, Any] = {"resolved": len(names), "carriers": sorted(set(reached)), "upstream": upstream}
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="nox -s verify_install --")
    p.add_argument("--dist", type=Path, default=ROOT / "dist")
    p.add_argument("--work", type=Path, default=ROOT / "build" / "verify")
    p.add_argument("--profile", action="append", choices=sorted(PROFILES), help="default: all")
    p.add_argument("--find-links", default=os.environ.get("KT_FIND_LINKS", "/opt/wheels"))
    p.add_argument("--json", type=Path, help="write the results here")
    args = p.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {}
    try:
        carrier_metadata(args.dist)
        for prof in args.profile or sorted(PROFILES):
            t0 = time.perf_counter()
            if prof == "sft-cpu":
                results[prof] = verify_sft_cpu(args.dist, args.work, args.find_links)
            else:
                results[prof] = verify_serve(args.dist, args.work)
            results[prof]["elapsed_s"] = round(time.perf_counter() - t0, 1)
            print(f"{prof}: ok ({results[prof]['elapsed_s']}s) {json.dumps(results[prof])}")
    except (VerifyError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
