"""The LLaMA-Factory install profiles, installed for real and trained in: `nox -s verify_install --
--profile lf-standard|lf-kt|lf-upgrade` (python -m verify runs them).

lf-standard  upstream LlamaFactory and upstream libraries (lockfiles/lf-standard.txt): a clean
             install; every import package owned by its upstream distribution and no KT one
             installed; the training/resume control (tools/lf_control.py) without KT; and
             `use_kt: true` refused by upstream with an error that names what to install.
lf-kt        serving and fine-tuning in one environment (lockfiles/lf-kt.txt + ktransformers[serve,sft]
             + llamafactory-kt from dist/): a clean install; kt-doctor finds `transformers`,
             `accelerate`, `peft`, `trl`, `llamafactory`, `sglang` and `sgl_kernel` each owned by exactly
             one distribution, the KT one; lookups by upstream name answer; LlamaFactory's own
             dependency check passes; the control with use_kt (every MoE block through kt_kernel.sft,
             resume bit-exact, expert LoRA saved) and without (no block); packing with KT refused.
lf-upgrade   an lf-standard environment upgraded in place: the KT profile installed on top (as a
             user would), kt-doctor reporting each package both write, its repair commands run as
             printed (`--find-links dist/`: the release's wheels), then the lf-kt checks and KT control.

All three use the CUDA torch build the release pins (2.14.1), which also runs on a CPU host; uv
installs them (it links files from its cache where pip would copy several GB).
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from base import paths
from base.interpreters import Interpreter
from base.paths import ROOT
from carriers.graph import closure
from locks import indexes
from locks.read import directive, parse_lock

from .owners import check_collisions, dist_name_problems, dist_names, upstream
from .venv import (
    VerifyError,
    doctor,
    fresh_venv,
    install_published,
    load_by_path,
    pip,
    pip_check,
    run_probe,
    run_summary,
    uv_install,
    uv_installed,
)

# The import packages whose owner the KT profile must be the KT distribution, and those the
# standard profile has from upstream.
KT_PACKAGES = ("transformers", "accelerate", "peft", "trl", "llamafactory", "sglang", "sgl_kernel")
STANDARD_PACKAGES = ("transformers", "accelerate", "peft", "trl", "llamafactory")


def _doctor_module() -> Any:
    """kernel/python/kt_kernel/doctor.py (stdlib only): it reads an environment that has no kt-kernel
    installed (the standard profile) through --site."""
    return load_by_path("kt_doctor", ROOT / "kernel" / "python" / "kt_kernel" / "doctor.py")


def site_owners(venv: Path, packages: tuple[str, ...]) -> dict[str, list[dict[str, Any]]]:
    """import package -> its owners (name, version, kt), read from the venv's RECORDs by kt-doctor."""
    site = next(venv.glob("lib/python*/site-packages"))
    report = _doctor_module().diagnose(packages, site)
    return {p.package: [{"name": o.name, "version": o.version, "kt": o.kt} for o in p.owners] for p in report}


def kt_carriers(dist: Path) -> list[str]:
    """The carriers lf-kt's `#:carriers` roots reach (what its published install file must install)."""
    roots = directive(paths.LOCKFILES / "lf-kt.in", "carriers")
    return sorted({name for root in roots for name in closure(dist, root)[0]})


def control(venv: Path, work: Path, *flags: str) -> dict[str, Any]:
    """verify/probes/lf_control.py in the venv; its JSON result."""
    result: dict[str, Any] = run_probe(venv, f"LlamaFactory control {' '.join(flags)}", "lf_control", str(work), *flags)
    return result


def control_problems(r: dict[str, Any], kt: bool) -> list[str]:
    """What a control result shows wrong: the KT dispatch where it does not belong (or missing where
    configured), a resume that is not bit-exact, the expert LoRA not saved."""
    wrong = []
    want = r["blocks"] if kt else 0
    if r["kt_blocks"] != want:
        wrong.append(f"{r['kt_blocks']} MoE blocks ran through kt_kernel.sft, expected {want} (use_kt={kt})")
    wrong += [f"resumed run differs: {d}" for d in r["resume_diffs"]]
    if r["losses"] != r["resumed_losses"]:
        wrong.append(f"losses {r['losses']} vs resumed {r['resumed_losses']}")
    if kt and not r["expert_adapter_saved"]:
        wrong.append("the expert LoRA (kt_expert_adapter.safetensors) is not in the output directory")
    return wrong


