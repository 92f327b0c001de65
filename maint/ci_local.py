"""Run .github/workflows/release.yml on this machine (`nox -s ci_local`).

    python -m maint.ci_local [--event push --ref refs/tags/v0.6.1 | --event workflow_dispatch
                              --input target=testpypi | --event pull_request] [--plan] [--work DIR]

Reads the workflow, expands each job's matrix, and runs the jobs in dependency order, each in a
fresh clone of this repository's HEAD, with the workflow's and the step's environment, CI=true and
a GITHUB_STEP_SUMMARY file. Artifacts pass as the upload/download steps declare (name, path,
pattern, merge-multiple). A job runs when every job it needs succeeded and its `if:` holds for the
event; a failed or skipped job skips its dependants. `uses:` steps other than checkout,
setup-python, upload-artifact and download-artifact are errors before anything runs.

Steps that cannot run here are replaced by their local equivalent with a visible note, never
silently: cibuildwheel's container build by the host build (`nox -s build_cuda`: the same link against glibc
2.28's stubs in both, kernel/tools/glibc_floor.py, so the same manylinux tag; a Python the host lacks gets the
host wheel relabelled for it, a FIXTURE that must never be installed), and the
publish jobs' index by a pypiserver on 127.0.0.1 (attestations need the CI's OIDC identity: off).
"""

from __future__ import annotations

import argparse
import ast
import graphlib
import itertools
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from base import paths
from base.paths import ROOT

from .errors import MaintError

WORKFLOW = ROOT / ".github" / "workflows" / "release.yml"
KNOWN_ACTIONS = ("actions/checkout", "actions/setup-python", "actions/upload-artifact", "actions/download-artifact")
HOST_PYTHON = f"cp{sys.version_info.major}{sys.version_info.minor}"


class WorkflowError(MaintError):
    """The workflow uses something this runner cannot run or replace; nothing has run (exit 2)."""

    exit_code = 2


class JobFailed(MaintError):
    """A job's step failed (the job is reported failed; the run goes on with what does not need it)."""


# --- expressions: the ${{ }} subset the workflow uses, evaluated on a whitelisted Python AST --------------


def _functions(statuses: Mapping[str, str]) -> dict[str, Any]:
    return {
        "startsWith": lambda a, b: str(a).lower().startswith(str(b).lower()),
        "endsWith": lambda a, b: str(a).lower().endswith(str(b).lower()),
        "contains": lambda a, b: (
            str(b).lower() in (str(a).lower() if isinstance(a, str) else [str(x).lower() for x in a])
        ),
        "success": lambda: all(s == "success" for s in statuses.values()),
        "failure": lambda: any(s == "failure" for s in statuses.values()),
        "always": lambda: True,
        "cancelled": lambda: False,
    }


def _to_python(expr: str) -> str:
    out, i = [], 0
    while i < len(expr):
        if expr[i] == "'":  # a string literal: '' is an escaped quote
            j = i + 1
            while j < len(expr) and not (expr[j] == "'" and expr[j + 1 : j + 2] != "'"):
                j += 2 if expr[j : j + 2] == "''" else 1
            out.append(repr(expr[i + 1 : j].replace("''", "'")))
            i = j + 1
        elif expr.startswith("&&", i):
            out.append(" and ")
            i += 2
        elif expr.startswith("||", i):
            out.append(" or ")
            i += 2
        elif expr[i] == "!" and not expr.startswith("!=", i):
            out.append(" not ")
            i += 1
        elif m := re.match(r"[A-Za-z_]\w*", expr[i:]):
            word = m.group(0)
            out.append({"true": "True", "false": "False", "null": "None"}.get(word, word))
            i += len(word)
        else:
            out.append(expr[i])
            i += 1
    return "".join(out).strip()


