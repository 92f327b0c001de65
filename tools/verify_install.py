"""Install the candidate the way users will, and prove it (`nox -s verify_install`).

sft-cpu: a fresh venv; pip --require-hashes --only-binary :all: of the locked
third-party closure plus the carriers from dist/ (each by its SHA256SUMS hash,
as a direct file reference, so no same-named PyPI project can stand in); pip
check; imports; the forks, not upstream, provide transformers/accelerate/peft/
trl; adding peft-kt/trl-kt leaves the core carriers' files unchanged; and the
training/resume control. serve: a real install of ktransformers[serve] (CUDA torch
included), pip check, the CUDA payload materialized from the installed carriers and
verified, every extracted library's DT_NEEDED resolved in the environment (the driver
aside), and how far `import sglang` / `import sgl_kernel` get on this host. lf-standard,
lf-kt, lf-upgrade: the LlamaFactory profiles (tools/verify_lf.py).
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

from packaging.tags import sys_tags
from packaging.utils import canonicalize_name, parse_wheel_filename

from carriers import load as load_carriers
from tools import indexes, progress, sft_e2e
from tools.lock import directive
from tools.profiles import carrier_metadata, closure

ROOT = Path(__file__).resolve().parent.parent


def _profiles() -> dict[str, str]:
    """Install profile -> its root requirement: the `#:carriers` line of lockfiles/<profile>.in (the one owner)."""
    out = {}
    for name in ("sft-cpu", "serve"):
        roots = directive(ROOT / "lockfiles" / f"{name}.in", "carriers")
        if len(roots) != 1:
            raise RuntimeError(f"lockfiles/{name}.in must name exactly one `#:carriers` root, not {roots}")
        out[name] = roots[0]
    return out


# The upstream projects the forks and repacks replace: from carriers/carriers.toml.
UPSTREAM = tuple(sorted(str(canonicalize_name(u)) for u in load_carriers().by_upstream()))
PROFILES = _profiles()


def core(dist: Path) -> list[str]:
    """The sft-cpu closure without its dependency-only repacks (kind "repack" in carriers.toml):
    sft-cpu installs it first and checks that adding the repacks (peft-kt, trl-kt) leaves its files
    untouched."""
    reached, _ = closure(dist, PROFILES["sft-cpu"])
    repacks = {c.name for c in load_carriers().carriers if c.kind == "repack"}
    return [n for n in reached if n not in repacks]


class VerifyError(Exception):
    """An install verification failed; the message says what and where."""

    pass


def sums(dist: Path) -> dict[str, str]:
    """dist/SHA256SUMS checked against the files; filename -> sha256."""
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
    supported = set(sys_tags())  # kt-kernel ships one wheel per Python: the one this interpreter takes
    for fname, digest in sorted(by_file.items()):
        name = fname.split("-")[0].replace("_", "-").lower()
        if name in names and supported & set(parse_wheel_filename(fname)[3]):
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
    return progress.run_quiet([*base, *args], f"verify {venv.name}: pip {args[0]}", env=env)


def install(venv: Path, req: Path) -> None:
    """`req` is a lock (plus carrier lines) adapted to this machine by tools.indexes.for_install."""
    proc = pip(venv, "install", *indexes.LOCKED_INSTALL, "-r", str(req))
    if proc.returncode != 0:
        raise VerifyError(f"pip install -r {req} failed:\n{proc.stderr[-3000:]}")


def clean_env() -> dict[str, str]:
    """This process's environment without pip/uv settings and colour forcing (a user's clean shell)."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "UV_", "FORCE_COLOR", "CLICOLOR"))}


def uv_install(venv: Path, req: Path, what: str, *extra: str) -> str:
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
        [*cmd, *indexes.LOCKED_INSTALL, *extra, "-r", str(req)], f"verify {venv.name}: uv pip install", env=clean_env()
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


