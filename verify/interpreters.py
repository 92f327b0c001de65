"""The release on another CPython that this machine can run: Debian trixie's python3.13, in a root made
by debootstrap from the Debian mirror (the host is left alone). verify_install --profile cp313.

In a fresh venv of that interpreter, with no index (--no-index, every file by hash): kt-kernel (the one
abi3 wheel), the payload's part carriers with this Python's own sglang-kt, the manifest's provider, and
numpy and zstandard from the install profile's cp313 lock. Then a MoE forward against an independent
numpy reference (verify/probes/exercise.py), and the CUDA payload materialized and re-verified from
the installed carriers. CUDA torch (4 GB) stays with the GPU-sized profiles."""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name

from base import distdir, paths
from base.cli import dist_option, fresh_option
from base.errors import StageError, report
from base.version import python_tag

from . import cached, registry
from .venv import VerifyError

SUITES = registry.SUITES  # CPython -> the Debian suite whose python3 it is (the registry's)
MIRROR = "http://deb.debian.org/debian"
PROBE = Path(__file__).resolve().parent / "probes" / "exercise.py"
CARRIERS = ("kt-kernel", "ktransformers", "sglang-kt", "transformers-kt", "accelerate-kt", "sglang-kernel-kt")
THIRD_PARTY = ("numpy", "zstandard")
BOUND = 0.03  # the kernel quantizes activations to int8; against an fp64 reference of the same weights


class InterpreterError(VerifyError):
    """The release is broken on that Python, or the check itself failed; the message says which and why."""


class Unavailable(InterpreterError):
    """This machine lacks what the check needs (debootstrap, root for chroot): the Python is NOT VERIFIED,
    said so with the fix; never a pass, and no failure of `nox -s release` on a fresh machine."""


def debian_root(python: str, cache: Path) -> Path:
    """A minimal Debian root holding python<python> (made once, then reused)."""
    suite = SUITES.get(python)
    if suite is None:
        raise InterpreterError(f"no Debian suite known for CPython {python} (known: {sorted(SUITES)})")
    if os.geteuid() != 0:
        raise Unavailable("debootstrap and chroot need root: run verify_install --profile cp313 as root")
    root = cache / f"debian-{suite}"
    if (root / "usr" / "bin" / f"python{python}").exists():
        return root
    if shutil.which("debootstrap") is None:
        raise Unavailable("debootstrap is not installed: apt-get install debootstrap (it fetches Debian's packages)")

    tmp = root.with_name(f".{root.name}.{os.getpid()}.part")  # base.swap.sweep removes a killed one
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.parent.mkdir(parents=True, exist_ok=True)
    print(f"[{python_tag(python)}] debootstrap {suite} (python{python}) into {root} ...", flush=True)
    got = subprocess.run(
        ["debootstrap", "--variant=minbase", f"--include=python{python},python{python}-venv", suite, str(tmp), MIRROR],
        capture_output=True,
        text=True,
        check=False,
    )
    if got.returncode != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        raise InterpreterError(f"debootstrap {suite} failed:\n{got.stdout[-1500:]}{got.stderr[-1500:]}")
    tmp.rename(root)
    return root


def package_list(python: str, cache: Path) -> str:
    """What the Debian root for `python` holds, as dpkg lists it (package=version lines), or "absent":
    the cp3NN result is keyed by it, so a root made anew with other packages re-runs the check."""
    suite = SUITES.get(python, "")
    status = cache / f"debian-{suite}" / "var" / "lib" / "dpkg" / "status"
    try:
        text = status.read_text(errors="replace")
    except OSError:
        return "absent"
    fields = (dict(ln.split(": ", 1) for ln in block.splitlines() if ": " in ln) for block in text.split("\n\n"))
    return "\n".join(sorted(f"{f['Package']}={f.get('Version', '')}" for f in fields if "Package" in f))