def evaluate(expr: str, context: Mapping[str, Any], statuses: Mapping[str, str] | None = None) -> Any:
    """Value of a workflow expression (without the ${{ }}); unknown names are errors."""
    funcs = _functions(statuses or {})
    try:
        tree = ast.parse(_to_python(expr.strip()), mode="eval")
    except SyntaxError as exc:
        raise WorkflowError(f"cannot read the expression {expr!r}: {exc.msg}") from None

    def ev(node: ast.AST) -> Any:  # noqa: PLR0911 - one return per node kind
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.BoolOp):
            values = [ev(v) for v in node.values]
            return all(values) if isinstance(node.op, ast.And) else next((v for v in values if v), values[-1])
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            return not ev(node.operand)
        if isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(node.ops[0], (ast.Eq, ast.NotEq)):
            left, right = ev(node.left), ev(node.comparators[0])
            same = (
                str(left).lower() == str(right).lower()
                if isinstance(left, str) and isinstance(right, str)
                else left == right
            )
            return same if isinstance(node.ops[0], ast.Eq) else not same
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in funcs:
            return funcs[node.func.id](*(ev(a) for a in node.args))
        if isinstance(node, ast.Name):
            if node.id not in context:
                raise WorkflowError(f"{expr!r}: unknown context {node.id!r}")
            return context[node.id]
        if isinstance(node, ast.Attribute):
            base = ev(node.value)
            return base.get(node.attr, "") if isinstance(base, Mapping) else ""
        raise WorkflowError(f"{expr!r}: this runner does not evaluate {ast.dump(node)[:60]}")

    return ev(tree)


def interpolate(text: str, context: Mapping[str, Any]) -> str:
    """A string with every ${{ expression }} evaluated."""
    return re.sub(r"\$\{\{(.*?)\}\}", lambda m: str(evaluate(m.group(1), context)), text)


# --- the plan ---------------------------------------------------------------------------------------------


@dataclass
class JobRun:
    """One job of the workflow (one matrix combination) and how it ended."""

    key: str  # job id, plus the matrix values: "kernel (cp311)"
    job_id: str
    name: str
    needs: tuple[str, ...]
    condition: str
    steps: list[dict[str, Any]]
    env: dict[str, str]
    matrix: dict[str, Any] = field(default_factory=dict)
    status: str = "pending"  # success, failure, skipped
    reason: str = ""
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)


def load(path: Path = WORKFLOW) -> dict[str, Any]:
    """The workflow file, with YAML's `on: true` key put back as `on`."""
    import yaml  # type: ignore[import-untyped]

    raw: dict[Any, Any] = yaml.safe_load(path.read_text())
    raw["on"] = raw.pop(True, raw.get("on", {}))  # YAML 1.1 reads the key `on` as true
    return {str(k): v for k, v in raw.items()}


def expand(workflow: Mapping[str, Any]) -> list[JobRun]:
    """Every job, each matrix combination its own run; unknown actions are errors."""
    runs: list[JobRun] = []
    for job_id, job in workflow["jobs"].items():
        for step in job.get("steps", []):
            uses = step.get("uses")
            if uses and not uses.startswith(tuple(a + "@" for a in KNOWN_ACTIONS)):
                raise WorkflowError(
                    f"job {job_id}: step uses {uses!r}, which this runner cannot run or replace; "
                    f"known: {', '.join(KNOWN_ACTIONS)}"
                )
        matrix = (job.get("strategy") or {}).get("matrix") or {}
        axes = {k: v for k, v in matrix.items() if isinstance(v, list)}
        combos = [dict(zip(axes, values, strict=True)) for values in itertools.product(*axes.values())] or [{}]
        needs = job.get("needs", [])
        for combo in combos:
            ctx = {"matrix": combo}
            key = job_id + (f" ({', '.join(str(v) for v in combo.values())})" if combo else "")
            runs.append(
                JobRun(
                    key,
                    job_id,
                    interpolate(str(job.get("name", job_id)), ctx),
                    tuple([needs] if isinstance(needs, str) else needs),
                    str(job.get("if", "")),
                    job.get("steps", []),
                    {k: str(v) for k, v in (job.get("env") or {}).items()},
                    combo,
                )
            )
    return runs


def event_context(workflow: Mapping[str, Any], event: str, ref: str, inputs: Mapping[str, str]) -> dict[str, Any]:
    """The github and inputs contexts of an event (dispatch inputs with their defaults)."""
    declared = ((workflow["on"] or {}).get("workflow_dispatch") or {}).get("inputs") or {}
    values = {k: str(v.get("default", "")) for k, v in declared.items()} if event == "workflow_dispatch" else {}
    unknown = set(inputs) - set(declared)
    if unknown:
        raise WorkflowError(
            f"unknown workflow_dispatch inputs {sorted(unknown)}; the workflow declares {sorted(declared)}"
        )
    values.update(inputs)
    return {
        "github": {"event_name": event, "ref": ref, "repository": "local/kt-release"},
        "inputs": values,
        "env": {k: str(v) for k, v in (workflow.get("env") or {}).items()},
    }


