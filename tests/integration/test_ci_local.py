"""The local workflow runner (maint/ci_local.py): the real release.yml planned for each event, and
a small workflow executed end to end in fresh clones - matrix, artifacts handed on by name and by
pattern, the step summary, `if:` conditions, and a failing job stopping its dependants."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from maint import ci_local

REAL = ci_local.load()


def _plan(event: str, ref: str = "refs/heads/main", **inputs: str) -> dict[str, str]:
    ctx = ci_local.event_context(REAL, event, ref, inputs)
    return {r.key: r.status for r in ci_local.execute(REAL, ctx, Path("/nonexistent"), plan_only=True)}


def test_the_release_workflow_plan_per_event() -> None:
    tag = _plan("push", "refs/tags/v0.6.1")
    assert list(tag)[:3] == ["preflight", "kernel", "carriers"]  # dependency order
    assert sorted(list(tag)[3:7]) == ["audit", "verify (3.11)", "verify (3.12)", "verify (3.13)"]
    assert list(tag)[7] == "verdict"  # every Python's evidence judged once, on every event
    assert tag["publish-pypi"] == "success"
    assert tag["publish-testpypi"] == "skipped"
    test = _plan("workflow_dispatch", target="testpypi")
    assert (test["publish-testpypi"], test["publish-pypi"]) == ("success", "skipped")
    pr = _plan("pull_request")
    assert (pr["publish-testpypi"], pr["publish-pypi"]) == ("skipped", "skipped")
    assert [pr[f"verify ({v})"] for v in ("3.11", "3.12", "3.13")] == ["success"] * 3
    assert pr["verdict"] == "success"
    default = _plan("workflow_dispatch")  # target defaults to build-only
    assert (default["publish-testpypi"], default["publish-pypi"]) == ("skipped", "skipped")


def test_unknown_inputs_and_actions_are_errors(tmp_path: Path) -> None:
    with pytest.raises(ci_local.WorkflowError, match="unknown workflow_dispatch inputs"):
        ci_local.event_context(REAL, "workflow_dispatch", "refs/heads/main", {"traget": "pypi"})
    wf = tmp_path / "wf.yml"
    wf.write_text("on: push\njobs:\n  a:\n    runs-on: x\n    steps:\n      - uses: someone/deploy@v1\n")
    with pytest.raises(ci_local.WorkflowError, match="someone/deploy@v1"):
        ci_local.expand(ci_local.load(wf))


def test_expressions() -> None:
    ctx = {"github": {"event_name": "push", "ref": "refs/tags/v1"}, "inputs": {"target": "pypi"}}
    ev = ci_local.evaluate
    assert ev("github.event_name == 'push' && startsWith(github.ref, 'refs/tags/v')", ctx) is True
    assert ev("!(inputs.target == 'pypi') || github.event_name != 'push'", ctx) is False
    assert ev("'it''s' == 'IT''S'", ctx) is True  # quotes escaped by doubling; == ignores case
    with pytest.raises(ci_local.WorkflowError, match="unknown context"):
        ev("secrets.TOKEN == 'x'", ctx)


WORKFLOW = textwrap.dedent("""\
    name: demo
    on:
      push:
    env:
      GREETING: hello
    jobs:
      build:
        strategy:
          matrix:
            py: [a, b]
        runs-on: ubuntu-24.04
        steps:
          - uses: actions/checkout@v4
          - uses: actions/setup-python@v5
            with:
              python-version: "PYVER"
          - run: |
              mkdir -p out
              python -c "import sys; print(sys.prefix)" > out/${{ matrix.py }}.txt
              echo "$GREETING ${{ matrix.py }}" >> out/${{ matrix.py }}.txt
              echo "built ${{ matrix.py }}" >> "$GITHUB_STEP_SUMMARY"
          - uses: actions/upload-artifact@v4
            with:
              name: w-${{ matrix.py }}
              path: out/*.txt
              if-no-files-found: error
      collect:
        needs: build
        runs-on: ubuntu-24.04
        steps:
          - uses: actions/checkout@v4
          - uses: actions/download-artifact@v4
            with:
              pattern: w-*
              merge-multiple: true
              path: got
          - run: test "$(cat got/a.txt got/b.txt | grep -c hello)" = 2 && cat VERSION got/*.txt > all.txt
          - uses: actions/upload-artifact@v4
            with:
              name: all
              path: all.txt
      tag-only:
        needs: collect
        if: startsWith(github.ref, 'refs/tags/')
        runs-on: ubuntu-24.04
        steps:
          - run: exit 9
      broken:
        needs: collect
        runs-on: ubuntu-24.04
        steps:
          - uses: actions/checkout@v4
          - run: exit 3
      after-broken:
        needs: broken
        runs-on: ubuntu-24.04
        steps:
          - run: echo never
      report:
        needs: broken
        if: always()
        runs-on: ubuntu-24.04
        steps:
          - uses: actions/download-artifact@v4
            with:
              name: all
              path: final
          - run: grep -q "hello a" final/all.txt
    """)


def test_a_workflow_runs_end_to_end_in_fresh_clones(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "VERSION").write_text("v-demo\n")
    for cmd in (
        ["init", "-q"],
        ["add", "VERSION"],
        ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x"],
    ):
        subprocess.run(["git", "-C", str(repo), *cmd], check=True)
    wf = tmp_path / "wf.yml"
    wf.write_text(WORKFLOW.replace("PYVER", f"{sys.version_info.major}.{sys.version_info.minor}"))
    workflow = ci_local.load(wf)
    work = tmp_path / "work"
    runs = {
        r.key: r
        for r in ci_local.execute(workflow, ci_local.event_context(workflow, "push", "refs/heads/main", {}), work, repo)
    }
    assert {k: r.status for k, r in runs.items()} == {
        "build (a)": "success",
        "build (b)": "success",
        "collect": "success",
        "tag-only": "skipped",
        "broken": "failure",
        "after-broken": "skipped",
        "report": "success",
    }
    assert runs["tag-only"].reason.startswith("if: startsWith")
    assert runs["broken"].reason == "step 2 (exit 3) exited 3"
    assert runs["after-broken"].reason == "needs broken (failure)"
    merged = (work / "artifacts" / "all" / "all.txt").read_text()
    assert merged.startswith("v-demo\n")  # the checkout is a clone of the repo's HEAD
    assert str(work / "python") in merged  # setup-python put a fresh venv first on PATH
    summary = (work / "summary.md").read_text()
    assert "built a" in summary
    assert "built b" in summary
    assert not (work / "jobs" / "tag-only").exists()


@pytest.mark.parametrize("line", ["nox -s build_wheels -- --python cp311", 'nox -s build_wheels -- --python "${PY}"'])
def test_the_container_build_is_replaced_by_the_host_build_saying_so(line: str) -> None:
    """The kernel job's cibuildwheel step, written with the Python literal (the abi3 build) or from the
    matrix, never reaches cibuildwheel here: no container engine; the host build stands in, and says so."""
    script, notes = ci_local.replace_run(f"set -e\n{line}\n", {"PY": "cp311"}, ci_local.Local())
    assert "build_wheels" not in script
    assert "nox -s build_cuda" in script
    assert any("replaced by the host build" in n for n in notes)


def test_the_release_workflows_kernel_job_runs_here() -> None:
    """Every run step of the real workflow's kernel job is one ci_local can run: its cibuildwheel line matches."""
    text = ci_local.WORKFLOW.read_text()
    runs = [ln.split("run:", 1)[1].strip() for ln in text.splitlines() if "run: nox -s build_wheels" in ln]
    assert runs, "the workflow builds the kernel with nox -s build_wheels"
    for run in runs:
        script, _ = ci_local.replace_run(run, {}, ci_local.Local())
        assert "build_wheels" not in script, run
