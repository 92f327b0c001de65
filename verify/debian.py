"""The last resort for a CPython this machine lacks: its Debian suite's python3 in a root made by
debootstrap from the Debian mirror (the host is left alone), run with chroot.

base.interpreters finds an existing root (source ``debian``); this module makes one when no other source
found an interpreter, and runs a published install file in it: `pip install --require-hashes -r FILE`
with the release's wheels beside it and the rest downloaded here by hash for that Python, then the same
checks as on a native interpreter (pip check, the profile's own probes, `kt-doctor --run` with the
payload materialized first). pip runs inside the root (uv, outside it, cannot use that interpreter).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from base import cachedir, distdir, interpreters, swap
from base.interpreters import Interpreter
from base.version import python_tag

from .venv import PROBES, VerifyError, run_summary

MIRROR = "http://deb.debian.org/debian"


class Unavailable(VerifyError):
    """This machine cannot make the root (no debootstrap, not root): the Python stays NOT VERIFIED, said
    so with the fix; never a pass."""


def make_root(python: str, where: Path | None = None) -> Path:
    """A minimal Debian root holding python<python> in `where` (default: base.paths.DEBIAN_ROOTS, the running
    user's, never a shared cache), made once, then reused; Unavailable or VerifyError."""
    root = interpreters.debian_root(python, where)
    if root is None:
        known = sorted(interpreters.DEBIAN_SUITES)
        raise Unavailable(f"no Debian suite ships CPython {python} (known: {known})")
    if (root / "usr" / "bin" / f"python{python}").exists():
        return root
    suite = interpreters.DEBIAN_SUITES[python]
    return debootstrap(suite, root, [f"python{python}", f"python{python}-venv"], f"python{python}")


def debootstrap(suite: str, root: Path, include: list[str], what: str) -> Path:
    """A minimal Debian `suite` root at `root` holding `include`, made by debootstrap from the Debian mirror
    (the folder that holds it the running user's alone); Unavailable where this machine cannot, VerifyError
    where debootstrap fails."""
    if os.geteuid() != 0:
        raise Unavailable(f"debootstrap and chroot need root to make {root}: run verify_install as root")
    if shutil.which("debootstrap") is None:
        raise Unavailable("debootstrap is not installed: apt-get install debootstrap (it fetches Debian's packages)")
    try:
        cachedir.owned(root.parent, "Debian roots folder")  # nobody else may plant a root that root then runs
    except cachedir.CacheError as exc:
        raise Unavailable(str(exc)) from None
    tmp = swap.part(root)  # base.swap.sweep removes a killed one
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.parent.mkdir(parents=True, exist_ok=True)
    print(f"[debian] debootstrap {suite} ({what}) into {root} ...", flush=True)
    got = subprocess.run(
        ["debootstrap", "--variant=minbase", f"--include={','.join(include)}", suite, str(tmp), MIRROR],
        capture_output=True,
        text=True,
        check=False,
    )
    if got.returncode != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        raise VerifyError(f"debootstrap {suite} failed:\n{got.stdout[-1500:]}{got.stderr[-1500:]}")
    tmp.rename(root)
    return root


def package_list(root: Path) -> str:
    """What the Debian root holds, as dpkg lists it (package=version lines), or "absent": a result
    obtained there is keyed by it, so a root made anew with other packages runs the checks again."""
    try:
        text = (root / "var" / "lib" / "dpkg" / "status").read_text(errors="replace")
    except OSError:
        return "absent"
    fields = (dict(ln.split(": ", 1) for ln in block.splitlines() if ": " in ln) for block in text.split("\n\n"))
    return "\n".join(sorted(f"{f['Package']}={f.get('Version', '')}" for f in fields if "Package" in f))


def _third_party(path: Path, carriers: set[str]) -> str:
    """The install file's pins (locks.read.parse_lock) without the release's own wheels, which come from
    dist/, not the index; each with its hashes, in the file's own form."""
    from locks.read import parse_lock, render_pins

    return render_pins(p for p in parse_lock(path).values() if p.name not in carriers)


class _Root:
    """One profile's work folder inside the root (`/kt-<run>`): its venv, wheels, probes and caches."""

    def __init__(self, interpreter: Interpreter, run: str) -> None:
        self.interpreter = interpreter
        self.inside = f"/kt-{run}"
        self.host = Path(interpreter.root) / self.inside.lstrip("/")
        self.venv = f"{self.inside}/venv"

    def run(self, what: str, *argv: str, ok: tuple[int, ...] = (0,)) -> str:
        env = {**os.environ, "KT_KERNEL_CACHE_DIR": f"{self.inside}/cache", "HF_HUB_OFFLINE": "1"}
        cmd = self.interpreter.command(*argv)
        ran = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env)
        if ran.returncode not in ok:
            raise VerifyError(f"{what} failed in {self.interpreter.root}:\n{ran.stdout[-2000:]}{ran.stderr[-2000:]}")
        return ran.stdout

    def json(self, what: str, *argv: str, whole: bool = False) -> Any:
        """The JSON `argv` prints (its last line, or all of it with `whole`; kt-doctor exits 1 on a problem)."""
        import json

        out = self.run(what, *argv, ok=(0, 1) if whole else (0,))
        return json.loads(out if whole else out.strip().splitlines()[-1])

    def probe(self, what: str, name: str, *args: str) -> Any:
        return self.json(what, f"{self.venv}/bin/python", f"{self.inside}/probes/{name}.py", *args)