def decide(run: JobRun, by_job: Mapping[str, list[JobRun]], context: Mapping[str, Any]) -> tuple[bool, str]:
    """Whether `run` runs, given its needs' outcomes: GitHub's implicit success() unless the `if:`
    names a status function."""
    statuses = {r.key: r.status for need in run.needs for r in by_job[need]}
    bad = sorted(k for k, s in statuses.items() if s != "success")
    cond = run.condition.strip()
    if cond.startswith("${{") and cond.endswith("}}"):
        cond = cond[3:-2]
    explicit = bool(re.search(r"\b(always|failure|cancelled|success)\(", cond))
    if bad and not explicit:
        return False, f"needs {', '.join(bad)} ({', '.join(statuses[b] for b in bad)})"
    if cond and not evaluate(cond, {**context, "matrix": run.matrix}, statuses):
        return False, f"if: {cond}"
    return True, ""


def order(runs: list[JobRun]) -> list[JobRun]:
    """The runs in dependency order (unknown needs are errors)."""
    graph = {r.job_id: set(r.needs) for r in runs}
    missing = sorted({n for deps in graph.values() for n in deps} - set(graph))
    if missing:
        raise WorkflowError(f"jobs need unknown jobs {missing}")
    ids = list(graphlib.TopologicalSorter(graph).static_order())
    return sorted(runs, key=lambda r: (ids.index(r.job_id), r.key))


# --- running ------------------------------------------------------------------------------------------------


