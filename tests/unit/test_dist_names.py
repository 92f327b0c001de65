"""Lookups by distribution name (code asks version("peft"); the release installs peft-kt):
the reader that finds them in Python source, the release-level rule (dist.name-lookup,
dist.upstream-record) on wheels built here, and the alias that answers them (carriers/alias),
exercised through a real .pth in a real site directory."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from audits.analyzers import dist_rules
from audits.core import run
from audits.policy import load_policy
from audits.readers._python import find_lookups
from carriers import transform
from carriers.alias import _kt_dist_alias
from carriers.model import ALIAS_DIR
from tests.conftest import KT_SRC, load_source_module
from tests.wheelkit import pure_wheel_members, read_members, write_wheel

SOURCE = b"""\
import importlib.metadata
import pkg_resources
from importlib.metadata import version as v, PackageNotFoundError
from importlib.resources import files
from transformers.utils.versions import require_version

__version__ = v("trl")
A = importlib.metadata.version("transformers")
B = pkg_resources.get_distribution("peft").version
require_version("accelerate>=1.0", "pip install accelerate")
C = files("trl")  # importlib.resources: a package's files, no lookup
D = _is_package_available("peft")
s = 'version("peft")'  # a string, not a call
E = importlib.metadata.version(name)  # not a literal: the reader cannot know
import importlib.metadata as md
F = md.metadata("sglang")
check_version("transformers>=4.55.0,<=5.6.0")  # LlamaFactory's check_dependencies
"""


def test_the_reader_finds_each_lookup_by_a_literal_name() -> None:
    got = [(lk.line, lk.api, lk.name, lk.call) for lk in find_lookups("pkg/mod.py", SOURCE)]
    assert got == [
        (7, "importlib.metadata", "trl", "v"),
        (8, "importlib.metadata", "transformers", "importlib.metadata.version"),
        (9, "pkg_resources", "peft", "pkg_resources.get_distribution"),
        (10, "helper", "accelerate", "require_version"),
        (12, "helper", "peft", "_is_package_available"),
        (16, "importlib.metadata", "sglang", "md.metadata"),
        (17, "helper", "transformers", "check_version"),
    ]
    assert find_lookups("bad.py", b"def (:\n version('x')") == ()  # not Python 3: nothing, no error


def _release(tmp: Path, *, alias: bool, consumer_source: bytes, record: bool = True) -> Path:
    """demo-kt (renamed from demo, its record), and app, whose code looks demo up by name."""
    dist = tmp / "dist"
    dist.mkdir()
    fork = pure_wheel_members("demo_kt", "2.0.post1")
    fork["demo/__init__.py"] = fork.pop("demo_kt/__init__.py")
    if record:
        fork["demo_kt-2.0.post1.dist-info/kt_upstream.json"] = (
            b'{"carrier": "demo-kt", "name": "demo", "version": "2.0"}\n'
        )
    if alias:
        for name in dist_rules.ALIAS_FILES:
            fork[name] = (ALIAS_DIR / name).read_bytes()
    write_wheel(dist / "demo_kt-2.0.post1-py3-none-any.whl", fork)
    app = pure_wheel_members("app", "1.0")
    app["app/lookup.py"] = consumer_source
    write_wheel(dist / "app-1.0-py3-none-any.whl", app)
    return dist


def _findings(dist: Path, rule: str) -> list[dict[str, str]]:
    report = run([dist], load_policy())
    return [f for f in report["findings"] if f["rule"] == rule]


@pytest.mark.parametrize(
    ("alias", "source", "severity", "says"),
    [
        (
            False,
            b'import importlib.metadata\nV = importlib.metadata.version("demo")\n',
            "error",
            "no wheel of the release",
        ),
        (True, b'from importlib.metadata import version\nV = version("demo")\n', "info", "answered as demo 2.0 by"),
        (True, b'import pkg_resources\nV = pkg_resources.get_distribution("demo")\n', "error", "never asks the alias"),
    ],
    ids=["no-alias", "alias", "pkg_resources"],
)
def test_a_lookup_of_a_renamed_name(tmp_path: Path, alias: bool, source: bytes, severity: str, says: str) -> None:
    """Without the alias an error, answered by it info, through pkg_resources always an error."""
    (f,) = _findings(_release(tmp_path, alias=alias, consumer_source=source), "dist.name-lookup")
    assert f["severity"] == severity
    assert f["wheel"] == "app-1.0-py3-none-any.whl"
    assert f["member"] == "app/lookup.py:2"
    assert "installs as demo-kt" in f["message"]
    assert says in f["message"]


def test_a_renamed_wheel_without_its_record_is_an_error(tmp_path: Path) -> None:
    dist = _release(tmp_path, alias=True, record=False, consumer_source=b"X = 1\n")
    (f,) = _findings(dist, "dist.upstream-record")
    assert f["wheel"] == "demo_kt-2.0.post1-py3-none-any.whl"
    assert "no .dist-info/kt_upstream.json" in f["message"]


def test_an_unreadable_record_is_an_error(tmp_path: Path) -> None:
    dist = _release(tmp_path, alias=True, consumer_source=b"X = 1\n")
    fork = dist / "demo_kt-2.0.post1-py3-none-any.whl"
    members = read_members(fork)
    members["demo_kt-2.0.post1.dist-info/kt_upstream.json"] = b'{"carrier": "demo-kt", "name": "demo"'
    write_wheel(fork, members)
    (f,) = _findings(dist, "dist.upstream-record")
    assert f["member"] == "kt_upstream.json"
    assert "not JSON" in f["message"]
    members["demo_kt-2.0.post1.dist-info/kt_upstream.json"] = b'{"carrier": "demo-kt", "name": 3, "version": "2"}'
    write_wheel(fork, members)
    (f,) = _findings(dist, "dist.upstream-record")
    assert "at $.name: 3 is not of type 'string'" in f["message"]


def test_a_third_party_wheel_named_kt_is_not_a_renamed_fork(tmp_path: Path) -> None:
    """Outside a KT release (no wheel with a record or the alias) a name ending in -kt is just a name."""
    dist = tmp_path / "dist"
    dist.mkdir()
    write_wheel(dist / "lib_kt-1.0-py3-none-any.whl", pure_wheel_members("lib_kt", "1.0"))
    assert _findings(dist, "dist.upstream-record") == []


def test_nothing_renamed_nothing_found() -> None:
    lookups = find_lookups("m.py", b'from importlib.metadata import version\nversion("numpy")\n')
    names = dist_rules.DistNames("numpy-2.0-cp311-cp311-any.whl", "numpy", lookups, None, False)
    assert dist_rules.name_lookups([names]) == []


def test_the_audit_and_the_carriers_name_the_same_files() -> None:
    assert dist_rules.UPSTREAM_FILE == _kt_dist_alias.UPSTREAM_FILE
    assert load_source_module("kt_doctor_names", KT_SRC / "doctor.py").UPSTREAM_FILE == dist_rules.UPSTREAM_FILE
    assert dist_rules.ALIAS_FILES == transform.ALIAS_FILES
    assert sorted(
        p.name for p in ALIAS_DIR.iterdir() if p.suffix in (".py", ".pth") and p.stem != "__init__"
    ) == sorted(transform.ALIAS_FILES)


PROBE = r"""
import json, site, sys
site.addsitedir(sys.argv[1])  # processes the .pth, as the interpreter does for site-packages
import importlib.metadata as md
out = {}
def get(fn):
    try:
        return fn()
    except md.PackageNotFoundError:
        return "not found"
