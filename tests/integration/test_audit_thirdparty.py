"""Against real third-party wheels (tests/integration/audit_corpus.toml, fetched by hash): our
platform verdict equals `auditwheel show --json`'s, the third-party policy finds no error in a
correct popular wheel, and our cubin listing equals `cuobjdump --list-elf`."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import urllib.request
import zipfile
from pathlib import Path
from typing import Any

import pytest
import tomllib

from audits import audit_wheel, load_policy
from audits.readers._cuda import find_cuobjdump, read_cuda
from locks import indexes

pytestmark = pytest.mark.network
ROOT = Path(__file__).resolve().parents[2]
CORPUS = tomllib.loads((Path(__file__).with_name("audit_corpus.toml")).read_text())["wheel"]
CACHE = ROOT / "build" / "cache" / "corpus"
THIRD = load_policy("third-party")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def fetch(entry: dict[str, Any]) -> Path:
    """The corpus wheel, downloaded once and verified against its hash every time."""
    local = indexes.mirror()
    mirrored = local / str(entry["file"]) if entry.get("mirror") and local is not None else None
    if mirrored is not None and mirrored.is_file():
        path = mirrored
    else:
        path = CACHE / str(entry["file"])
        if not path.is_file():
            CACHE.mkdir(parents=True, exist_ok=True)
            part = path.with_suffix(".part")
            if not entry["url"].startswith(("https://files.pythonhosted.org/", indexes.PYTORCH_CPU_INDEX + "/")):
                pytest.fail(f"{entry['file']}: corpus URLs must be PyPI's or the PyTorch CPU index's")
            with urllib.request.urlopen(entry["url"], timeout=120) as src, part.open("wb") as dst:  # noqa: S310
                shutil.copyfileobj(src, dst, 1 << 20)
            part.rename(path)
    digest = _sha256(path)
    if digest != entry["sha256"]:
        path.unlink() if path.parent == CACHE else None
        pytest.fail(f"{entry['file']}: sha256 {digest}, the corpus pins {entry['sha256']}")
    return path


def auditwheel_show(wheel: Path) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, "-m", "auditwheel", "show", "--json", str(wheel)], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    result: dict[str, Any] = json.loads(proc.stdout)
    return result


def test_the_corpus_has_ten_wheels_of_the_kinds_the_issue_names() -> None:
    kinds = " ".join(e["kind"] for e in CORPUS)
    assert len(CORPUS) >= 10
    for kind in ("static library", "grafted", "abi3", "aarch64", "CUDA", "very large"):
        assert kind in kinds, kind


@pytest.mark.parametrize(
    "entry", CORPUS, ids=[e["file"].split("-")[0] + ("-aarch64" if "aarch64" in e["file"] else "") for e in CORPUS]
)
def test_verdict_equals_auditwheel_show_and_no_error_under_third_party(entry: dict[str, Any]) -> None:
    wheel = fetch(entry)
    res = audit_wheel(wheel, THIRD)
    theirs = auditwheel_show(wheel)
    print(
        f"{wheel.name}: ours {res.platform} ({res.platform_reason or 'nothing limits it'}); "
        f"auditwheel {theirs['overall_tag']}"
    )
    assert res.platform == theirs["overall_tag"]
    assert [f for f in res.findings if f.severity == "error"] == []
    if "static library" in entry["kind"]:
        assert any(f.rule == "wheel.static-library" and f.severity == "info" for f in res.findings)
    if "CUDA" in entry["kind"]:
        listed = res.cuda["embedded"]
        assert listed["inspected"] is True
        with zipfile.ZipFile(wheel) as zf, tempfile.TemporaryDirectory() as tmp:
            for member, facts in listed["files"].items():
                lib = Path(tmp) / "lib.so"
                lib.write_bytes(zf.read(member))
                sass, ptx = fatbin_archs(lib)  # from the fatbin container itself, not from cuobjdump
                assert _numbers(facts["sass"]) == sass, member
                assert _numbers(facts["ptx"]) == ptx, member
                assert facts["sass"]
                assert set(facts["arch_bytes"]) == set(facts["sass"])


_FATBIN_MAGIC, _FATBIN_ELF, _FATBIN_PTX = 0xBA55ED50, 2, 1


def fatbin_archs(lib: Path) -> tuple[set[int], set[int]]:
    """(SASS, PTX) SM numbers of the entries of a library's .nv_fatbin container, read from the
    container's own headers (an independent reference for the cuobjdump-based reader): each
    container is magic, version, header size, payload size; each entry kind (1 PTX, 2 ELF),
    header size, payload size, and at byte 28 the SM number."""
    from elftools.elf.elffile import ELFFile

    with lib.open("rb") as fh:
        section = ELFFile(fh).get_section_by_name(".nv_fatbin")
        data = section.data() if section is not None else b""
    sass: set[int] = set()
    ptx: set[int] = set()
    pos = 0
    while pos + 16 <= len(data):
        magic, _version, header, size = struct.unpack_from("<IHHQ", data, pos)
        if magic != _FATBIN_MAGIC:
            break
        entry, end = pos + header, pos + header + size
        while entry < end:
            kind, _, entry_header, payload = struct.unpack_from("<HHIQ", data, entry)
            (sm,) = struct.unpack_from("<I", data, entry + 28)
            {_FATBIN_ELF: sass, _FATBIN_PTX: ptx}.get(kind, set()).add(sm)
            entry += entry_header + payload
        pos = end
    return sass, ptx


def _numbers(archs: Any) -> set[int]:
    """sm_90a / compute_120 -> 90 / 120 (the container keeps the number; the suffix lives elsewhere)."""
    return {int(re.sub(r"[a-z]+$", "", a.split("_")[1])) for a in archs}


def test_cubin_listing_agrees_with_the_fatbin_headers(tmp_path: Path, kt_wheel: Path) -> None:
    """The audit's reader (cuobjdump) against the fatbin container's own headers, on every CUDA
    library we can reach: the CUDA runtime wheel's own libraries and kt-kernel's payload."""
    tool = find_cuobjdump()
    if tool is None:
        pytest.fail("cuobjdump missing: lockfiles/test.txt installs nvidia-cuda-cuobjdump")
    libs = sorted(Path(tool).parent.parent.glob("lib/*.so*"))
    import io
    import tarfile

    with (
        zipfile.ZipFile(kt_wheel) as zf,
        tarfile.open(fileobj=io.BytesIO(zf.read("kt_kernel/cuda_archive/kt_cuda.tar.xz")), mode="r:xz") as tar,
    ):
        for info in tar:
            if info.isfile():
                out = tmp_path / info.name.replace("/", "_")
                out.write_bytes(tar.extractfile(info).read())  # type: ignore[union-attr]
                libs.append(out)
    checked = 0
    for lib in libs:
        if lib.read_bytes()[:4] != b"\x7fELF":
            continue
        sass, ptx = fatbin_archs(lib)
        facts = read_cuda(tool, lib.read_bytes())
        assert (_numbers(facts.sass), _numbers(facts.ptx)) == (sass, ptx), lib.name
        checked += bool(sass)
    assert checked >= 2
