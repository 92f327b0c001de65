"""Every ingredient tried: in a copy of the repository, each tracked file is changed in turn (all of them)
and each allowlisted environment variable is set in turn, and exactly the stages that read it get a new
key: the kernel's stamp, the assembly, its wheel memo, the audit and three verification entries. Files no
stage reads (docs, tests, the benchmarks, the noxfile) change no key.

What a stage reads is written below once, by folder (READS): the hand list the derived keys
(base/stages.py, base/keys.py) are checked against. The derived import closure is itself checked
against import-linter's graph (grimp, which `nox -s lint` builds): the same packages for every entry."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import pytest

from base import keys, paths, stages
from tests import distkit
from tests.conftest import ROOT

CODE = ("carriers/", "audits/", "base/", "locks/")
KT = "kernel/python/kt_kernel/"
LADDER = f"{KT}cpu_variants.json"  # the audit policy's [isa] ladder (a real run's traced reads found it)
VERIFY = ("verify/", *CODE, "lockfiles/", f"{KT}doctor.py", f"{KT}_version.py", LADDER)
READS: dict[str, tuple[str, ...]] = {
    "kernel": ("kernel/", "lockfiles/toolchain.txt", "lockfiles/cuda.txt", "audits/policy/default.toml"),
    "assemble": (*CODE, "lockfiles/", f"{KT}_version.py", LADDER),
    "wheel memo": CODE,
    "audit": ("release/", "audits/", "base/", "locks/", "lockfiles/", LADDER),
    "verify-sft-cpu": VERIFY,
    "verify-resolve-sft-cp311": VERIFY,
    "verify-cp313": VERIFY,
}
READ_BY_NONE = ("README.md", "docs/", "tests/", "bench/", "maint/", "bundle/", "noxfile.py", ".github/", ".ci/")
ENTRIES = {
    "assemble": stages.ASSEMBLE_ENTRY,
    "audit": stages.AUDIT_ENTRY,
    **{f"verify ({e})": e for e in stages.VERIFY_ENTRIES.values()},
}


def _expected(rel: str) -> set[str]:
    return {name for name, reads in READS.items() if any(rel == r or rel.startswith(r) for r in reads if r)}


def _tracked() -> list[str]:
    out = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z"], capture_output=True, check=True).stdout
    return sorted(r for r in out.decode().split("\0") if r and (ROOT / r).is_file() and not (ROOT / r).is_symlink())


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Every tracked file in a copy, a stand-in kernel wheel and dist/, the paths pointed at the copy."""
    root = tmp_path_factory.mktemp("ingredients") / "repo"
    for rel in _tracked():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ROOT / rel, root / rel)
    out = root / "build" / "kt-kernel" / "out"
    out.mkdir(parents=True)
    (out / "kt_kernel-0.6.1-cp311-abi3-manylinux_2_34_x86_64.whl").write_bytes(b"kernel")
    dist = root / "dist"
    distkit.make_release(dist, {"x-1-py3-none-any.whl": b"wheel"})
    mp = pytest.MonkeyPatch()
    for name, value in {
        "ROOT": root,
        "BUILD": root / "build",
        "DIST": dist,
        "LOCKFILES": root / "lockfiles",
        "KERNEL": root / "kernel",
        "VERSION_FILE": root / "kernel/python/kt_kernel/_version.py",
        "STAGE_CACHE": root / "build/stage-cache",
    }.items():
        mp.setattr(paths, name, value)
    for var in keys.ENVIRONMENT:
        mp.delenv(var, raising=False)
    yield root
    mp.undo()


