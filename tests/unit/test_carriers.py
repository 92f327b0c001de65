"""Carrier definitions and the consistency check, hermetically."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from carriers import DefinitionError, load
from carriers.consistency import check
from carriers.model import DEFINITIONS
from carriers.transform import rename_requirement
from carriers.wheelio import edit_metadata

CS = load(version="0.6.1")
GOOD = {
    "kt-kernel": ("0.6.1", ["numpy>=1.24", 'torch>=2.4; extra == "torch"']),
    "ktransformers": (
        "0.6.1",
        ["kt-kernel==0.6.1", 'sglang-kt==0.6.1; extra == "serve"', 'transformers-kt==5.19.0.post1; extra == "sft"'],
    ),
    "sglang-kt": ("0.6.1", ["torch==2.14.1", "transformers-kt==5.19.0.post1", 'peft-kt>=0.18.0; extra == "test"']),
    "transformers-kt": ("5.19.0.post1", ["numpy>=1.17"]),
    "peft-kt": ("0.21.2", ["torch>=1.13.0", "transformers-kt", "accelerate-kt>=0.21.0"]),
    "accelerate-kt": ("1.15.0.post1", ["torch>=2.0.0"]),
}


def test_the_set_is_consistent_and_torch_intersects() -> None:
    report = check(CS, GOOD)
    assert report.problems == ()
    assert report.torch_candidates == ("2.14.1",)


def test_umbrella_pinning_an_old_kt_kernel_is_drift() -> None:
    meta = dict(GOOD, ktransformers=("0.6.1", ["kt-kernel==0.6.0"]))
    assert any("must pin kt-kernel==0.6.1 exactly" in p for p in check(CS, meta).problems)


def test_post2_is_not_post20() -> None:
    """A substring check would accept ==5.19.0.post2 for 5.19.0.post20; versions do not."""
    meta = dict(GOOD, ktransformers=("0.6.1", ["kt-kernel==0.6.1", "transformers-kt==5.19.0.post2"]))
    meta["transformers-kt"] = ("5.19.0.post20", [])
    problems = check(CS, meta).problems
    assert any("must pin transformers-kt==5.19.0.post20" in p for p in problems)


def test_bound_that_excludes_the_fork_is_caught() -> None:
    meta = dict(GOOD, **{"peft-kt": ("0.21.2", ["transformers-kt<5"])})
    assert any("no longer admits transformers-kt 5.19.0.post1" in p for p in check(CS, meta).problems)


def test_upstream_in_an_extra_is_caught() -> None:
    meta = dict(GOOD, **{"trl-kt": ("1.16.0", ['transformers[kernels]; extra == "kernels"'])})
    assert any("still names upstream transformers" in p for p in check(CS, meta).problems)


def test_disjoint_torch_requirements_are_caught() -> None:
    meta = dict(GOOD, **{"accelerate-kt": ("1.15.0.post1", ["torch<2.0"])})
    assert any("no common version" in p for p in check(CS, meta).problems)


def test_unknown_key_suggests_the_known_one(tmp_path: Path) -> None:
    bad = tmp_path / "carriers.toml"
    bad.write_text(DEFINITIONS.read_text().replace('upstream = "peft"', 'upstrem = "peft"'))
    with pytest.raises(DefinitionError, match="did you mean 'upstream'"):
        load(bad, version="0.6.1")


def test_pin_to_an_unknown_carrier_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "carriers.toml"
    bad.write_text(DEFINITIONS.read_text().replace('requires = ["kt-kernel"]', 'requires = ["kt-kernal"]'))
    with pytest.raises(DefinitionError, match="did you mean 'kt-kernel'"):
        load(bad, version="0.6.1")


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ("payload_part = 5\n", "payload_part = 5\ndist_alias = true\n", "one fork ships the alias"),
        ("payload_part = 4\ndist_alias = true", 'payload_part = 4\ndist_alias = "yes"', "it takes true or false"),
        ('upstream = "trl"\n', 'upstream = "trl"\ndist_alias = true\n', "unknown key 'dist_alias' for a repack"),
    ],
)
def test_the_alias_has_one_fork_to_host_it(tmp_path: Path, old: str, new: str, message: str) -> None:
    bad = tmp_path / "carriers.toml"
    text = DEFINITIONS.read_text()
    assert old in text
    bad.write_text(text.replace(old, new, 1))
    with pytest.raises(DefinitionError, match=message):
        load(bad, version="0.6.1")
    assert [c.name for c in load(version="0.6.1").carriers if c.dist_alias] == ["transformers-kt"]


def test_rename_keeps_bounds_extras_and_markers_byte_for_byte() -> None:
    line = 'transformers[kernels]>=4.56.2,!=5.1.0 ; extra == "deepspeed"'
    assert (
        rename_requirement(line, "transformers-kt") == 'transformers-kt[kernels]>=4.56.2,!=5.1.0 ; extra == "deepspeed"'
    )
    assert rename_requirement("transformers", "transformers-kt") == "transformers-kt"
    assert rename_requirement("transformers_stream>=1", "x") == "x>=1"


def test_edit_metadata_touches_only_named_lines() -> None:
    text = (
        "Metadata-Version: 2.4\nName: peft\nVersion: 0.21.2\nRequires-Dist: transformers\nSummary: x\n\nBody\nName: y\n"
    )
    out = edit_metadata(text, name="peft-kt", requirement=lambda r: r.replace("transformers", "transformers-kt"))
    assert out == text.replace("Name: peft", "Name: peft-kt", 1).replace(
        "Requires-Dist: transformers", "Requires-Dist: transformers-kt"
    )


def test_every_carrier_kind_has_a_builder() -> None:
    from typing import get_args

    from carriers.assemble import BUILDERS
    from carriers.model import Kind

    assert set(BUILDERS) == set(get_args(Kind))


def test_the_torch_line_is_the_pin_every_carrier_allows() -> None:
    from carriers.consistency import torch_summary

    assert torch_summary("==2.14.1,>=1.10.0,>=1.13.0,>=2.0.0,>=2.10.0,>=2.4,>=2.5") == "==2.14.1"
    assert torch_summary(">=2.4,<2.15") == "<2.15,>=2.4"
    assert torch_summary("==2.3.0,>=2.4") == "==2.3.0,>=2.4"  # a pin outside the rest is not hidden


def test_a_failing_tool_is_the_callers_error_naming_the_step() -> None:
    from carriers import proc
    from carriers.errors import InputError, PatchError

    assert proc.run([sys.executable, "-c", "print('ok')"], "echo", InputError) == "ok\n"
    fail = "import sys; print('boom', file=sys.stderr); sys.exit(3)"
    with pytest.raises(PatchError, match=r"applying x.patch failed \(exit 3\): boom\nrefresh it"):
        proc.run([sys.executable, "-c", fail], "applying x.patch", PatchError, "refresh it")
    with pytest.raises(InputError, match="git clone: cannot run no-such-tool-kt"):
        proc.run(["no-such-tool-kt"], "git clone", InputError)


@pytest.mark.parametrize(
    ("new", "message"),
    [
        ('requires_edit = { datasets = "<<4" }', "is not a version specifier"),
        ('requires_edit = { Datasets = ">=2" }', "use 'datasets'"),
        ('requires_edit = ">=2"', "requires_edit takes a table"),
        ('requires_extra = { multimodal = "av" }', "takes a table of lists"),
        ('requires_extra = { a = ["av"], b = ["av"] }', "names 'av' twice"),
        ('requires_extra = { a = ["datasets"] }', "both edited and moved"),
        ("pin_forks = 1", "it takes true or false"),
    ],
)
def test_requirement_edits_are_validated(tmp_path: Path, new: str, message: str) -> None:
    text = DEFINITIONS.read_text()
    key = new.split(" =", 1)[0]
    # the last carrier that has the key: llamafactory-kt, whose requires_edit the clash case needs
    old = [line for line in text.splitlines() if line.startswith(f"{key} =")][-1]
    bad = tmp_path / "carriers.toml"
    bad.write_text(text.replace(old, new, 1))
    with pytest.raises(DefinitionError, match=message):
        load(bad, version="0.6.1")


def test_a_repack_takes_no_requirement_edits(tmp_path: Path) -> None:
    bad = tmp_path / "carriers.toml"
    bad.write_text(DEFINITIONS.read_text().replace('upstream = "trl"\n', 'upstream = "trl"\npin_forks = true\n', 1))
    with pytest.raises(DefinitionError, match="unknown key 'pin_forks' for a repack"):
        load(bad, version="0.6.1")


def _upstream_wheel(tmp_path: Path, requires: list[str]) -> Path:
    from carriers import wheelio

    meta = "Metadata-Version: 2.4\nName: llamafactory\nVersion: 0.9.5\nLicense-Expression: Apache-2.0\n"
    meta += "".join(f"Requires-Dist: {r}\n" for r in requires) + "Provides-Extra: torch\n\nThe description.\n"
    members = {
        "llamafactory/__init__.py": b"",
        "llamafactory-0.9.5.dist-info/licenses/LICENSE": b"Apache License 2.0\n",
        "llamafactory-0.9.5.dist-info/METADATA": meta.encode(),
        "llamafactory-0.9.5.dist-info/WHEEL": (
            b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
    }
    path = tmp_path / "llamafactory-0.9.5-py3-none-any.whl"
    wheelio.write(path, members)
    return path


def _derive(tmp_path: Path, requires: list[str]) -> list[str]:
    import dataclasses

    from carriers import wheelio
    from carriers.transform import derive

    c = dataclasses.replace(CS["llamafactory-kt"], patches=())
    versions = {x.name: ("0.6.1" if x.version_rule == "kt" else "9.9.9") for x in CS.carriers}
    versions.update({"transformers-kt": "5.19.0.post1", "trl-kt": "1.16.0", "llamafactory-kt": "0.9.5.post1"})
    upstream_of = {"transformers-kt": "5.19.0", "trl-kt": "1.16.0"}
    out = derive(c, CS, _upstream_wheel(tmp_path, requires), tmp_path, versions, upstream_of)
    members = wheelio.read(out)
    meta = members[f"{wheelio.dist_info(members)}/METADATA"].decode()
    extras = [f"extra:{e}" for e in wheelio.metadata_field(meta, "Provides-Extra")]
    return wheelio.metadata_field(meta, "Requires-Dist") + extras


UPSTREAM_LF = [
    "transformers!=4.52.0,<=5.6.0,>=4.55.0",
    "trl<=0.24.0,>=0.18.0",
    "datasets<=4.0.0,>=2.16.0",
    "torchaudio>=2.4.0",
    "torchvision>=0.19.0",
    'av<=16.0.0,>=10.0.0; python_version >= "3.11"',
    'deepspeed>=0.10.0; extra == "torch"',
]


def test_a_fork_with_pin_forks_pins_siblings_edits_and_moves_requirements(tmp_path: Path) -> None:
    lines = _derive(tmp_path, UPSTREAM_LF)
    assert "transformers-kt==5.19.0.post1" in lines  # upstream's cap gives way to the release's fork
    assert "trl-kt==1.16.0" in lines
    assert "datasets>=2.16.0" in lines  # requires_edit
    assert 'torchaudio>=2.4.0; extra == "multimodal"' in lines  # requires_extra
    assert 'torchvision>=0.19.0; extra == "multimodal"' in lines
    assert 'av<=16.0.0,>=10.0.0; (python_version >= "3.11") and extra == "multimodal"' in lines
    assert 'deepspeed>=0.10.0; extra == "torch"' in lines  # untouched
    assert "kt-kernel==0.6.1" in lines  # requires: a sibling pinned exactly
    assert "extra:multimodal" in lines
    assert "extra:torch" in lines


def test_an_edit_the_upstream_no_longer_needs_is_stale(tmp_path: Path) -> None:
    from carriers.errors import ConsistencyError

    without = [r for r in UPSTREAM_LF if not r.startswith("datasets")]
    with pytest.raises(ConsistencyError, match=r"declares no requirement on \['datasets'\]"):
        _derive(tmp_path, without)
