"""base.stagecache and base.stages: a stage is reused only when every ingredient of its key and every
output it wrote are the bytes of its last success; each ingredient changed alone re-runs exactly the
stages that depend on it; a corrupted record is detected and re-run, never trusted."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from base import paths, stagecache, stages


def test_a_stage_is_reused_until_an_ingredient_or_an_output_changes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out.txt"
    out.write_text("result")
    stage = stagecache.Stage("s", {"a": "1", "b": "2"}, outputs=[out], cache=tmp_path / "c")
    assert stage.reuse() is None
    assert "s: running (no record of a previous run)" in capsys.readouterr().out
    stage.done({"n": 3})
    hit = stagecache.Stage("s", {"b": "2", "a": "1"}, cache=tmp_path / "c").reuse()
    assert hit is not None
    assert hit.result == {"n": 3}
    assert hit.key == stage.key
    assert "s: reused, key " in capsys.readouterr().out
    assert stagecache.Stage("s", {"a": "1", "b": "3"}, cache=tmp_path / "c").why_not() == "changed: b"
    assert stagecache.Stage("s", {"a": "1"}, cache=tmp_path / "c").why_not() == "changed: b (gone)"
    assert stagecache.Stage("s", {"a": "1", "b": "2"}, cache=tmp_path / "c", fresh=True).reuse() is None
    out.write_text("edited")
    assert stagecache.Stage("s", {"a": "1", "b": "2"}, cache=tmp_path / "c").why_not() == (
        f"output {out} changed since it was produced"
    )
    out.unlink()
    assert stagecache.Stage("s", {"a": "1", "b": "2"}, cache=tmp_path / "c").why_not() == f"output {out} is missing"


def test_kt_fresh_runs_every_stage(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stagecache.Stage("s", {"a": "1"}, cache=tmp_path).done()
    monkeypatch.setenv("KT_FRESH", "1")
    assert stagecache.Stage("s", {"a": "1"}, cache=tmp_path).why_not() == "--fresh: every stage runs"
    monkeypatch.setenv("KT_FRESH", "0")
    assert stagecache.Stage("s", {"a": "1"}, cache=tmp_path).why_not() is None


@pytest.mark.parametrize(
    "corrupt",
    [
        lambda text: text.replace('"n": 3', '"n": 4'),  # a result edited by hand: the seal no longer holds
        lambda text: text[: len(text) // 2],  # truncated
        lambda text: "[]",  # valid JSON, not a record
    ],
)
def test_a_corrupted_record_is_detected_and_re_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], corrupt: object
) -> None:
    stagecache.Stage("s", {"a": "1"}, cache=tmp_path).done({"n": 3})
    record = tmp_path / "s.json"
    record.write_text(corrupt(record.read_text()))  # type: ignore[operator]
    assert stagecache.Stage("s", {"a": "1"}, cache=tmp_path).reuse() is None
    assert "the record" in capsys.readouterr().out
    assert "s" not in stagecache.last_outcomes(tmp_path)
    stagecache.Stage("s", {"a": "1"}, cache=tmp_path).done({"n": 3})  # re-run: recorded afresh
    assert stagecache.Stage("s", {"a": "1"}, cache=tmp_path).reuse() is not None


def test_the_dist_key_re_hashes_every_listed_file(tmp_path: Path) -> None:
    (tmp_path / "a.whl").write_bytes(b"a")
    (tmp_path / "SHA256SUMS").write_text(f"{stagecache.file_sha256(tmp_path / 'a.whl')}  a.whl\n")
    key = stagecache.dist_sha256(tmp_path)
    assert key == stagecache.dist_sha256(tmp_path)
    (tmp_path / "a.whl").write_bytes(b"b")
    with pytest.raises(stagecache.DistError, match=r"a.whl: sha256 .* differs from SHA256SUMS"):
        stagecache.dist_sha256(tmp_path)
    (tmp_path / "a.whl").unlink()
    with pytest.raises(stagecache.DistError, match="listed in SHA256SUMS but unreadable"):
        stagecache.dist_sha256(tmp_path)
    with pytest.raises(stagecache.DistError, match="SHA256SUMS is missing"):
        stagecache.dist_sha256(tmp_path / "nowhere")


@pytest.fixture
def tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A stand-in project: the packages, locks, a kernel wheel and a dist/ the stage keys are made of."""
    root = tmp_path / "root"
    files = {
        "carriers/assemble.py": "x = 1\n",
        "carriers/patches/transformers-kt/0001.patch": "--- a\n+++ b\n",
        "audits/core.py": "y = 1\n",
        "audits/policy/default.toml": "[size]\nwheel_budget_mib = 100\n",
        "verify/serve.py": "z = 1\n",
        "base/paths.py": "\n",
        "locks/read.py": "\n",
        "lockfiles/audit.txt": "a==1 --hash=sha256:00\n",
        "lockfiles/vulns.txt": "pip-audit==2 --hash=sha256:00\n",
        "lockfiles/serve.txt": "s==1 --hash=sha256:00\n",
        "out/kt_kernel-0.6.1-cp311-abi3-manylinux_2_34_x86_64.whl": "kernel",
        "dist/x-1-py3-none-any.whl": "wheel",
    }
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    wheel = root / "dist/x-1-py3-none-any.whl"
    (root / "dist/SHA256SUMS").write_text(f"{stagecache.file_sha256(wheel)}  {wheel.name}\n")
    (root / "dist/manifest.json").write_text("{}\n")
    monkeypatch.setattr(paths, "ROOT", root)
    monkeypatch.setattr(paths, "LOCKFILES", root / "lockfiles")
    code = {n: root / n for n in ("carriers", "audits", "verify", "base", "locks")}
    monkeypatch.setattr(stages, "CODE_BASE", (code["base"], code["locks"]))
    monkeypatch.setattr(stages, "ASSEMBLE_CODE", (code["carriers"], code["audits"], code["base"], code["locks"]))
    monkeypatch.setattr(stages, "AUDIT_CODE", (code["audits"],))
    monkeypatch.setattr(stages, "VERIFY_CODE", (code["verify"], code["carriers"], code["base"], code["locks"]))
    return root