def _checks(box: _Root, profile: str) -> tuple[dict[str, Any], list[str]]:
    """The profile's checks in the published venv (those its native run makes on the CPU): the result and
    what it shows wrong."""
    from .lf import control_problems
    from .serve import serving_problems

    box.run("pip check", f"{box.venv}/bin/python", "-m", "pip", "check")
    if profile == "sft":
        from .probes import sft_e2e

        train = box.probe("the training/resume control", "train_control")
        e2e = box.probe("kt_kernel.sft end to end", "sft_e2e")
        wrong = sft_e2e.problems(e2e)
        if not (train.get("trained") and train.get("adapter_bit_identical") and train.get("optimizer_bit_identical")):
            wrong.append(f"training/resume control: {train}")
        kt_sft = {k: e2e[k] for k in ("losses", "torch_losses", "trajectory_rel_diff")}
        return {"train_resume": train, "kt_sft": kt_sft}, wrong
    # The payload first, then kt-doctor --run with every check (its `needed` reads the extracted libraries).
    box.run("the payload materialized", f"{box.venv}/bin/python", "-m", "kt_kernel.payload", "materialize")
    box.run("the payload verified", f"{box.venv}/bin/python", "-m", "kt_kernel.payload", "verify")
    doctor = box.json("kt-doctor --run", f"{box.venv}/bin/kt-doctor", "--json", "--run", whole=True)
    doctor["seconds"] = 0.0
    try:
        summary: dict[str, Any] = run_summary(box.host / "venv", doctor)
    except VerifyError as exc:
        return {}, [str(exc)]
    if profile == "serve":
        found = box.probe("SGLang tokenizer and JSON-schema grammar on CPU", "serving", f"{box.inside}/serving")
        return {"serving": found, "doctor_run": summary}, serving_problems(found)
    run = box.probe("LlamaFactory control with use_kt", "lf_control", f"{box.inside}/lf-run", "--kt")
    checks = box.probe("LlamaFactory's dependency check", "lf_checks")
    return {"control_kt": run, "llamafactory": checks, "doctor_run": summary}, control_problems(run, kt=True)


def exercise_published(dist: Path, interpreter: Interpreter, profile: str) -> dict[str, Any]:
    """dist/install/<profile>-cp3NN.txt installed in the interpreter's Debian root exactly as published
    (pip --require-hashes -r FILE, its wheels beside it: the release's from dist/, the rest downloaded
    here by hash for that Python), then the profile's checks in it; VerifyError naming what is wrong."""
    from locks.targets import MANYLINUX_2_34, download

    python = interpreter.python
    t0 = time.perf_counter()
    release = distdir.open_release(dist)
    published, digest = release.install_file(profile, python)
    box = _Root(interpreter, f"{profile}-{python_tag(python)}")
    if box.host.is_symlink():  # never followed: root would write where the link points
        box.host.unlink()
    shutil.rmtree(box.host, ignore_errors=True)
    cachedir.owned(box.host, "work folder in the Debian root")
    (box.host / "wheels").mkdir()
    ours = {w.name for w in release.manifest.wheels}
    for w in release.wheels_for(python):
        shutil.copyfile(dist / w.filename, box.host / "wheels" / w.filename)
    third = box.host / "third-party.txt"
    third.write_text(_third_party(published, ours))
    label = f"{python_tag(python)}: the published {published.name}'s wheels"
    got = download(["--require-hashes", "-r", str(third)], python, box.host / "wheels", label, platforms=MANYLINUX_2_34)
    if got.returncode != 0:
        raise VerifyError(f"downloading {published.name}'s wheels for CPython {python} failed:\n{got.stderr[-2000:]}")
    shutil.copyfile(published, box.host / published.name)
    shutil.copytree(PROBES, box.host / "probes", ignore=shutil.ignore_patterns("__pycache__"))
    print(f"[{python_tag(python)}] the published {published.name} in {interpreter.root} ...", flush=True)
    try:
        box.run(
            f"pip install -r {published.name}",
            "sh",
            "-c",
            f"set -e; {interpreter.path} -m venv {box.venv}; {box.venv}/bin/pip install --quiet --isolated "
            f"--no-index --find-links {box.inside}/wheels --require-hashes -r {box.inside}/{published.name}",
        )
        result, wrong = _checks(box, profile)
    finally:
        shutil.rmtree(box.host, ignore_errors=True)  # several GB of venv, wheels and payload; the root stays
    if wrong:
        raise VerifyError(f"the published {published.name} on CPython {python}:\n  " + "\n  ".join(wrong))
    return {
        "install_file": {"file": str(published.relative_to(dist)), "sha256": digest},
        **result,
        "seconds": round(time.perf_counter() - t0, 1),
    }