def _say(msg: str) -> None:
    print(f"[ci_local {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def _copy_into(files: list[Path], base: Path, dest: Path) -> None:
    for f in files:
        target = dest / f.relative_to(base)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(f, target)


def upload(job_dir: Path, spec: Mapping[str, Any], artifacts: Path) -> str:
    """actions/upload-artifact: copy the matched files into the run's artifact store."""
    name, pattern = str(spec["name"]), str(spec["path"]).strip()
    matches = (
        sorted(job_dir.glob(pattern.rstrip("/")))
        if any(c in pattern for c in "*?[")
        else [job_dir / pattern.rstrip("/")]
    )
    files: list[Path] = []
    for m in matches:
        files += sorted(p for p in m.rglob("*") if p.is_file()) if m.is_dir() else ([m] if m.is_file() else [])
    if not files and spec.get("if-no-files-found", "warn") == "error":
        raise JobFailed(f"upload-artifact {name}: no files match {pattern}")
    # GitHub stores paths relative to the least common ancestor of the matched paths
    roots = [m if m.is_dir() else m.parent for m in matches if m.exists()]
    base = Path(os.path.commonpath([str(r) for r in roots])) if roots else job_dir
    dest = artifacts / name
    if dest.exists():
        raise JobFailed(f"upload-artifact: an artifact named {name} already exists (v4 artifacts are immutable)")
    _copy_into(files, base, dest)
    return f"uploaded {len(files)} file(s) as {name}"


def download(job_dir: Path, spec: Mapping[str, Any], artifacts: Path) -> str:
    """actions/download-artifact: copy artifacts by name, or by pattern (merged or not)."""
    dest = job_dir / str(spec.get("path", "."))
    if spec.get("name"):
        chosen = [artifacts / str(spec["name"])]
        if not chosen[0].is_dir():
            raise JobFailed(f"download-artifact: no artifact named {spec['name']}")
    else:
        pattern = str(spec.get("pattern", "*"))
        chosen = sorted(p for p in artifacts.glob(pattern) if p.is_dir())
        if not chosen:
            raise JobFailed(f"download-artifact: no artifact matches {pattern}")
    merge = bool(spec.get("name")) or bool(spec.get("merge-multiple"))
    for a in chosen:
        _copy_into(sorted(p for p in a.rglob("*") if p.is_file()), a, dest if merge else dest / a.name)
    return f"downloaded {', '.join(a.name for a in chosen)} into {spec.get('path', '.')}"


@dataclass
class Local:
    """What stands in for what cannot run here."""

    index_url: str = ""  # the local pypiserver for publish jobs
    notes: list[str] = field(default_factory=list)


def replace_run(script: str, env: Mapping[str, str], local: Local) -> tuple[str, list[str]]:
    """The script with its unrunnable commands replaced, and the notes saying so."""
    notes: list[str] = []
    # `--python cp311` or `--python "${PYTHON}"` (a matrix variable, from the step's environment)
    m = re.search(r'nox -s build_wheels -- --python "?(?:\$\{?(\w+)\}?|(cp3\d+))"?', script)
    if m:
        python = m.group(2) or env.get(m.group(1), m.group(1))
        notes.append(
            "cibuildwheel needs a container engine: replaced by the host build (nox -s build_cuda), equivalent for "
            "the wheel's glibc floor: both link against glibc 2.28's stubs (kernel/tools/glibc_floor.py), not the "
            "glibc of the machine or image that builds, so both give manylinux_2_24 (the container's own glibc is "
            "2.28 too)"
        )
        cmd = "nox -s build_cuda && mkdir -p build/wheelhouse"
        if python == HOST_PYTHON:
            cmd += " && cp build/kt-kernel/out/*.whl build/wheelhouse/"
        else:
            notes.append(
                f"no CPython {python[2]}.{python[3:]} here: FIXTURE - the {HOST_PYTHON} wheel relabelled "
                f"{python} (never install it; CI builds the real one)"
            )
            cmd += f" && {sys.executable} -m maint.ci_local --relabel build/kt-kernel/out {python} build/wheelhouse"
        script = script.replace(m.group(0), cmd)
    m = re.search(r"nox -s publish -- .*", script)
    if m:
        if not local.index_url:
            raise JobFailed("a publish job runs, but no local index was started")
        notes.append(
            f"publishing to the local index {local.index_url} instead of {m.group(0).split()[5]}; "
            "attestations off (they need the CI's OIDC identity)"
        )
        # release.publish gives a 127.0.0.1 index throwaway credentials itself
        script = script.replace(
            m.group(0), f"nox -s publish -- --repository-url {local.index_url} --index-url {local.index_url}simple/"
        )
    return script, notes


def relabel(src_dir: Path, python: str, out: Path) -> Path:
    """FIXTURE: the host kt-kernel wheel relabelled for another CPython (tags, WHEEL, extension
    suffix, RECORD). Its extension is the host's binary: it must never be installed."""
    from packaging.utils import parse_wheel_filename

    from carriers import wheelio

    (wheel,) = sorted(src_dir.glob("kt_kernel-*.whl"))[:1]
    tags = parse_wheel_filename(wheel.name)[3]
    (old,) = {t.interpreter for t in tags}
    members = {n.replace(f".cpython-{old[2:]}-", f".cpython-{python[2:]}-"): d for n, d in wheelio.read(wheel).items()}
    new_tags = sorted(str(t).replace(f"{old}-{old}-", f"{python}-{python}-") for t in tags)
    wheelio.set_tags(members, new_tags)
    out.mkdir(parents=True, exist_ok=True)
    dest = out / wheel.name.replace(f"-{old}-{old}-", f"-{python}-{python}-")
    wheelio.write(dest, members, frozenset(n for n in members if n.endswith(".so")))
    return dest


def setup_python(versions: str, where: Path) -> tuple[Path, str]:
    """actions/setup-python here: each listed CPython found by base.interpreters (given, PATH, pyenv, uv,
    a Debian root is not one a job can use) and put on PATH as python3.N; the last listed is the default
    `python`, a fresh venv of this host's Python as before (nox runs in it). (The folder to put first on
    PATH, what was done.) A version with no interpreter fails the job, as setup-python fails in CI."""
    from base import interpreters

    wanted = [v.strip().strip('"') for v in versions.splitlines() if v.strip()]
    have = f"{sys.version_info.major}.{sys.version_info.minor}"
    if not wanted or wanted[-1] != have:
        raise JobFailed(
            f"setup-python {wanted}: the default (last) Python must be this host's {have}, which nox runs on"
        )
    shutil.rmtree(where, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", str(where)], check=True)
    done = [f"Python {have} in a fresh venv ({where})"]
    for version in dict.fromkeys(wanted[:-1]):
        if version == have:
            continue
        found = interpreters.find(version, sources=("given", "PATH", "pyenv", "uv"))
        if found.interpreter is None:
            raise JobFailed(f"setup-python {version}: {found.why_none()}")
        (where / "bin" / f"python{version}").symlink_to(found.interpreter.path)
        done.append(f"python{version}: CPython {found.interpreter.version} from {found.interpreter.source}")
    return where / "bin", "; ".join(done)


def run_job(run: JobRun, context: Mapping[str, Any], work: Path, repo: Path, local: Local, commit: str) -> None:
    """Run one job's steps in a fresh clone; raises on the first failing step."""
    job_dir = work / "jobs" / re.sub(r"[^\w.-]+", "_", run.key)
    shutil.rmtree(job_dir, ignore_errors=True)
    job_dir.parent.mkdir(parents=True, exist_ok=True)
    summary = work / "summary" / f"{job_dir.name}.md"
    summary.parent.mkdir(parents=True, exist_ok=True)
    summary.write_text("")
    ctx = {**context, "matrix": run.matrix}
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "NOX_"))}
    env |= {k: interpolate(v, ctx) for k, v in context["env"].items()}
    env |= {k: interpolate(v, ctx) for k, v in run.env.items()}
    env |= {
        "CI": "true",
        "KT_FRESH": "1",  # as the workflow: no stage is reused from the developer's records
        "GITHUB_ACTIONS": "true",
        "GITHUB_STEP_SUMMARY": str(summary),
        "GITHUB_EVENT_NAME": context["github"]["event_name"],
        "GITHUB_REF": context["github"]["ref"],
    }
    cwd = work
    for i, step in enumerate(run.steps, 1):
        label = step.get("name") or step.get("uses") or step.get("run", "").splitlines()[0]
        with_ = {k: interpolate(str(v), ctx) for k, v in (step.get("with") or {}).items()}
        uses = str(step.get("uses", "")).split("@")[0]
        t0 = time.perf_counter()
        if uses == "actions/checkout":
            subprocess.run(["git", "clone", "-q", "--no-hardlinks", str(repo), str(job_dir)], check=True)
            subprocess.run(["git", "-C", str(job_dir), "checkout", "-q", "--detach", commit], check=True)
            cwd = job_dir
            what = f"fresh clone of {repo} at {commit[:12]}"
        elif uses == "actions/setup-python":
            bin_dir, what = setup_python(with_.get("python-version", ""), work / "python" / job_dir.name)
            env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
        elif uses == "actions/upload-artifact":
            what = upload(cwd, with_, work / "artifacts")
        elif uses == "actions/download-artifact":
            what = download(cwd, with_, work / "artifacts")
        else:
            step_env = {**env, **{k: interpolate(str(v), ctx) for k, v in (step.get("env") or {}).items()}}
            script, notes = replace_run(interpolate(str(step["run"]), ctx), step_env, local)
            for n in notes:
                _say(f"{run.key}: NOTE: {n}")
                run.notes.append(n)
            proc = subprocess.run(["bash", "-eo", "pipefail", "-c", script], cwd=cwd, env=step_env, check=False)
            if proc.returncode != 0:
                raise JobFailed(f"step {i} ({label}) exited {proc.returncode}")
            what = "ok"
        _say(f"{run.key}: step {i} {label}: {what} ({time.perf_counter() - t0:.1f}s)")


