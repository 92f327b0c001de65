"""The commands in docs/fine-tuning.md are ones the tools accept (kt-lora-convert's and
kt-prepare-data's parsers)."""

from __future__ import annotations

import re
import shlex
import types

import pytest

from tests.conftest import KT_SRC, ROOT, load_source_module

DOC = ROOT / "docs" / "fine-tuning.md"


def _tool(module: str = "lora_convert") -> types.ModuleType:
    """kt_kernel/MODULE.py by path: the package itself needs its compiled core."""
    return load_source_module(f"{module}_doc", KT_SRC / f"{module}.py")


def commands(tool: str = "kt-lora-convert") -> list[list[str]]:
    """The `$ TOOL ...` lines of the doc's console blocks, split as a shell would."""
    blocks = re.findall(r"```console\n(.*?)```", DOC.read_text(), re.DOTALL)
    lines = [shlex.split(line[2:]) for b in blocks for line in b.splitlines() if line.startswith("$ ")]
    return [argv for argv in lines if argv[0] == tool]


def test_the_doc_has_converter_commands() -> None:
    assert [c[0] for c in commands()] == ["kt-lora-convert"] * 3


@pytest.mark.parametrize("argv", commands(), ids=lambda a: " ".join(a[:2]))
def test_each_doc_command_parses(argv: list[str]) -> None:
    """Each command reaches the converter's work (a missing input), not an argparse usage error."""
    mod = _tool()
    assert argv[0] == "kt-lora-convert"
    rc = mod.main(argv[1:])
    assert rc == 2  # "no such file or directory" for out/...: the arguments were accepted


def test_the_doc_has_data_prep_commands() -> None:
    assert [(c[0], "--verify" in c) for c in commands("kt-prepare-data")] == [
        ("kt-prepare-data", False),
        ("kt-prepare-data", True),
    ]


@pytest.mark.parametrize("argv", commands("kt-prepare-data"), ids=lambda a: "verify" if "--verify" in a else "prepare")
def test_each_data_prep_command_parses(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """Each reaches the tool's work (the missing data file), not an argparse usage error."""
    rc = _tool("data_prep").main(argv[1:])
    assert rc == 2
    assert ": no such file" in capsys.readouterr().err  # the data (or, for --verify, the manifest)