def _build_wheel(root: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location("kt_build_wheel_copy", root / "kernel/tools/build_wheel.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _keys(root: Path, bw: ModuleType) -> dict[str, str]:
    dist = root / "dist"
    return {
        "kernel": bw.inputs_digest([], []),
        "assemble": stages.assemble(root / "build/kt-kernel/out", dist, None).key,
        "wheel memo": stages.wheel_memo(),
        "audit": stages.audit(dist, [dist / "audit-report.json"], None, vulnerabilities="day").key,
        "verify-sft-cpu": stages.verify("sft-cpu", dist).key,
        "verify-resolve-sft-cp311": stages.verify("resolve-sft-cp311", dist, extra={"python": "3.11"}).key,
        "verify-cp313": stages.verify("cp313", dist, extra={"python": "3.13"}).key,
    }


def _tried(root: Path, change: Callable[[], Callable[[], None]]) -> set[str]:
    """The stages whose key `change` alters (it returns its own undo)."""
    bw = _build_wheel(root)
    before = _keys(root, bw)
    undo = change()
    try:
        after = _keys(root, bw)
    finally:
        undo()
    assert _keys(root, bw) == before, "undoing the change must give the keys back"
    return {name for name in before if before[name] != after[name]}


def test_every_file_changes_exactly_the_keys_of_the_stages_that_read_it(
    repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    memo = keys.Digests()  # one memo for the sweep; the changed file is forgotten before and after
    monkeypatch.setattr(stages, "_digests", lambda: memo)
    bw = _build_wheel(repo)
    before = _keys(repo, bw)
    wrong = []
    tried = _tracked()
    for rel in tried:
        path = repo / rel
        original = path.read_bytes()
        path.write_bytes(original + b"\n# changed by the ingredient test\n")
        memo.forget(path)
        try:
            after = _keys(repo, bw)
        finally:
            path.write_bytes(original)
            memo.forget(path)
        got = {name for name in before if before[name] != after[name]}
        if got != _expected(rel):
            wrong.append(f"{rel}: new keys for {sorted(got)}, expected {sorted(_expected(rel))}")
    assert not wrong, f"{len(wrong)} of {len(tried)} files:\n" + "\n".join(wrong)
    assert _keys(repo, bw) == before  # every file back as it was
    assert len(tried) >= 200
    for package in keys.root_packages(ROOT):  # every package and data file was among them
        assert any(r.startswith(f"{package}/") for r in tried)
    assert any(r.endswith(".patch") for r in tried)
    assert any(r.endswith(".pth") for r in tried)
    assert any(r.endswith(".toml") and r.startswith("audits/") for r in tried)


@pytest.mark.parametrize("rel", [r for r in READ_BY_NONE if not r.endswith("/")])
def test_what_no_stage_reads_changes_no_key(repo: Path, rel: str) -> None:
    assert _expected(rel) == set()


def test_a_new_file_in_a_package_changes_the_keys_of_its_readers(repo: Path) -> None:
    new = repo / "audits" / "policy" / "extra.toml"

    def change() -> Callable[[], None]:
        new.write_text("[x]\n")
        return new.unlink

    assert _tried(repo, change) == _expected("audits/policy/extra.toml")


@pytest.mark.parametrize("var", sorted(keys.ENVIRONMENT))
def test_each_allowlisted_variable_changes_exactly_the_stages_it_reaches(
    repo: Path, monkeypatch: pytest.MonkeyPatch, var: str
) -> None:
    def change() -> Callable[[], None]:
        monkeypatch.setenv(var, "/changed")
        return lambda: monkeypatch.delenv(var)

    kinds = keys.ENVIRONMENT[var]
    reached = {name for name in READS if any(name == k or name.startswith(f"{k}-") for k in kinds)}
    if "assemble" in kinds:
        reached.add("wheel memo")
    assert _tried(repo, change) == reached


def test_a_variable_outside_the_allowlist_changes_no_key(repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def change() -> Callable[[], None]:
        monkeypatch.setenv("KT_NOT_AN_INGREDIENT", "1")
        return lambda: monkeypatch.delenv("KT_NOT_AN_INGREDIENT")

    assert _tried(repo, change) == set()


def test_the_compiler_version_is_in_the_kernel_key(repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bw = _build_wheel(repo)
    before = bw.inputs_digest([], [])
    monkeypatch.setattr(keys, "toolchain", lambda nvcc="": {"cxx": "g++ (Debian 13.1.0) 13.1.0"})
    assert bw.inputs_digest([], []) != before


@pytest.mark.parametrize(
    ("value", "real"),
    [
        ("gcc", "gcc"),
        ("ccache gcc-12", "gcc-12"),
        ("/usr/bin/ccache /usr/bin/g++", "/usr/bin/g++"),
        ("sccache clang++ -std=c++17", "clang++"),
        ("env CCACHE_DIR=/x ccache gcc", "gcc"),
    ],
)
def test_the_kernel_key_asks_the_compiler_behind_any_launcher(value: str, real: str) -> None:
    """CC="ccache gcc" keys gcc's version, not ccache's."""
    assert keys.compiler(value) == real


def test_the_kernel_key_holds_nvcc_s_own_version_not_only_cuda_home(
    repo: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Another toolkit behind the same CUDA_HOME (upgraded in place) is another key."""
    bw = _build_wheel(repo)
    home = tmp_path / "cuda"
    (home / "bin").mkdir(parents=True)
    nvcc = home / "bin" / "nvcc"
    nvcc.write_text("#!/bin/sh\necho 'Cuda compilation tools, release 13.0, V13.0.48'\n")
    nvcc.chmod(0o755)
    monkeypatch.setenv("CUDA_HOME", str(home))
    keys.toolchain.cache_clear()
    before = bw.inputs_digest([], [])
    nvcc.write_text("#!/bin/sh\necho 'Cuda compilation tools, release 13.5, V13.5.37'\n")
    keys.toolchain.cache_clear()
    assert bw.inputs_digest([], []) != before
    assert "release 13.5" in keys.toolchain(str(nvcc))["nvcc"]
    keys.toolchain.cache_clear()


@pytest.mark.parametrize("entry", sorted(ENTRIES))
def test_the_derived_closure_is_the_import_graph_lint_builds(entry: str) -> None:
    grimp = pytest.importorskip("grimp", reason="grimp comes with import-linter (lockfiles/test.txt)")
    graph = grimp.build_graph(*keys.root_packages(ROOT), cache_dir=None)
    module = ENTRIES[entry]
    upstream = graph.find_upstream_modules(module) | {module}
    derived = set(keys.import_closure([module], ROOT))
    assert upstream <= derived, f"grimp sees imports the derivation misses: {sorted(upstream - derived)}"
    assert {m.split(".")[0] for m in upstream} == set(keys.packages_read([module], ROOT))


def test_the_cuobjdump_that_shapes_the_payload_is_the_locked_one_unless_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """KT_CUOBJDUMP (an override: in the assembly's and the audit's keys) before the locked one of this
    environment; one on PATH only for the audit of anyone's wheels, never for what the assembly writes."""
    from audits.readers import _cuda

    def tool(name: str, version: str) -> Path:
        path = tmp_path / name / "cuobjdump"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"#!/bin/sh\necho 'cuobjdump: NVIDIA (R) CUDA Object Utility'\necho '{version}'\n")
        path.chmod(0o755)
        return path

    locked, on_path, named = tool("locked", "V13.5.37"), tool("path", "V12.0"), tool("named", "V13.0")
    monkeypatch.setenv("PATH", str(on_path.parent))
    monkeypatch.delenv(_cuda.CUOBJDUMP_ENV, raising=False)
    monkeypatch.setattr(_cuda, "_TOOLS", {})
    monkeypatch.setattr(_cuda, "_locked", lambda: str(locked))
    assert _cuda.cuobjdump_tool(allow_path=False) == _cuda.Tool(str(locked), "locked", "V13.5.37")
    assert _cuda.cuobjdump_tool() == _cuda.Tool(str(locked), "locked", "V13.5.37")  # PATH's never wins
    monkeypatch.setenv(_cuda.CUOBJDUMP_ENV, str(named))
    assert _cuda.cuobjdump_tool(allow_path=False) == _cuda.Tool(str(named), "KT_CUOBJDUMP", "V13.0")
    monkeypatch.delenv(_cuda.CUOBJDUMP_ENV)
    monkeypatch.setattr(_cuda, "_locked", lambda: None)
    monkeypatch.setattr(_cuda, "_TOOLS", {})  # an environment's locked tool is looked up once per process
    assert _cuda.cuobjdump_tool(allow_path=False) is None
    assert _cuda.cuobjdump_tool() == _cuda.Tool(str(on_path), "PATH", "V12.0")
    assert keys.ENVIRONMENT["KT_CUOBJDUMP"] == ("assemble", "audit")