def _requirements(dist: Path, python: str) -> tuple[list[Path], str]:
    """The carriers' wheels for `python` and the pin lines (their sha256; numpy/zstandard from the lock)."""
    from locks.read import pylock_path, read_pylock

    manifest = distdir.open_release(dist).manifest
    wheels, lines = [], []
    for name in CARRIERS:
        w = manifest.wheel_for(name, python)
        if w is None:
            raise InterpreterError(f"{dist / distdir.MANIFEST} lists no {name} wheel for CPython {python}; rebuild it")
        wheels.append(dist / w.filename)
        lines.append(f"{name}=={w.version} --hash=sha256:{w.sha256}")
    pins: dict[str, Any] = {canonicalize_name(p.name): p for p in read_pylock(pylock_path("serve", python)).packages}
    for name in THIRD_PARTY:
        p = pins[name]
        hashes = " ".join(f"--hash=sha256:{h}" for wh in p.wheels or [] for h in wh.hashes.values())
        lines.append(f"{name}=={p.version} {hashes}")
    return wheels, "\n".join(lines) + "\n"


def run(dist: Path, python: str, cache: Path) -> dict[str, Any]:
    """Install and exercise the release on CPython `python`; its result, or InterpreterError."""
    from locks.targets import MANYLINUX_2_34, download

    t0 = time.perf_counter()
    root = debian_root(python, cache)
    work = root / "kt-verify"
    shutil.rmtree(work, ignore_errors=True)
    (work / "wheels").mkdir(parents=True)
    wheels, req = _requirements(dist, python)
    for w in wheels:
        shutil.copyfile(w, work / "wheels" / w.name)
    third = work / "third-party.txt"
    third.write_text("".join(ln + "\n" for ln in req.splitlines() if ln.split("==")[0] in THIRD_PARTY))
    requirements = ["--require-hashes", "-r", str(third)]
    label = f"{python_tag(python)}: numpy, zstandard"
    got = download(requirements, python, work / "wheels", label, platforms=MANYLINUX_2_34)
    if got.returncode != 0:
        raise InterpreterError(f"downloading numpy and zstandard for CPython {python} failed:\n{got.stderr[-2000:]}")
    (work / "requirements.txt").write_text(req)
    shutil.copyfile(PROBE, work / "exercise.py")
    venv, env = "/kt-verify/venv", "KT_KERNEL_CACHE_DIR=/kt-verify/cache"
    script = (
        f"set -e; python{python} -m venv {venv}; "
        f"{venv}/bin/pip install --quiet --isolated --no-index --find-links /kt-verify/wheels --require-hashes "
        f"--no-deps -r /kt-verify/requirements.txt; "
        f"cd /; {venv}/bin/python /kt-verify/exercise.py; "
        f"{env} {venv}/bin/python -m kt_kernel.payload materialize >/dev/null; "
        f"{env} {venv}/bin/python -m kt_kernel.payload verify"
    )
    got = subprocess.run(["chroot", str(root), "sh", "-c", script], capture_output=True, text=True, check=False)
    if got.returncode != 0:
        raise InterpreterError(
            f"the release on CPython {python} ({root}) failed:\n{got.stdout[-2000:]}{got.stderr[-2000:]}"
        )
    lines = got.stdout.strip().splitlines()
    shutil.rmtree(work, ignore_errors=True)  # the venv and the 1.1 GiB materialized payload; the root stays
    result: dict[str, Any] = json.loads(next(ln for ln in lines if ln.startswith("{")))
    result["payload_verify"] = lines[-1]
    # kt-doctor --run would fail its `needed` check by construction here: this venv holds the carriers
    # alone (--no-deps, no torch); the MoE and payload checks above are its cpu and payload checks.
    result["doctor_run"] = "not run: the carriers alone, without torch (their MoE and payload are checked above)"
    result["seconds"] = round(time.perf_counter() - t0, 1)
    tag = python_tag(python)
    if not all(t.startswith(f"{tag}-{tag}-") for t in result["sglang_kt_tags"]):
        raise InterpreterError(f"CPython {python} got sglang-kt tagged {result['sglang_kt_tags']}, not its own wheel")
    if not result["moe_max_rel_error"] <= BOUND:
        raise InterpreterError(
            f"on CPython {python} kt-kernel's MoE is {result['moe_max_rel_error']:.3g} off the numpy reference "
            f"(bound {BOUND})"
        )
    result["published"] = {p: exercise_published(dist, python, root, p) for p in PUBLISHED}
    return result


