"""One owner per release fact. Where a copy must stay (the audit never imports what it checks; the
kt_kernel runtime and the kernel's own build stand alone), the copy is pinned to its owner here."""

from __future__ import annotations

import datetime as dt
import importlib.util
import json
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

from audits.analyzers import manifest_rules, payload_rules
from audits.policy import load_policy
from audits.readers import _payload as payload_reader
from base import paths, version
from carriers import model, payload
from carriers.errors import DefinitionError
from carriers.graph import Graph

ROOT = Path(__file__).resolve().parents[2]


def _by_path(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None
    assert spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # dataclasses look their module up while the class is built
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def build_wheel() -> ModuleType:
    return _by_path("kt_build_wheel_owner", ROOT / "kernel" / "tools" / "build_wheel.py")


@pytest.fixture(scope="module")
def runtime() -> ModuleType:
    return _by_path("kt_payload_owner", ROOT / "kernel" / "python" / "kt_kernel" / "payload.py")


def test_the_part_folder_is_the_packers_and_the_audit_reads_the_same() -> None:
    assert f"/{model.PART_DIR}/" == payload_reader.PART_DIR
    carrier = model.load()["sglang-kt"]
    assert payload.part_member(carrier, 2, 5) == f"sglang/{model.PART_DIR}/cuda.tar.zst.02-of-05"


def test_the_license_folders_are_the_carriers_and_the_audit_reads_the_same() -> None:
    from audits.analyzers import license_rules
    from carriers import licensing

    assert (licensing.LICENSES, licensing.PAYLOAD_DIR) == (license_rules.LICENSES, license_rules.PAYLOAD_DIR)
    assert licensing._LICENSE_NAMES == license_rules._LEGACY


def test_the_build_manifest_member_is_one_path_for_the_packer_the_audit_and_the_runtime() -> None:
    assert manifest_rules.MANIFEST == payload.BUILD_MANIFEST == "kt_kernel/_build.json"
    cmake = (ROOT / "kernel" / "CMakeLists.txt").read_text()
    assert "set(KT_MANIFEST ${CMAKE_BINARY_DIR}/_build.json)" in cmake  # the kernel build writes it
    assert 'with_name("_build.json")' in (ROOT / "kernel/python/kt_kernel/payload.py").read_text()


def test_the_payload_manifest_member_is_the_policys(runtime: ModuleType) -> None:
    pol = load_policy()
    assert pol.payload is not None
    assert pol.payload.manifest_member == f"{runtime.MANIFEST_PACKAGE}/{runtime.MANIFEST_NAME}"
    assert pol.payload.zstd_window_log == runtime.MAX_WINDOW_LOG


def test_the_kt_version_and_release_date_are_read_alike_by_the_release_and_the_kernel_build(
    build_wheel: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SOURCE_DATE_EPOCH", raising=False)
    epoch = int(dt.datetime.combine(version.release_date(), dt.time(), tzinfo=dt.timezone.utc).timestamp())
    assert build_wheel.source_date_epoch() == str(epoch)
    assert model.kt_version() == version.kt_version()
    namespace: dict[str, str] = {}
    exec(paths.VERSION_FILE.read_text(), namespace)  # noqa: S102 - the repository's own _version.py
    assert version.kt_version() == namespace["__version__"]


def test_the_build_tree_is_one_tree(build_wheel: ModuleType) -> None:
    assert build_wheel.RELEASE_OUT == paths.KERNEL_OUT
    assert build_wheel.SHARDS in paths.KERNEL_SCRATCH
    assert all(p.is_relative_to(paths.BUILD) or p.is_relative_to(paths.KERNEL) for p in paths.LEFTOVERS)
    assert paths.CACHE not in paths.LEFTOVERS  # downloads stay
    assert paths.DIST not in paths.LEFTOVERS  # and the release


def test_the_wheel_budget_is_the_policys(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """By value: the report's budget bars follow the audit policy's budget, whatever it is."""
    import dataclasses

    from base import distdir
    from release import report

    wheel = distdir.Wheel("a", "1", "native", "a-1-py3-none-any.whl", "0" * 64, 50 << 20, ("3.11",), (), ())
    manifest = distdir.Manifest(1, "1", ("3.11",), "", (), (wheel,))
    shares = []
    for mib in (100, 200):
        policy = dataclasses.replace(load_policy(), wheel_budget_bytes=mib << 20)
        monkeypatch.setattr(report, "load_policy", lambda policy=policy: policy)
        page = report.render_html(manifest, {}, {}, None, tmp_path)
        shares += re.findall(r"class='bar[^']*'[^>]*></span> (\d+)%", page)
    assert shares == ["50", "25"]


@pytest.mark.parametrize(
    "requires",
    [
        {"a": ["b", "x>=1", 'c; extra == "more"'], "b": ["d"], "c": ["a"], "d": []},
        {"a": ["b; python_version >= '3.12'"], "b": ['a[x]; extra == "y"']},
        {"kt": ["k", "s"], "s": ["p1", "p2"], "p1": [], "p2": ["s"], "k": []},
    ],
)
def test_the_audits_walk_reaches_what_carriers_graph_reaches(requires: dict[str, list[str]]) -> None:
    wheels = {
        n: payload_reader.WheelSummary(Path(n), n, n, "1", (), tuple(r), (), None, "", ()) for n, r in requires.items()
    }
    graph = Graph(requires)
    for root in requires:
        assert payload_rules._reach(wheels, root) == graph.reach(root)


def test_every_policy_and_carrier_key_is_the_schemas() -> None:
    schema = json.loads((ROOT / "audits" / "policy" / "schema.json").read_text())
    assert schema["additionalProperties"] is False
    tables = [v for v in schema["properties"].values() if v.get("type") == "object" and "properties" in v]
    assert tables
    assert all(t.get("additionalProperties") is False for t in tables)
    assert not hasattr(__import__("audits.policy").policy, "_SCHEMA")
    assert not hasattr(model, "_KEYS")
    assert set(model.KINDS) == {"native", "umbrella", "fork", "repack"}


def _paths_from_file(path: Path) -> list[Path]:
    """The value of every `Path(__file__)` chain in a module (.resolve(), .parent, .parents[N]), evaluated."""
    import ast

    values = []
    for node in ast.walk(ast.parse(path.read_text())):
        steps: list[str | int] = []
        here: ast.AST = node
        while True:
            if isinstance(here, ast.Call) and isinstance(here.func, ast.Attribute) and here.func.attr == "resolve":
                here = here.func.value
            elif isinstance(here, ast.Attribute) and here.attr == "parent":
                steps.append("parent")
                here = here.value
            elif (
                isinstance(here, ast.Subscript)
                and isinstance(here.value, ast.Attribute)
                and here.value.attr == "parents"
                and isinstance(here.slice, ast.Constant)
                and isinstance(here.slice.value, int)
            ):
                steps.append(here.slice.value)
                here = here.value.value
            else:
                break
        is_file = isinstance(here, ast.Call) and isinstance(here.func, ast.Name) and here.func.id == "Path"
        if steps and is_file and isinstance(here, ast.Call) and ast.unparse(here.args[0]) == "__file__":
            value = path.resolve()
            for step in reversed(steps):
                value = value.parent if step == "parent" else value.parents[int(step)]
            values.append(value)
    return values


def test_nothing_in_the_stages_defines_its_own_root() -> None:
    """By value: any `Path(__file__)` chain in a stage that lands on the repository root, however spelled."""
    stages = ("base", "locks", "carriers", "verify", "release", "bundle", "bench", "maint")
    own = sorted(
        str(p.relative_to(ROOT))
        for s in stages
        for p in (ROOT / s).rglob("*.py")
        if "probes" not in p.parts and p != ROOT / "base" / "paths.py" and ROOT in _paths_from_file(p)
    )
    assert own == [], f"these compute the repository root themselves; import base.paths.ROOT: {own}"
    assert paths.ROOT.samefile(ROOT)
    assert ROOT in _paths_from_file(ROOT / "base" / "paths.py")  # the search finds the owner's own


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        (
            'upstream = "transformers"\n',
            'upstream = "transformers"\nsource = { gti = "https://example.invalid/peft.git", commit = "'
            + "a" * 40
            + '" }\n',
            r"unknown key source\.'gti' for a fork; did you mean 'git'\?",
        ),
        (
            'summary = "',
            'summary = 3\nnote = "',
            r"unknown key 'note' for a umbrella; known keys: extras, kind, payload_part",
        ),
    ],
)
def test_carriers_toml_keys_come_from_its_schema(tmp_path: Path, old: str, new: str, message: str) -> None:
    text = model.DEFINITIONS.read_text()
    assert old in text
    bad = tmp_path / "carriers.toml"
    bad.write_text(text.replace(old, new, 1))
    with pytest.raises(DefinitionError, match=message):
        model.load(bad, patches_dir=model.DEFINITIONS.parent / "patches", version="0.6.1")


def test_a_value_of_the_wrong_type_is_named_by_its_path(tmp_path: Path) -> None:
    text = model.DEFINITIONS.read_text()
    line = 'summary = "KTransformers: CPU/GPU hybrid MoE inference and fine-tuning (umbrella package)"'
    assert line in text
    bad = tmp_path / "carriers.toml"
    bad.write_text(text.replace(line, 'summary = ["not", "a", "string"]', 1))
    with pytest.raises(DefinitionError, match=r"ktransformers\.summary: .* is not of type 'string'"):
        model.load(bad, patches_dir=model.DEFINITIONS.parent / "patches", version="0.6.1")


def test_a_nested_policy_key_gets_its_closest_known_one(tmp_path: Path) -> None:
    from audits.errors import PolicyError

    text = (ROOT / "audits" / "policy" / "default.toml").read_text()
    assert "\nallowed = " in text
    bad = tmp_path / "default.toml"
    bad.write_text(text.replace("\nallowed = ", "\nalowed = ", 1))
    with pytest.raises(PolicyError, match=r"unknown key elf\.exports\.'alowed'; did you mean 'allowed'\?"):
        load_policy(bad)


def test_only_the_build_sessions_write_the_release_kernel_input() -> None:
    """build/kt-kernel/out feeds the release; nox -s bench builds its CPU-only kt-kernel elsewhere."""
    import ast

    tree = ast.parse((ROOT / "noxfile.py").read_text())
    writers = set()
    for fn in (n for n in tree.body if isinstance(n, ast.FunctionDef)):
        for call in (c for c in ast.walk(fn) if isinstance(c, ast.Call)):
            words = [a.value for a in call.args if isinstance(a, ast.Constant)]
            if "kernel/tools/build_wheel.py" in words and any(
                isinstance(n, ast.Name) and n.id == "KERNEL_OUT" for a in call.args for n in ast.walk(a)
            ):
                writers.add(fn.name)
    assert writers == {"build_all", "tests"}, writers  # (build_cpu and build_cuda pass it through `out`)
    from bench.__main__ import kernel_build

    built = kernel_build()  # bench's own kt-kernel goes to its own folder
    assert built[built.index("--dist") + 1] == str(paths.BENCH_KERNEL) != str(paths.KERNEL_OUT)