out["finders"] = sum(type(f).__name__ == "KTDistAlias" for f in sys.meta_path)
out["transformers"] = [get(lambda: md.version("transformers")), get(lambda: md.metadata("Transformers")["Name"])]
out["fork itself"] = get(lambda: md.version("transformers-kt"))
out["peft"] = get(lambda: md.version("peft"))
out["norecord"] = get(lambda: md.version("norecord"))
out["nothing"] = get(lambda: md.version("nothing"))
out["requires"] = get(lambda: md.requires("transformers"))
# what code past the public API reads (tvm_ffi finds xgrammar's library by distribution("xgrammar")._path)
d = md.distribution("transformers")
out["as installed"] = [
    isinstance(d, md.PathDistribution), d._path.name, str(d.locate_file("x")).endswith("site-packages/x")
]
out["listing"] = sorted(d.metadata["Name"] for d in md.distributions(path=[sys.argv[1]]))
if len(sys.argv) > 2:
    sys.path.insert(0, sys.argv[2])  # an upstream installed ahead of the fork
    out["upstream first"] = md.version("transformers")
print(json.dumps(out))
"""


def _dist_info(site: Path, name: str, version: str, upstream: dict[str, str] | None = None) -> None:
    di = site / f"{name.replace('-', '_')}-{version}.dist-info"
    di.mkdir(parents=True)
    (di / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\nRequires-Dist: torch>=2\n")
    if upstream:
        (di / "kt_upstream.json").write_text(json.dumps(upstream))


def test_the_alias_answers_by_the_upstream_name_and_changes_no_listing(tmp_path: Path) -> None:
    site = tmp_path / "site-packages"
    site.mkdir()
    for name in transform.ALIAS_FILES:
        shutil.copy(ALIAS_DIR / name, site / name)
    _dist_info(
        site,
        "transformers-kt",
        "5.19.0.post1",
        {"carrier": "transformers-kt", "name": "transformers", "version": "5.19.0"},
    )
    _dist_info(site, "peft-kt", "0.21.2", {"carrier": "peft-kt", "name": "peft", "version": "0.21.2"})
    _dist_info(site, "norecord-kt", "1.0")
    upstream = tmp_path / "upstream"
    _dist_info(upstream, "transformers", "5.0.0")
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, str(site), str(upstream)], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out == {
        "finders": 1,
        "transformers": ["5.19.0", "transformers"],
        "fork itself": "5.19.0.post1",
        "peft": "0.21.2",
        "norecord": "not found",  # a -kt distribution without its record is not an alias
        "nothing": "not found",
        "requires": ["torch>=2"],
        "as installed": [True, "transformers_kt-5.19.0.post1.dist-info", True],
        "listing": ["norecord-kt", "peft-kt", "transformers-kt"],  # what is installed, under its own names
        "upstream first": "5.0.0",
    }


@pytest.mark.parametrize("context", [None, object()])
def test_the_finder_answers_nothing_without_a_name(context: object) -> None:
    assert list(_kt_dist_alias.KTDistAlias.find_distributions(context)) == []
    assert _kt_dist_alias.KTDistAlias.find_spec("anything") is None


def test_a_large_module_is_read_statement_by_statement_with_the_same_lookups() -> None:
    """Over 64 KiB a module is parsed one top-level statement at a time (its whole tree once took 39 MiB for
    400 KiB): decorated definitions, if/else and try/except clauses, classes and aliases imported far away
    give the same lookups, on the same lines, as a parse of the whole."""
    from audits.readers import _python

    head = b"import numpy as np\nfrom importlib.metadata import version as v\n"
    body = b"""\
@decorator
def f():
    return v("trl")


if X:
    A = np.zeros(3)
else:
    B = importlib.metadata.version("peft")
try:
    import pkg_resources
except ImportError:
    C = require_version("accelerate>=1.0")


class K:
    def m(self):
        return v("transformers")
"""
    filler = b"".join(b"x%d = [%s]\n" % (i, b", ".join(b"%d" % j for j in range(20))) for i in range(1500))
    big = head + filler + body
    assert len(big) > _python.WHOLE_BYTES
    start = big[: big.index(b"@decorator")].count(b"\n")
    got = [(lk.line - start, lk.name) for lk in find_lookups("big.py", big)]
    assert got == [(3, "trl"), (9, "peft"), (13, "accelerate"), (18, "transformers")]
    small = head + body
    assert [(lk.line - 2, lk.name) for lk in find_lookups("small.py", small)] == got  # the whole parse agrees