def _stages(root: Path, cache: Path) -> dict[str, stagecache.Stage]:
    dist = root / "dist"
    reports = [dist / "audit-report.json"]
    return {
        "assemble": stages.assemble(root / "out", dist, None),
        "audit": stages.audit(dist, reports, None),
        "verify": stages.verify("serve", dist),
    }


def _reran(root: Path, cache: Path, monkeypatch: pytest.MonkeyPatch) -> set[str]:
    monkeypatch.setattr(stagecache, "CACHE", cache)
    return {name for name, s in _stages(root, cache).items() if s.why_not() is not None}


def _record_all(root: Path, cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stagecache, "CACHE", cache)
    (root / "dist/audit-report.json").write_text("{}\n")
    for name, s in _stages(root, cache).items():
        if name == "assemble":
            s.outputs = stages.assembled_outputs(root / "dist")
        s.done({"ok": True})


def _edit(path: Path) -> None:
    path.write_text(path.read_text() + "# one more line\n")


Edit = Callable[[Path], object]
EDITS: dict[str, tuple[Edit, set[str]]] = {
    "a patch byte": (lambda r: _edit(r / "carriers/patches/transformers-kt/0001.patch"), {"assemble", "verify"}),
    "the carriers' code": (lambda r: _edit(r / "carriers/assemble.py"), {"assemble", "verify"}),
    "a profile's lock": (lambda r: _edit(r / "lockfiles/serve.txt"), {"assemble", "verify"}),
    "the audit's lock": (lambda r: _edit(r / "lockfiles/audit.txt"), {"assemble", "audit", "verify"}),
    "a policy value": (
        lambda r: (r / "audits/policy/default.toml").write_text("[size]\nwheel_budget_mib = 90\n"),
        {"assemble", "audit"},
    ),
    "a line of the verification code": (lambda r: _edit(r / "verify/serve.py"), {"verify"}),
    "the kernel wheel": (
        lambda r: (r / "out/kt_kernel-0.6.1-cp311-abi3-manylinux_2_34_x86_64.whl").write_text("kernel 2"),
        {"assemble"},
    ),
    "a wheel of dist/ (re-assembled)": (
        lambda r: (
            (r / "dist/x-1-py3-none-any.whl").write_text("wheel 2"),
            (r / "dist/SHA256SUMS").write_text(
                f"{stagecache.file_sha256(r / 'dist/x-1-py3-none-any.whl')}  x-1-py3-none-any.whl\n"
            ),
        ),
        {"assemble", "audit", "verify"},
    ),
    "the audit's report, edited": (lambda r: (r / "dist/audit-report.json").write_text("[]\n"), {"audit"}),
}