PUBLISHED = registry.PUBLISHED  # the install files exercised as published on another interpreter
VENV = "/kt-published/venv"


def _third_party(path: Path, carriers: set[str]) -> str:
    """The install file's pins (locks.read.parse_lock) without the release's own wheels, which come from
    dist/, not the index; each with its hashes, in the file's own form."""
    from locks.read import parse_lock

    return "".join(
        f"{p.name}=={p.version} \\\n" + " \\\n".join(f"    --hash=sha256:{h}" for h in p.hashes) + "\n"
        for p in parse_lock(path).values()
        if p.name not in carriers
    )


def _in_root(root: Path, what: str, *argv: str, whole: bool = False) -> Any:
    """Run `argv` in the root (the published venv's tools); its JSON (the last output line, or `whole`)."""
    env = {**os.environ, "KT_KERNEL_CACHE_DIR": "/kt-published/cache", "HF_HUB_OFFLINE": "1"}
    ran = subprocess.run(["chroot", str(root), *argv], capture_output=True, text=True, check=False, env=env)
    if ran.returncode not in ((0, 1) if whole else (0,)):
        raise InterpreterError(f"{what} failed in {root}:\n{ran.stdout[-2000:]}{ran.stderr[-2000:]}")
    return json.loads(ran.stdout if whole else ran.stdout.strip().splitlines()[-1])


def _probe(root: Path, what: str, name: str, *args: str) -> Any:
    return _in_root(root, what, f"{VENV}/bin/python", f"/kt-published/probes/{name}.py", *args)


def _exercise(root: Path, profile: str) -> tuple[dict[str, Any], list[str]]:
    """The profile's checks in the published venv (those its CPython 3.11 profile runs on the CPU): the
    result and what it shows wrong."""
    from .lf import control_problems
    from .serve import serving_problems
    from .venv import run_summary

    if profile == "sft":
        from .probes import sft_e2e

        train = _probe(root, "the training/resume control", "train_control")
        e2e = _probe(root, "kt_kernel.sft end to end", "sft_e2e")
        wrong = sft_e2e.problems(e2e)
        if not (train.get("trained") and train.get("adapter_bit_identical") and train.get("optimizer_bit_identical")):
            wrong.append(f"training/resume control: {train}")
        kt_sft = {k: e2e[k] for k in ("losses", "torch_losses", "trajectory_rel_diff")}
        return {"train_resume": train, "kt_sft": kt_sft}, wrong
    doctor = _in_root(root, "kt-doctor --run", f"{VENV}/bin/kt-doctor", "--json", "--run", whole=True)
    doctor["seconds"] = 0.0
    try:
        summary: dict[str, Any] = run_summary(Path(VENV), doctor)
    except VerifyError as exc:
        return {}, [str(exc)]
    if profile == "serve":
        found = _probe(root, "SGLang tokenizer and JSON-schema grammar on CPU", "serving", "/kt-published/serving")
        return {"serving": found, "doctor_run": summary}, serving_problems(found)
    run = _probe(root, "LlamaFactory control with use_kt", "lf_control", "/kt-published/lf-run", "--kt")
    checks = _probe(root, "LlamaFactory's dependency check", "lf_checks")
    return {"control_kt": run, "llamafactory": checks, "doctor_run": summary}, control_problems(run, kt=True)