def ownership_problems(owners: dict[str, list[dict[str, Any]]], kt: bool) -> list[str]:
    """Each package has exactly one owner, the KT distribution (kt) or the upstream one."""
    wrong = []
    for pkg, who in owners.items():
        names = [f"{o['name']} {o['version']}" for o in who]
        if len(who) != 1:
            wrong.append(f"{pkg}/ is written by {names or 'nothing'}, not by exactly one distribution")
        elif who[0]["kt"] != kt:
            wrong.append(f"{pkg}/ is owned by {names[0]}, not by {'the KT' if kt else 'the upstream'} distribution")
    return wrong


def install_problems(got: dict[str, str], kt: bool, carriers: Sequence[str] = ()) -> list[str]:
    """What an installed set shows wrong for its profile: KT distributions in the standard one; in the
    KT one, an upstream distribution beside the forks or a carrier the profile reaches that is missing."""
    if not kt:
        return [f"the standard profile installs KT distribution {n} {got[n]}" for n in sorted(got) if _is_kt(n)]
    wrong = [
        f"the lf-kt profile installs upstream {n} {got[n]} beside its fork" for n in sorted(set(got) & set(upstream()))
    ]
    return wrong + [f"the lf-kt profile lacks carrier {n}" for n in sorted(set(carriers) - set(got))]


def _is_kt(name: str) -> bool:
    return name.endswith("-kt") or name in ("kt-kernel", "ktransformers")


def upgrade_problems(conflicted: list[str], repairs: list[str]) -> list[str]:
    """After lf-kt over lf-standard, kt-doctor must report every package that upstream and a fork both
    write, and each repair it prints must be a pip command (it is run as printed)."""
    wrong = [
        f"kt-doctor does not report {pkg}/, which upstream and its fork both write after the upgrade"
        for pkg in sorted(set(STANDARD_PACKAGES) - set(conflicted))
    ]
    return wrong + [
        f"kt-doctor printed a repair that is not a pip command: {cmd}"
        for cmd in repairs
        if shlex.split(cmd)[:2] not in (["pip", "install"], ["pip", "uninstall"])
    ]


def _fail(what: str, wrong: list[str]) -> None:
    if wrong:
        raise VerifyError(f"{what}:\n  " + "\n  ".join(wrong))


def install_standard(venv: Path, work: Path) -> dict[str, str]:
    """lf-standard by hash into `venv`; what uv installed."""
    req = indexes.for_install(paths.LOCKFILES / "lf-standard.txt", work / "lf-standard.txt")
    print(f"lf-standard: installing {len(parse_lock(ROOT / 'lockfiles' / 'lf-standard.txt'))} pins into {venv} ...")
    return uv_installed(uv_install(venv, req, "the lf-standard profile"))


def verify_standard(dist: Path, work: Path, interpreter: Interpreter) -> dict[str, Any]:
    """lf-standard: clean install, upstream ownership, the control without KT, use_kt refused."""
    venv = fresh_venv(work / "lf-standard", interpreter)
    t0 = time.perf_counter()
    got = install_standard(venv, work)
    install_s = time.perf_counter() - t0
    pip_check(venv)
    _fail("lf-standard", install_problems(got, kt=False))
    owners = site_owners(venv, STANDARD_PACKAGES)
    _fail("import package owners in lf-standard", ownership_problems(owners, kt=False))
    run = control(venv, work / "lf-standard-run", "--refusals")
    refused = run.pop("refused")
    _fail("LlamaFactory control in lf-standard", control_problems(run, kt=False))
    if "kt-kernel" not in refused.get("use_kt", ""):
        raise VerifyError(f"use_kt in the standard profile should fail naming kt-kernel, got: {refused}")
    return {
        "install_s": round(install_s, 1),
        "installed": len(got),
        "owners": owners,
        "control": run,
        "refused": refused,
        "doctor_run": "not run: kt-doctor ships in kt-kernel, which the upstream profile does not install",
    }


