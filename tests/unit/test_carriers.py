"""Carrier definitions and the consistency check, hermetically."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

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


# A platform wheel that misstates itself, as sgl-deep-gemm 0.2.3.post2's does: Root-Is-Purelib true, tagged
# manylinux2014 while its extension needs GLIBC_2.25, and linking torch's library without requiring torch.
_EXT = """
#include <stddef.h>
#include <sys/types.h>
__asm__(".symver getrandom,getrandom@GLIBC_2.25");
extern ssize_t getrandom(void *buf, size_t n, unsigned flags);
extern int torch_op(void);
int op(void *buf) { return (int)getrandom(buf, 8, 0) + torch_op(); }
"""


def _misstated_wheel(tmp_path: Path, requires: tuple[str, ...] = ()) -> Path:
    from carriers import wheelio
    from tests.wheelkit import compile_so

    torch_lib = tmp_path / "libtorch.so"
    torch_lib.write_bytes(
        compile_so(tmp_path, "libtorch.so", "int torch_op(void) { return 1; }\n", "-Wl,-soname,libtorch.so")
    )
    ext = compile_so(tmp_path, "_C.so", _EXT, f"-L{tmp_path}", "-ltorch")
    di = "sgl_deep_gemm-0.2.3.post2.dist-info"
    meta = "Metadata-Version: 2.4\nName: sgl-deep-gemm\nVersion: 0.2.3.post2\nLicense-Expression: Apache-2.0\n"
    meta += "".join(f"Requires-Dist: {r}\n" for r in requires) + 'Requires-Dist: pytest; extra == "dev"\n\n'
    members = {
        "deep_gemm/__init__.py": b"",
        "deep_gemm/_C.so": ext,
        f"{di}/METADATA": meta.encode(),
        f"{di}/WHEEL": (
            b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-manylinux2014_x86_64\n"
        ),
    }
    path = tmp_path / "sgl_deep_gemm-0.2.3.post2-py3-none-manylinux2014_x86_64.whl"
    wheelio.write(path, members)
    return path


def _repack(tmp_path: Path, src: Path, **changes: Any) -> tuple[str, dict[str, bytes]]:
    import dataclasses

    from carriers import wheelio
    from carriers.transform import derive_draft

    c = dataclasses.replace(CS["sgl-deep-gemm-kt"], **changes)
    versions = {x.name: ("0.6.1" if x.version_rule == "kt" else "9.9.9") for x in CS.carriers}
    versions["sgl-deep-gemm-kt"] = "0.2.3.post2"
    draft = derive_draft(c, CS, src, versions, {"sgl-deep-gemm-kt": "0.2.3.post2"}, pins={"torch": "2.14.1"})
    (tmp_path / "out").mkdir(exist_ok=True)
    out = draft.write(tmp_path / "out")
    return out.name, wheelio.read(out)


def test_a_repack_that_misstates_its_binaries_takes_the_tag_they_need_and_the_release_torch(tmp_path: Path) -> None:
    """The ordering edge (kt-kernel) and torch at the release's pin are added; the tag follows the ELF's needs
    (GLIBC_2.25 -> manylinux_2_26), with libtorch.so counted as the required torch's; Root-Is-Purelib false."""
    from carriers import wheelio

    name, members = _repack(tmp_path, _misstated_wheel(tmp_path))
    assert name == "sgl_deep_gemm_kt-0.2.3.post2-py3-none-manylinux_2_26_x86_64.whl"
    di = wheelio.dist_info(members)
    wheel = members[f"{di}/WHEEL"].decode()
    assert "Root-Is-Purelib: false" in wheel
    assert "Tag: py3-none-manylinux_2_26_x86_64" in wheel
    requires = wheelio.metadata_field(members[f"{di}/METADATA"].decode(), "Requires-Dist")
    assert "kt-kernel==0.6.1" in requires
    assert "torch==2.14.1" in requires
    assert wheelio.tags_of((tmp_path / "out" / name).read_bytes()) == ["py3-none-manylinux_2_26_x86_64"]


def test_retag_without_the_provider_of_a_library_refuses(tmp_path: Path) -> None:
    from carriers.errors import ConsistencyError

    with pytest.raises(ConsistencyError, match=r"allow no manylinux tag \(libtorch.so \(needed by deep_gemm/_C.so\)"):
        _repack(tmp_path, _misstated_wheel(tmp_path), requires_pinned=())


def test_requires_pinned_on_an_upstream_that_requires_it_already_points_at_requires_edit(tmp_path: Path) -> None:
    from carriers.errors import ConsistencyError

    with pytest.raises(ConsistencyError, match="requires torch already; change its specifier with requires_edit"):
        _repack(tmp_path, _misstated_wheel(tmp_path, requires=("torch>=2",)))


def test_release_pins_take_the_one_exact_pin_of_the_inputs(tmp_path: Path) -> None:
    from carriers import wheelio
    from carriers.errors import ConsistencyError
    from carriers.transform import release_pins

    def wheel(name: str, *requires: str) -> Path:
        members = {
            f"{name}-1.0.dist-info/METADATA": (
                f"Metadata-Version: 2.4\nName: {name}\nVersion: 1.0\n"
                + "".join(f"Requires-Dist: {r}\n" for r in requires)
            ).encode(),
            f"{name}-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        }
        wheelio.write(tmp_path / f"{name}-1.0-py3-none-any.whl", members)
        return tmp_path / f"{name}-1.0-py3-none-any.whl"

    sglang = wheel("sglang", "torch==2.14.1", 'torch==2.9.0; extra == "old"')
    peft = wheel("peft", "torch>=1.13")
    assert release_pins(CS, {"sglang-kt": [sglang], "peft-kt": [peft]}) == {"torch": "2.14.1"}
    with pytest.raises(ConsistencyError, match=r"pin it nowhere exactly; lock inputs that agree"):
        release_pins(CS, {"peft-kt": [peft]})
    other = wheel("accelerate", "torch==2.15.0")
    with pytest.raises(ConsistencyError, match=r"==2.14.1 by sglang-1.0-py3-none-any.whl; ==2.15.0 by accelerate"):
        release_pins(CS, {"sglang-kt": [sglang], "accelerate-kt": [other]})


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (
            'requires_pinned = ["kt-kernel"]',
            "requires_pinned names the carrier 'kt-kernel'; a carrier goes in requires",
        ),
        ('requires_pinned = ["Torch"]', "requires_pinned takes normalized distribution names, not 'Torch'"),
        ('retag = "yes"', "retag = 'yes'; it takes true or false"),
    ],
)
def test_requires_pinned_and_retag_are_checked_on_load(tmp_path: Path, line: str, message: str) -> None:
    import re

    key = line.split(" =", maxsplit=1)[0]
    bad = tmp_path / "carriers.toml"
    bad.write_text(re.sub(rf"^{key} = .*$", line, DEFINITIONS.read_text(), count=1, flags=re.M))
    with pytest.raises(DefinitionError, match=message):
        load(bad, version="0.6.1")