@pytest.mark.parametrize("what", list(EDITS))
def test_each_ingredient_re_runs_exactly_the_stages_that_depend_on_it(
    tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, what: str
) -> None:
    cache = tmp_path / "cache"
    _record_all(tree, cache, monkeypatch)
    assert _reran(tree, cache, monkeypatch) == set()  # nothing changed: every stage reused
    edit, expected = EDITS[what]
    edit(tree)
    assert _reran(tree, cache, monkeypatch) == expected


def test_the_python_and_the_cpu_are_ingredients(tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "cache"
    _record_all(tree, cache, monkeypatch)
    monkeypatch.setattr(stagecache, "cpu_sha256", lambda: "another CPU")
    assert _reran(tree, cache, monkeypatch) == {"verify"}  # the kernel picks its variant by the CPU
    monkeypatch.setattr(stagecache, "python_sha256", lambda: "CPython 3.12")
    assert _reran(tree, cache, monkeypatch) == {"assemble", "audit", "verify"}


def test_a_profile_that_installs_nothing_of_dist_survives_a_new_build(
    tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(stagecache, "CACHE", tmp_path / "cache")
    stages.verify("lf-standard", tree / "dist", stages.DIST_FREE).done({"ok": True})
    EDITS["a wheel of dist/ (re-assembled)"][0](tree)
    assert stages.verify("lf-standard", tree / "dist", stages.DIST_FREE).why_not() is None
    _edit(tree / "lockfiles/serve.txt")  # but its locks are still an ingredient
    assert stages.verify("lf-standard", tree / "dist", stages.DIST_FREE).why_not() == "changed: locks"


def test_a_miss_names_what_changed(tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "cache"
    _record_all(tree, cache, monkeypatch)
    _edit(tree / "verify/serve.py")
    assert stages.verify("serve", tree / "dist").why_not() == "changed: code:verify"
    record = json.loads((cache / "verify-serve.json").read_text())
    assert record["result"] == {"ok": True}
    assert record["last"]["outcome"] == "ran"


def test_the_release_bench_reads_the_lines_the_stage_cache_prints(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from bench.release import outcomes

    stagecache.Stage("assemble", {"a": "1"}, cache=tmp_path).done()
    stagecache.Stage("assemble", {"a": "1"}, cache=tmp_path).reuse()
    stagecache.Stage("audit", {"a": "1"}, cache=tmp_path).reuse()
    kernel = "kt-kernel: /x/kt_kernel-0.6.1.whl was built from these inputs (key 1, produced t): reused, not rebuilt\n"
    out = capsys.readouterr().out
    assert outcomes(out, builds_kernel=False) == (["audit"], ["assemble"])
    assert outcomes(kernel + out, builds_kernel=True) == (["audit"], ["kt-kernel", "assemble"])
    assert outcomes(out, builds_kernel=True) == (["kt-kernel", "audit"], ["assemble"])
