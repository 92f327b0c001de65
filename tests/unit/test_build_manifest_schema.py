"""The kernel build's manifest (kt_kernel/_build.json), as kernel/cmake/gen_build_manifest.py writes it,
against audits/schemas/build-manifest.schema.json: a CPU-only wheel (no KT_CUDA) records `cuda: null`."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = json.loads((ROOT / "audits/schemas/build-manifest.schema.json").read_text())


def _generate(tmp_path: Path, variants: str) -> dict[str, Any]:
    spec = importlib.util.spec_from_file_location("gen_build_manifest", ROOT / "kernel/cmake/gen_build_manifest.py")
    assert spec is not None
    assert spec.loader is not None
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    out = tmp_path / "_build.json"
    gen.main(
        [
            "--ladder",
            str(ROOT / "kernel/python/kt_kernel/cpu_variants.json"),
            "--version-file",
            str(ROOT / "kernel/python/kt_kernel/_version.py"),
            "--variants",
            variants,
            "--output",
            str(out),
        ]
    )
    manifest: dict[str, Any] = json.loads(out.read_text())
    return manifest


def test_a_cpu_only_manifest_is_valid(tmp_path: Path) -> None:
    manifest = _generate(tmp_path, "avx2;amx")
    assert manifest["cuda"] is None
    assert sorted(manifest["variants"]) == ["amx", "avx2"]
    jsonschema.validate(manifest, SCHEMA)


@pytest.mark.parametrize("cuda", ["none", [], {"payload": "cuda.tar.zst"}, {"archive": "release"}])
def test_a_malformed_cuda_section_is_refused(tmp_path: Path, cuda: object) -> None:
    manifest = _generate(tmp_path, "avx2") | {"cuda": cuda}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(manifest, SCHEMA)