def _head(repo: Path) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()


@contextmanager
def local_index(work: Path) -> Iterator[str]:
    """A pypiserver on 127.0.0.1 (uploads with any credentials), for the publish jobs."""
    packages = work / "index"
    packages.mkdir(parents=True, exist_ok=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    server = Path(sys.executable).with_name("pypi-server")
    exe = str(server) if server.is_file() else shutil.which("pypi-server")
    if exe is None:
        raise WorkflowError("pypi-server is missing: install lockfiles/ci.txt (nox -s ci_local does)")
    proc = subprocess.Popen(
        [exe, "run", "-i", "127.0.0.1", "-p", str(port), "-a", ".", "-P", ".", str(packages)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}/"
    try:
        for _ in range(100):
            try:
                urllib.request.urlopen(url + "simple/", timeout=1)  # noqa: S310 (http on 127.0.0.1)
                break
            except OSError:
                time.sleep(0.1)
        else:
            raise WorkflowError(f"pypiserver did not start on {url}")
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def execute(
    workflow: Mapping[str, Any],
    context: Mapping[str, Any],
    work: Path,
    repo: Path = ROOT,
    *,
    plan_only: bool = False,
    only: frozenset[str] = frozenset(),
) -> list[JobRun]:
    """Run (or with plan_only, plan) the workflow. `only`: re-run just these jobs, taking the others'
    artifacts from the previous run in `work` (GitHub's "re-run failed jobs")."""
    runs = order(expand(workflow))
    by_job: dict[str, list[JobRun]] = {}
    for r in runs:
        by_job.setdefault(r.job_id, []).append(r)
    if plan_only:
        for r in runs:  # assume every job that runs succeeds
            go, why = decide(r, by_job, context)
            r.status, r.reason = ("success", "planned") if go else ("skipped", why)
        return runs
    unknown = sorted(only - {r.job_id for r in runs})
    if unknown:
        raise WorkflowError(f"--only names jobs the workflow lacks: {unknown}")
    work.mkdir(parents=True, exist_ok=True)
    if not only:
        shutil.rmtree(work / "artifacts", ignore_errors=True)
    commit = _head(repo)  # every job checks out this commit, whatever lands meanwhile
    with local_index(work) as url:
        local = Local(index_url=url)
        for r in runs:
            if only and r.job_id not in only:
                r.status, r.reason = "success", "not re-run (--only): its artifacts are the previous run's"
                continue
            go, why = decide(r, by_job, context)
            if not go:
                r.status, r.reason = "skipped", why
                _say(f"{r.key}: skipped ({why})")
                continue
            _say(f"{r.key}: {r.name}")
            t0 = time.perf_counter()
            try:
                run_job(r, context, work, repo, local, commit)
                r.status = "success"
            except (JobFailed, OSError, subprocess.CalledProcessError) as exc:
                r.status, r.reason = "failure", str(exc)
                _say(f"{r.key}: FAILED: {exc}")
            r.seconds = round(time.perf_counter() - t0, 1)
    parts = [f"## {p.stem}\n\n{p.read_text()}" for p in sorted((work / "summary").glob("*.md")) if p.read_text()]
    (work / "summary.md").write_text("\n".join(parts))
    return runs


def main(argv: list[str] | None = None) -> int:
    """The runner's CLI; 1 if a job failed, 2 if the workflow cannot be run."""
    p = argparse.ArgumentParser(prog="nox -s ci_local --", description=__doc__.splitlines()[0])
    p.add_argument("--workflow", type=Path, default=WORKFLOW)
    p.add_argument("--event", default="push", choices=["push", "pull_request", "workflow_dispatch"])
    p.add_argument("--ref", default="refs/heads/main", help="github.ref, e.g. refs/tags/v0.6.1")
    p.add_argument("--input", action="append", default=[], metavar="KEY=VALUE", help="workflow_dispatch input")
    p.add_argument("--work", type=Path, default=paths.CI_LOCAL)
    p.add_argument("--plan", action="store_true", help="print which jobs would run, run nothing")
    p.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="JOB",
        help="re-run only this job (repeatable), with the other jobs' artifacts from the last run",
    )
    p.add_argument("--relabel", nargs=3, metavar=("SRC_DIR", "PYTHON", "OUT_DIR"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.relabel:
        dest = relabel(Path(args.relabel[0]), args.relabel[1], Path(args.relabel[2]))
        print(f"FIXTURE written: {dest} (relabelled, never install it)")
        return 0
    try:
        workflow = load(args.workflow)
        inputs = dict(kv.split("=", 1) for kv in args.input)
        context = event_context(workflow, args.event, args.ref, inputs)
        runs = execute(workflow, context, args.work, plan_only=args.plan, only=frozenset(args.only))
    except WorkflowError as exc:
        print(f"error: {args.workflow}: {exc}", file=sys.stderr)
        return 2
    width = max(len(r.key) for r in runs)
    print(f"\n{'job':<{width}}  {'status':<8} {'seconds':>8}  reason / notes")
    for r in runs:
        extra = "; ".join([r.reason, *r.notes]).strip("; ")
        print(f"{r.key:<{width}}  {r.status:<8} {r.seconds:>8}  {extra}")
    if not args.plan:
        (args.work / "jobs.json").write_text(
            json.dumps(
                [{k: getattr(r, k) for k in ("key", "status", "reason", "seconds", "notes")} for r in runs], indent=2
            )
            + "\n"
        )
    return 1 if any(r.status == "failure" for r in runs) else 0


if __name__ == "__main__":
    raise SystemExit(main())