def kt_checks(venv: Path, work: Path, tag: str, *control_flags: str) -> dict[str, Any]:
    """What every KT environment must show: pip check, no path written twice, kt-doctor clean with
    every package owned by the KT distribution, lookups by upstream name, LlamaFactory's own checks,
    and the control with use_kt (`control_flags` added to its run)."""
    pip_check(venv)
    result: dict[str, Any] = {"shared_paths": check_collisions(venv)}
    report = doctor(venv, "--run")  # the ownership report and the checks, in one run
    owners = {p["package"]: p["owners"] for p in report["packages"] if p["package"] in KT_PACKAGES}
    wrong = ownership_problems(owners, kt=True)
    wrong += [f"{p['package']}: {p['problem']}" for p in report["packages"] if p["state"] == "conflict"]
    _fail(f"kt-doctor in {tag}", wrong)
    result["doctor"] = run_summary(venv, report)
    result["owners"] = {k: [f"{o['name']} {o['version']}" for o in v] for k, v in owners.items()}
    names = dist_names(venv)
    _fail(f"lookups by upstream distribution name in {tag}", dist_name_problems(names))
    result["dist_names"] = names["sites"]
    result["llamafactory"] = run_probe(venv, "LlamaFactory's dependency check", "lf_checks")
    result["control_kt"] = control(venv, work / f"{tag}-run", "--kt", *control_flags)
    _fail(f"LlamaFactory control with use_kt in {tag}", control_problems(result["control_kt"], kt=True))
    return result


def verify_kt(dist: Path, work: Path, interpreter: Interpreter) -> dict[str, Any]:
    """lf-kt: clean install of serving + fine-tuning, the KT checks, the control without KT, packing refused."""
    venv = fresh_venv(work / "lf-kt", interpreter)
    reached = kt_carriers(dist)
    t0 = time.perf_counter()
    # dist/install/lf-kt-cp3XX.txt of the interpreter's Python, as users get it
    got, exercised = install_published(venv, dist, "lf-kt", python=interpreter.python)
    install_s = time.perf_counter() - t0
    _fail("lf-kt", install_problems(got, kt=True, carriers=reached))
    result = kt_checks(venv, work, "lf-kt", "--refusals")  # the refusals in the use_kt control's process
    refused = result["control_kt"].pop("refused")
    result["control_plain"] = control(venv, work / "lf-kt-run")
    _fail("LlamaFactory control without use_kt in lf-kt", control_problems(result["control_plain"], kt=False))
    if "packing: false" not in refused.get("packing_with_kt", ""):
        raise VerifyError(f"packing with use_kt should be refused with what to set, got: {refused}")
    if "use_cpu: true" not in refused.get("model_off_cpu", ""):
        raise VerifyError(f"use_kt with the model off the CPU should be refused with what to set, got: {refused}")
    result.update(
        install_file=exercised, install_s=round(install_s, 1), installed=len(got), carriers=reached, refused=refused
    )
    return result


def verify_upgrade(dist: Path, work: Path, interpreter: Interpreter) -> dict[str, Any]:
    """lf-standard upgraded in place to lf-kt: installed on top, kt-doctor's conflicts and its repair,
    then the KT checks."""
    venv = fresh_venv(work / "lf-upgrade", interpreter)
    before = install_standard(venv, work)
    reached = kt_carriers(dist)
    t0 = time.perf_counter()
    # the published file of the interpreter's Python, over the upstream environment
    _, exercised = install_published(venv, dist, "lf-kt", python=interpreter.python)
    report = doctor(venv, "--find-links", str(dist))  # the release's wheels: no index holds them here
    conflicted = sorted(p["package"] for p in report["packages"] if p["state"] == "conflict")
    repairs = [cmd for p in report["packages"] for cmd in p["repair"]]
    _fail("kt-doctor after lf-kt over lf-standard", upgrade_problems(conflicted, repairs))
    for cmd in repairs:  # run as printed
        proc = pip(venv, *shlex.split(cmd)[1:])
        if proc.returncode != 0:
            raise VerifyError(f"kt-doctor's repair `{cmd}` failed in {venv}:\n{proc.stderr[-2000:]}")
    upgrade_s = time.perf_counter() - t0
    result = kt_checks(venv, work, "lf-upgrade")
    after = installed_versions(venv)
    result.update(
        upgrade_s=round(upgrade_s, 1),
        conflicts_reported=conflicted,
        repairs=repairs,
        torch={"before": before.get("torch"), "after": after.get("torch")},
        carriers=reached,
        install_file=exercised,
    )
    return result


def installed_versions(venv: Path) -> dict[str, str]:
    """name -> version of every distribution in the venv."""
    out: dict[str, str] = run_probe(venv, "installed distributions", "installed")
    return out


VERIFY = {"lf-standard": verify_standard, "lf-kt": verify_kt, "lf-upgrade": verify_upgrade}
