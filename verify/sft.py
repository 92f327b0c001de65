"""The sft-cpu profile: installed for real (the core first, then the repacks on top, which must leave
the core's files unchanged), pip check, the forks own their import packages, no path written twice,
lookups by upstream name, kt-doctor clean, the training/resume control and kt_kernel.sft end to end."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from base.interpreters import Interpreter
from base.paths import LOCKFILES
from carriers.graph import closure
from locks import indexes

from . import owners
from .probes import sft_e2e
from .profiles import core, root
from .venv import (
    VerifyError,
    carrier_lines,
    doctor,
    fresh_venv,
    install,
    install_published,
    pip_check,
    probe,
    run_probe,
    run_summary,
    venv_json,
)


def snapshot(venv: Path, names: tuple[str, ...]) -> dict[str, dict[str, str]]:
    """Installed files and their hashes of the named distributions in a venv."""
    data: dict[str, dict[str, str]] = run_probe(venv, f"snapshot of {names}", "snapshot", *names)
    return data


def verify_sft_cpu(dist: Path, work: Path, interpreter: Interpreter) -> dict[str, Any]:
    """Install the sft-cpu profile for real and exercise it (forks, imports, training/resume)."""
    lock = LOCKFILES / "sft-cpu.txt"
    venv = fresh_venv(work / "sft-cpu", interpreter)
    t0 = time.perf_counter()
    base = core(dist)
    python = interpreter.python
    core_req = indexes.for_install(lock, work / "sft-cpu-core.txt", "\n".join(carrier_lines(dist, base, python=python)))
    install(venv, core_req)
    before = snapshot(venv, tuple(base))
    reached, _ = closure(dist, root("sft-cpu"))
    full = indexes.for_install(
        lock, work / "sft-cpu-full.txt", "\n".join(carrier_lines(dist, reached, {"ktransformers": "sft"}, python))
    )
    install(venv, full)
    after = snapshot(venv, tuple(base))
    t1 = time.perf_counter()
    changed = sorted(n for n in base if before[n] != after[n])
    if changed:
        raise VerifyError(f"adding peft-kt/trl-kt changed the installed files of {changed}")
    result = sft_checks(venv, "sft-cpu")
    result["install_s"] = round(t1 - t0, 1)
    result["core_unchanged"] = base
    return result


def sft_checks(venv: Path, tag: str) -> dict[str, Any]:
    """What every SFT environment must show: pip check, the imports, the forks own their import packages,
    no path written twice, lookups by upstream name, kt-doctor clean and running, the training/resume
    control and kt_kernel.sft end to end (on the CPU, whatever torch build the profile installs)."""
    pip_check(venv)
    result: dict[str, Any] = run_probe(venv, "import smoke test", "smoke")
    result["forks"] = owners.fork_status(venv, ("transformers", "accelerate", "peft", "trl"))
    bad = {k: v for k, v in result["forks"].items() if not v.endswith("-kt")}
    if bad:
        raise VerifyError(f"upstream distributions provide {sorted(bad)} instead of the forks in {tag}: {bad}")
    result["shared_paths"] = owners.check_collisions(venv)
    result["dist_names"] = owners.dist_names(venv)
    result["dist_names"]["closure"] = owners.closure_lookups(venv, set(owners.upstream()))
    if wrong := owners.dist_name_problems(result["dist_names"]):
        raise VerifyError(f"lookups by upstream distribution name in the {tag} profile:\n" + "\n".join(wrong))
    result["doctor"] = doctor(venv, "--run")  # the ownership report and the checks, in one run
    if result["doctor"]["conflicts"]:
        raise VerifyError(f"kt-doctor finds conflicts in the fresh {tag} profile: {result['doctor']}")
    result["doctor_run"] = run_summary(venv, result["doctor"])  # the CPU kernels run; no CUDA payload here
    result["train_resume"] = run_probe(venv, "training/resume control", "train_control")
    e2e = venv_json(venv, "kt_kernel.sft end-to-end", probe("sft_e2e"))
    wrong = sft_e2e.problems(e2e)
    if wrong:
        what = f"kt_kernel.sft end-to-end (verify/probes/sft_e2e.py) in the {tag} profile"
        raise VerifyError(what + ":\n" + "\n".join(wrong))
    result["kt_sft"] = {k: e2e[k] for k in ("losses", "torch_losses", "trajectory_rel_diff")}
    return result


def verify_sft(
    dist: Path,
    work: Path,
    interpreter: Interpreter | None = None,
    *,
    index_url: str | None = None,
    behind: tuple[str, ...] = (),
) -> dict[str, Any]:
    """The sft profile as users get it: a fresh venv of `interpreter` (default: this one) from the published
    dist/install/sft-cp3XX.txt of its Python by hash (torch's CUDA build, which runs on the CPU here), then
    every SFT check, the training step included. With `index_url`: its wheels from the index the release was
    published to (see install_published)."""
    venv = fresh_venv(work / ("sft-published" if index_url else "sft"), interpreter)
    python = interpreter.python if interpreter else None
    t0 = time.perf_counter()
    got, exercised = install_published(venv, dist, "sft", python=python, index_url=index_url, behind=behind)
    install_s = time.perf_counter() - t0
    upstream = sorted(set(got) & set(owners.upstream()))
    if upstream:
        raise VerifyError(f"{exercised['file']} installs upstream {upstream} beside the forks")
    result = sft_checks(venv, "sft")
    result.update(
        install_file=exercised, torch=got.get("torch", "?"), installed=len(got), install_s=round(install_s, 1)
    )
    if index_url:
        result["index"] = index_url
    return result