def exercise_published(dist: Path, python: str, root: Path, profile: str) -> dict[str, Any]:
    """dist/install/<profile>-cp3NN.txt installed in the Debian root exactly as published (pip
    --require-hashes -r FILE, its wheels beside it: the release's from dist/, the rest downloaded here by
    hash for that Python), then the profile's checks in it (sft: the training/resume control and
    kt_kernel.sft; serve: SGLang's tokenizer and grammars on CPU and kt-doctor --run; lf-kt: LlamaFactory
    training with use_kt and kt-doctor --run)."""
    from locks.targets import MANYLINUX_2_34, download

    t0 = time.perf_counter()
    release = distdir.open_release(dist)
    published, digest = release.install_file(profile, python)
    work = root / "kt-published"
    shutil.rmtree(work, ignore_errors=True)
    (work / "wheels").mkdir(parents=True)
    ours = {w.name for w in release.manifest.wheels}
    for w in release.wheels_for(python):
        shutil.copyfile(dist / w.filename, work / "wheels" / w.filename)
    third = work / "third-party.txt"
    third.write_text(_third_party(published, ours))
    label = f"{python_tag(python)}: the published {published.name}'s wheels"
    got = download(["--require-hashes", "-r", str(third)], python, work / "wheels", label, platforms=MANYLINUX_2_34)
    if got.returncode != 0:
        raise InterpreterError(
            f"downloading {published.name}'s wheels for CPython {python} failed:\n{got.stderr[-2000:]}"
        )
    shutil.copyfile(published, work / published.name)
    shutil.copytree(PROBE.parent, work / "probes", ignore=shutil.ignore_patterns("__pycache__"))
    print(f"[{python_tag(python)}] the published {published.name}: install and exercise ...", flush=True)
    try:
        _in_root(
            root,
            f"pip install -r {published.name}",
            "sh",
            "-c",
            f"set -e; python{python} -m venv {VENV}; {VENV}/bin/pip install --quiet --isolated --no-index "
            f"--find-links /kt-published/wheels --require-hashes -r /kt-published/{published.name}; echo '{{}}'",
        )
        result, wrong = _exercise(root, profile)
    finally:
        shutil.rmtree(work, ignore_errors=True)  # several GB of venv and wheels; the root stays
    if wrong:
        raise InterpreterError(f"the published {published.name} on CPython {python}:\n  " + "\n  ".join(wrong))
    return {
        "install_file": {"file": str(published.relative_to(dist)), "sha256": digest},
        **result,
        "seconds": round(time.perf_counter() - t0, 1),
    }


def main(argv: list[str] | None = None) -> int:
    """python -m verify.interpreters --dist dist [--python 3.13] [--json F]."""
    p = argparse.ArgumentParser(prog="python -m verify.interpreters")
    dist_option(p)
    p.add_argument("--python", action="append", default=[], metavar="3.N", help=f"default: {sorted(SUITES)}")
    p.add_argument("--cache", type=Path, default=paths.CACHE)
    p.add_argument("--json", type=Path)
    fresh_option(p, "run")
    args = p.parse_args(argv)
    results: dict[str, Any] = {}

    def work(python: str) -> dict[str, Any]:
        try:
            return run(args.dist, python, args.cache)
        except Unavailable as exc:
            return {"not_verified": str(exc)}

    try:
        key = cached.dist_key(args.dist)
        for python in args.python or sorted(SUITES):
            name = python_tag(python)
            with contextlib.suppress(Unavailable):  # without it, work() says NOT VERIFIED with the fix
                debian_root(python, args.cache)  # first: the result is keyed by what the root holds
            r, stamp = cached.run(
                name,
                args.dist,
                key,
                functools.partial(work, python),
                proved=lambda r: "not_verified" not in r,
                extra={"python": python, "debian root": package_list(python, args.cache)},
                fresh=args.fresh,
            )
            results[python] = {**r, **stamp}
            if "not_verified" in r:
                print(f"[{name}] CPython {python}: NOT VERIFIED: {r['not_verified']}", flush=True)
                continue
            print(
                f"[{name}] CPython {r['python']} ({r['variant']}): MoE within "
                f"{r['moe_max_rel_error']:.2e} of numpy; sglang-kt {r['sglang_kt_tags'][0]}; {r['payload_verify']} "
                f"({r['seconds']:.0f}s, {stamp['outcome']})"
            )
    except (StageError, OSError, ValueError, KeyError) as exc:
        return report(exc)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