def fresh_venv(venv: Path) -> Path:
    """An empty venv (with pip, as `python -m venv` makes it) at `venv`, replacing what was there."""
    shutil.rmtree(venv, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    return venv


def venv_json(venv: Path, what: str, *args: str) -> Any:
    """Run the venv's python with `args`; the JSON on its last output line, or VerifyError naming `what`."""
    proc = subprocess.run([str(venv / "bin" / "python"), *args], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise VerifyError(f"{what} failed in {venv}:\n{proc.stdout[-2000:]}{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def snapshot(venv: Path, names: tuple[str, ...]) -> dict[str, dict[str, str]]:
    """Installed files and their hashes of the named distributions in a venv."""
    code = (
        "import hashlib, json, sys\nfrom importlib.metadata import distribution\nout = {}\n"
        "for n in sys.argv[1:]:\n    d = distribution(n)\n"
        "    out[n] = {str(f): hashlib.sha256(f.locate().read_bytes()).hexdigest() for f in d.files or []"
        " if f.locate().is_file() and not str(f).endswith('.pyc')}\nprint(json.dumps(out))"
    )
    data: dict[str, dict[str, str]] = venv_json(venv, f"snapshot of {names}", "-c", code, *names)
    return data


FORKS = """
import json, re, sys
from importlib.metadata import distributions
# The listing, not a lookup by name: a lookup by an upstream name is answered by the fork
# (carriers/alias), the listing shows what is really installed.
installed = {re.sub(r"[-_.]+", "-", d.metadata["Name"]).lower(): d for d in distributions()}
out = {}
for up in sys.argv[1:]:
    if up in installed:
        out[up] = "UPSTREAM INSTALLED"
        continue
    d = installed.get(up + "-kt")
    if d is None:
        out[up] = "MISSING"
        continue
    # The fork must be what provides the import package, file for file.
    mine = any(str(f).startswith(up.replace("-", "_") + "/") for f in d.files or [])
    out[up] = d.metadata["Name"] if mine else "files not from the fork"
print(json.dumps(out))
"""
# Lookups by distribution name (issue: code asks version("peft") and a fork installs as peft-kt):
# every renamed upstream in the env answers with the upstream's name and version, and the sites the
# release's audit found (dist.name-lookup) see it: trl's __version__, accelerate's and transformers'
# "is peft available", transformers' require_version.
DIST_NAMES = """
import json, sys
from importlib.metadata import distributions, metadata, version
out = {"lookups": {}}
for d in distributions():
    up = d.read_text("kt_upstream.json")
    if up:
        up = json.loads(up)
        out["lookups"][up["name"]] = {"want": [up["name"], up["version"]],
                                      "got": [metadata(up["name"])["Name"], version(up["name"])]}
import trl
from accelerate.utils import is_peft_available as accelerate_sees_peft
from transformers.utils import is_peft_available as transformers_sees_peft
from transformers.utils.versions import require_version
require_version("peft>=0.1")
out["sites"] = {"trl.__version__": trl.__version__, "accelerate is_peft_available": accelerate_sees_peft(),
                "transformers is_peft_available": transformers_sees_peft(), "require_version": "ok"}
print(json.dumps(out))
"""


def load_by_path(name: str, path: Path) -> Any:
    """A stdlib-only module of this repository, by path: the verify session lacks what its package
    needs around it (the audit's other readers need iced-x86; kt_kernel its compiled core)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None
    assert spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up while the class is built
    spec.loader.exec_module(mod)
    return mod


def _lookup_reader() -> Any:
    """audits/readers/_python.py, the audit's own reader of lookups by name."""
    return load_by_path("kt_lookup_reader", ROOT / "audits" / "readers" / "_python.py")


def closure_lookups(venv: Path, renamed: set[str]) -> list[str]:
    """file:line of every lookup of a renamed upstream by the installed closure's own code (the
    release's wheels are scanned by the audit; these are the third-party ones a profile pulls in)."""
    find_lookups = _lookup_reader().find_lookups
    site = next(venv.glob("lib/python*/site-packages"))
    ours = {f"{c.import_package}/" for c in load_carriers().carriers}
    out = []
    for f in sorted(site.rglob("*.py")):
        rel = f.relative_to(site).as_posix()
        if rel.startswith(tuple(ours)):
            continue
        out += [
            f"{rel}:{lk.line} {lk.call}({lk.name!r}) [{lk.api}]"
            for lk in find_lookups(rel, f.read_bytes())
            if str(canonicalize_name(lk.name)) in renamed
        ]
    return out


def doctor(venv: Path, *options: str) -> dict[str, Any]:
    """kt-doctor's JSON report of the venv (its console script, as a user runs it)."""
    cmd = [str(venv / "bin" / "kt-doctor"), "--json", *options]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode not in (0, 1):
        raise VerifyError(f"kt-doctor failed in {venv} (exit {proc.returncode}):\n{proc.stderr[-2000:]}")
    report: dict[str, Any] = json.loads(proc.stdout)
    return report


def dist_name_problems(found: dict[str, Any]) -> list[str]:
    """What DIST_NAMES found wrong: a renamed upstream not answering as itself, or a site that still misses."""
    wrong = [
        f"version({n!r}) gives {v['got']}, not {v['want']}"
        for n, v in found["lookups"].items()
        if v["got"] != v["want"]
    ]
    sites = found["sites"]
    want_trl = found["lookups"].get("trl", {}).get("want", [None, None])[1]
    if sites["trl.__version__"] != want_trl:
        wrong.append(f"trl.__version__ is {sites['trl.__version__']!r}, not {want_trl!r}")
    wrong += [f"{k} is {v}" for k, v in sites.items() if v is False]
    wrong += [
        f"{site}: pkg_resources never asks the alias" for site in found.get("closure", []) if "[pkg_resources]" in site
    ]
    return wrong


SMOKE = """
import importlib, json
from importlib.metadata import packages_distributions, version
out = {"imports": {}, "distributions": {}}
owners = packages_distributions()
for mod in ("kt_kernel", "transformers", "accelerate", "peft", "trl", "torch"):
    m = importlib.import_module(mod)
    out["imports"][mod] = getattr(m, "__version__", "?")
    # the distribution that installed the module (a fork: trl-kt), with its own version
    dist = sorted(owners.get(mod, []))
    out["distributions"][mod] = f"{dist[0]} {version(dist[0])}" if dist else "?"
import kt_kernel, torch
out["cpu_variant"] = kt_kernel.__cpu_variant__
out["torch"] = torch.__version__
print(json.dumps(out))
"""


OWNERS = """
import json
from importlib.metadata import distributions
out = {}
for d in distributions():
    name = d.metadata["Name"]
    out[name] = {str(f): (f.hash.value if f.hash else "") for f in d.files or []
                 if ".dist-info/" not in str(f) and "__pycache__/" not in str(f)}
print(json.dumps(out))
"""


def accepted_collisions() -> dict[str, frozenset[str]]:
    """path -> the distributions the audit policy accepts writing it (audits/policy/default.toml)."""
    import tomllib

    data = tomllib.loads((ROOT / "audits" / "policy" / "default.toml").read_text())
    return {c["path"]: frozenset(_norm(b) for b in c["between"]) for c in data.get("installed_collision", [])}


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def path_collisions(
    owners: dict[str, dict[str, str]], accepted: dict[str, frozenset[str]] | None = None
) -> tuple[list[str], list[str]]:
    """(conflicts, shared) among installed distributions: paths two of them write with different
    bytes (whichever installed last won, uninstalling either breaks the other), and paths they
    write with identical bytes or that the policy accepts (reported, not failed).
    `owners`: distribution -> {installed path: RECORD hash}."""
    accepted = accepted or {}
    seen: dict[str, tuple[str, str]] = {}
    conflicts: list[str] = []
    shared: list[str] = []
    for dist in sorted(owners):
        for path, digest in sorted(owners[dist].items()):
            if path not in seen:
                seen[path] = (dist, digest)
                continue
            first, first_digest = seen[path]
            line = f"{path}: {first} and {dist}"
            ok = (digest and digest == first_digest) or {_norm(first), _norm(dist)} <= accepted.get(path, frozenset())
            (shared if ok else conflicts).append(line)
    return conflicts, shared


def check_collisions(venv: Path) -> list[str]:
    """Every installed path has one owner (or identical bytes); returns the shared ones."""
    conflicts, shared = path_collisions(venv_json(venv, "installed-path owners", "-c", OWNERS), accepted_collisions())
    if conflicts:
        shown = "\n  ".join(conflicts[:10]) + (f"\n  ... and {len(conflicts) - 10} more" if len(conflicts) > 10 else "")
        raise VerifyError(f"distributions in {venv} write the same paths with different bytes:\n  {shown}")
    return shared


def fork_status(venv: Path, names: tuple[str, ...]) -> dict[str, str]:
    """upstream name -> the distribution providing it ("<name>-kt" when the fork does)."""
    status: dict[str, str] = venv_json(venv, "fork check", "-c", FORKS, *names)
    return status


def verify_sft_cpu(dist: Path, work: Path) -> dict[str, Any]:
    """Install the sft-cpu profile for real and exercise it (forks, imports, training/resume)."""
    lock = ROOT / "lockfiles" / "sft-cpu.txt"
    venv = fresh_venv(work / "sft-cpu")
    t0 = time.perf_counter()
    base = core(dist)
    core_req = indexes.for_install(lock, work / "sft-cpu-core.txt", "\n".join(carrier_lines(dist, base)))
    install(venv, core_req)
    before = snapshot(venv, tuple(base))
    reached, _ = closure(dist, PROFILES["sft-cpu"])
    full = indexes.for_install(
        lock, work / "sft-cpu-full.txt", "\n".join(carrier_lines(dist, reached, {"ktransformers": "sft"}))
    )
    install(venv, full)
    after = snapshot(venv, tuple(base))
    t1 = time.perf_counter()
    changed = sorted(n for n in base if before[n] != after[n])
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
    result["shared_paths"] = check_collisions(venv)
    result["dist_names"] = venv_json(venv, "lookups by distribution name", "-c", DIST_NAMES)
    result["dist_names"]["closure"] = closure_lookups(venv, set(UPSTREAM))
    if wrong := dist_name_problems(result["dist_names"]):
        raise VerifyError("lookups by upstream distribution name in the sft-cpu profile:\n" + "\n".join(wrong))
    result["doctor"] = doctor(venv)
    if result["doctor"]["conflicts"]:
        raise VerifyError(f"kt-doctor finds conflicts in the fresh sft-cpu profile: {result['doctor']}")
    result["train_resume"] = venv_json(venv, "training/resume control", str(ROOT / "tools" / "train_control.py"))
    e2e = venv_json(venv, "kt_kernel.sft end-to-end", str(ROOT / "tools" / "sft_e2e.py"))
    wrong = sft_e2e.problems(e2e)
    if wrong:
        raise VerifyError("kt_kernel.sft end-to-end (tools/sft_e2e.py) in the sft-cpu profile:\n" + "\n".join(wrong))
    result["kt_sft"] = {k: e2e[k] for k in ("losses", "torch_losses", "trajectory_rel_diff")}
    result["install_s"] = round(t1 - t0, 1)
    result["core_unchanged"] = base
    return result


SGLANG_PROBE = """
import json, traceback
out = {}
for mod in ("sglang", "sglang.srt.server_args", "sgl_kernel"):
    try:
        __import__(mod)
        out[mod] = "ok"
    except BaseException as exc:  # report exactly how far a CPU-only host gets
        lines = [ln for ln in str(exc).splitlines() if ln.strip()]
        # sgl_kernel lists each load attempt's error after this line; the first is the cause
        after = lines[lines.index("Error details from previous import attempts:") + 1:] if (
            "Error details from previous import attempts:" in lines) else []
        # the first attempt's error already names its exception type
        out[mod] = (after[0].lstrip("- ") if after else f"{type(exc).__name__}: {lines[-1] if lines else ''}")[:300]
print(json.dumps(out))
"""


def _env_libraries(venv: Path) -> dict[str, Path]:
    """soname/basename -> path of every shared library installed in the venv (torch/lib, nvidia/*/lib, ...)."""
    libs: dict[str, Path] = {}
    for site in (venv / "lib").glob("python3*/site-packages"):
        for so in sorted(site.rglob("*.so*")):
            if so.is_file():
                libs.setdefault(so.name, so)
    return libs


def _system_libraries() -> set[str]:
    proc = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, check=False)
    return {line.split()[0] for line in proc.stdout.splitlines()[1:] if line.strip()}


def unresolved_needed(root: Path, venv: Path, always_external: set[str]) -> dict[str, list[str]]:
    """Every extracted ELF's DT_NEEDED that resolves nowhere: not beside it through its
    RUNPATH/RPATH ($ORIGIN), not in the environment, not a system library, not the driver."""
    from elftools.elf.dynamic import DynamicSection
    from elftools.elf.elffile import ELFFile

    env = _env_libraries(venv)
    system = _system_libraries()
    missing: dict[str, list[str]] = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        with path.open("rb") as fh:
            if fh.read(4) != b"\x7fELF":
                continue
            fh.seek(0)
            elf = ELFFile(fh)
            needed, paths = [], []
            for sec in elf.iter_sections():
                if isinstance(sec, DynamicSection):
                    for tag in sec.iter_tags():
                        if tag.entry.d_tag == "DT_NEEDED":
                            needed.append(tag.needed)  # type: ignore[attr-defined]
                        elif tag.entry.d_tag in ("DT_RUNPATH", "DT_RPATH"):
                            paths += [
                                d.replace("$ORIGIN", str(path.parent))
                                for d in getattr(tag, "runpath", getattr(tag, "rpath", "")).split(":")
                            ]
        for lib in needed:
            if lib in always_external or lib in system or lib in env or any((Path(d) / lib).exists() for d in paths):
                continue
            missing.setdefault(str(path.relative_to(root)), []).append(lib)
    return missing


def verify_serve(dist: Path, work: Path) -> dict[str, Any]:
    """A real install of ktransformers[serve] (the CUDA torch and NVIDIA runtime wheels included):
    pip check, the payload materialized from the installed carriers and re-verified, every
    DT_NEEDED of every extracted library resolved inside the environment, and how far
    `import sglang` gets on this host."""
    lock = ROOT / "lockfiles" / "serve.txt"
    venv = fresh_venv(work / "serve")
    reached, _ = closure(dist, PROFILES["serve"])
    req = work / "serve.txt"
    req.write_text(lock.read_text() + "\n".join(carrier_lines(dist, reached, {"ktransformers": "serve"})) + "\n")
    t0 = time.perf_counter()
    print(f"serve: installing {len(reached)} carriers and the locked closure into {venv} (several GB) ...", flush=True)
    got = uv_installed(uv_install(venv, req, "the serve closure"))
    install_s = time.perf_counter() - t0
    names = sorted(got)
    torch = got.get("torch") or "?"
    upstream = [n for n in names if n in UPSTREAM]
    if upstream:
        raise VerifyError(f"the serve closure installs upstream {upstream} beside the forks")
    missing = sorted(set(reached) - set(names))
    if missing:
        raise VerifyError(f"the serve closure lacks the carriers {missing}")
    check = pip(venv, "check")
    if check.returncode != 0:
        raise VerifyError(f"pip check failed in {venv}:\n{check.stdout}{check.stderr}")
    shared = check_collisions(venv)
    cache = work / "serve-payload-cache"
    shutil.rmtree(cache, ignore_errors=True)
    run_env = {**clean_env(), "KT_KERNEL_CACHE_DIR": str(cache)}
    py = str(venv / "bin" / "python")
    t1 = time.perf_counter()
    mat = subprocess.run(
        [py, "-m", "kt_kernel.payload", "materialize"], capture_output=True, text=True, check=False, env=run_env
    )
    if mat.returncode != 0:
        raise VerifyError(f"the payload does not materialize from the installed carriers:\n{mat.stderr[-3000:]}")
    materialize_s = time.perf_counter() - t1
    root = Path(mat.stdout.strip())
    ver = subprocess.run(
        [py, "-m", "kt_kernel.payload", "verify"], capture_output=True, text=True, check=False, env=run_env
    )
    if ver.returncode != 0:
        raise VerifyError(f"the extracted payload differs from its manifest:\n{ver.stderr[-3000:]}")
    unresolved = unresolved_needed(root, venv, {"libcuda.so.1"})
    if unresolved:
        raise VerifyError(f"extracted libraries need what the serve environment does not provide: {unresolved}")
    probe: dict[str, str] = venv_json(venv, "sglang import probe", "-c", SGLANG_PROBE)
    if probe.get("sglang") != "ok":
        raise VerifyError(f"import sglang fails in the serve environment: {probe['sglang']}")
    return {
        "resolved": len(names),
        "carriers": sorted(set(reached)),
        "upstream": upstream,
        "install_s": round(install_s, 1),
        "materialize_s": round(materialize_s, 1),
        "payload_files": sum(1 for p in root.rglob("*") if p.is_file() and p.name != ".complete"),
        "needed_unresolved": unresolved,
        "imports": probe,
        "shared_paths": shared,
        "torch": torch,
    }


def main(argv: list[str] | None = None) -> int:
    """The verify_install CLI."""
    p = argparse.ArgumentParser(prog="nox -s verify_install --")
    p.add_argument("--dist", type=Path, default=ROOT / "dist")
    p.add_argument("--work", type=Path, default=ROOT / "build" / "verify")
    from tools import verify_lf

    every = [*sorted(PROFILES), *verify_lf.PROFILES]
    p.add_argument("--profile", action="append", choices=every, help="default: all")
    p.add_argument("--json", type=Path, help="write the results here")
    args = p.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {}
    try:
        carrier_metadata(args.dist)
        run = {"sft-cpu": verify_sft_cpu, "serve": verify_serve, **verify_lf.VERIFY}
        for prof in args.profile or every:
            t0 = time.perf_counter()
            results[prof] = run[prof](args.dist, args.work)
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
