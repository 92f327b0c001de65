"""The commands in docs/fine-tuning.md are ones the tools accept (kt-lora-convert's parser)."""

from __future__ import annotations

import importlib.util
import re
import shlex
import sys
import types

import pytest

from tests.conftest import ROOT

DOC = ROOT / "docs" / "fine-tuning.md"


def _converter() -> types.ModuleType:
    """kt_kernel/lora_convert.py by path: the package itself needs its compiled core."""
    path = ROOT / "kernel" / "python" / "kt_kernel" / "lora_convert.py"
    spec = importlib.util.spec_from_file_location("lora_convert_doc", path)
    assert spec is not None
    assert spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def commands() -> list[list[str]]:
    blocks = re.findall(r"```console\n(.*?)```", DOC.read_text(), re.DOTALL)
    return [shlex.split(line[2:]) for b in blocks for line in b.splitlines() if line.startswith("$ ")]


def test_the_doc_has_converter_commands() -> None:
    assert [c[0] for c in commands()] == ["kt-lora-convert"] * 3


@pytest.mark.parametrize("argv", commands(), ids=lambda a: " ".join(a[:2]))
def test_each_doc_command_parses(argv: list[str]) -> None:
    """Each command reaches the converter's work (a missing input), not an argparse usage error."""
    mod = _converter()
    assert argv[0] == "kt-lora-convert"
    rc = mod.main(argv[1:])
    assert rc == 2  # "no such file or directory" for out/...: the arguments were accepted
