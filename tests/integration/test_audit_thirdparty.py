"""Against real third-party wheels (tests/integration/audit_corpus.toml, fetched by hash): our
platform verdict equals `auditwheel show --json`'s (computed here by the locked auditwheel), on every
libc family and architecture; the third-party policy finds no error in a correct popular wheel; our
cubin listing equals `cuobjdump --list-elf`. And auditwheel's own test wheels (bundled in its sdist,
fetched by hash, never committed) get the verdict auditwheel's tests expect of them."""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import platform
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
from base import paths, swap
from base.keys import file_sha256
from locks import indexes

pytestmark = pytest.mark.network
ROOT = Path(__file__).resolve().parents[2]
CORPUS = tomllib.loads((Path(__file__).with_name("audit_corpus.toml")).read_text())["wheel"]
CACHE = paths.CACHE / "corpus"  # by sha256: the tests session shares it between checkouts
THIRD = load_policy("third-party")


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
            part = swap.part(path)  # a name of this process's own: another checkout may fetch it meanwhile
            if not entry["url"].startswith(("https://files.pythonhosted.org/", indexes.PYTORCH_CPU_INDEX + "/")):
                pytest.fail(f"{entry['file']}: corpus URLs must be PyPI's or the PyTorch CPU index's")
            with urllib.request.urlopen(entry["url"], timeout=120) as src, part.open("wb") as dst:  # noqa: S310
                shutil.copyfileobj(src, dst, 1 << 20)
            part.rename(path)
    digest = file_sha256(path)
    if digest != entry["sha256"]:
        path.unlink() if path.parent == CACHE else None
        pytest.fail(f"{entry['file']}: sha256 {digest}, the corpus pins {entry['sha256']}")
    return path


def auditwheel_show(wheel: Path) -> dict[str, Any]:
    """`auditwheel show --json`: its verdict ("overall_tag"), {"error": ...} for what it calls no
    platform wheel, or {"failed": stderr's last line} where it stops with a traceback.

    The reference answer is kept by content (the wheel's sha256, auditwheel's version, this Python and
    architecture): auditwheel alone takes 37 s on the torch wheel, every run, to say what it said
    before. Ours is computed on every run; a new auditwheel or another wheel asks it again."""
    key = hashlib.sha256(
        json.dumps(
            [file_sha256(wheel), importlib.metadata.version("auditwheel"), sys.version_info[:2], platform.machine()]
        ).encode()
    ).hexdigest()
    kept = CACHE.parent / "auditwheel-show" / f"{key}.json"
    if kept.is_file():
        cached: dict[str, Any] = json.loads(kept.read_text())
        return cached
    proc = subprocess.run(
        [sys.executable, "-m", "auditwheel", "show", "--json", str(wheel)], capture_output=True, text=True, check=False
    )
    try:
        result: dict[str, Any] = json.loads(proc.stdout)
    except ValueError:
        result = {"failed": (proc.stderr.strip().splitlines() or ["no output"])[-1]}
    if proc.returncode < 0:  # killed (memory, a timeout): not auditwheel's answer, never kept
        return result
    kept.parent.mkdir(parents=True, exist_ok=True)
    part = swap.part(kept)
    part.write_text(json.dumps(result))
    part.replace(kept)
    return result


def theirs_tag(theirs: dict[str, Any]) -> str | None:
    """auditwheel's verdict as ours spells it: the tag, or None for "not a platform wheel"."""
    assert "failed" not in theirs, theirs
    return theirs.get("overall_tag")


def test_the_corpus_covers_every_libc_family_and_architecture() -> None:
    kinds = " ".join(e["kind"] for e in CORPUS)
    files = " ".join(e["file"] for e in CORPUS)
    assert len(CORPUS) >= 25
    for kind in (
        "static library",
        "grafted",
        "abi3",
        "aarch64",
        "CUDA",
        "very large",
        "static program",
        "iOS",
        "PyPy",
        "CPython 3.14",
        "cp314t",
        "static executable",
        "musllinux 1.1",
        "musllinux 1.2",
    ):
        assert kind in kinds, kind
    for arch in ("x86_64", "aarch64", "i686", "armv7l", "ppc64le", "s390x", "riscv64"):
        assert f"manylinux_2_17_{arch}" in files or f"manylinux1_{arch}" in files or f"_{arch}.manylinux" in files
        assert f"musllinux_1_1_{arch}" in files or f"musllinux_1_2_{arch}" in files, arch


def _id(e: dict[str, Any]) -> str:
    name, version, *_, platform = e["file"][: -len(".whl")].split("-")
    return f"{name}-{version}-{platform.split('.')[-1]}"


@pytest.mark.parametrize("entry", CORPUS, ids=[_id(e) for e in CORPUS])
def test_verdict_equals_auditwheel_show_and_no_error_under_third_party(entry: dict[str, Any]) -> None:
    wheel = fetch(entry)
    res = audit_wheel(wheel, THIRD)
    theirs = auditwheel_show(wheel)
    print(f"{wheel.name}: ours {res.platform} ({res.platform_reason or 'nothing limits it'}); auditwheel {theirs}")
    if "verdict" in entry:  # auditwheel cannot judge it on this host: the corpus says why, and what is true
        assert "failed" in theirs, "auditwheel judges it now: drop the corpus's verdict and compare"
        assert res.platform == entry["verdict"], entry["why"]
    else:
        assert res.platform == theirs_tag(theirs)
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


AUDITWHEEL_SDIST = {
    "file": "auditwheel-6.8.2.tar.gz",
    "url": "https://files.pythonhosted.org/packages/4d/52/83393c50a4d497e6d2f62ddf0b439bf3a5eecd4e6b8ae43c219cb722224e/"
    "auditwheel-6.8.2.tar.gz",
    "sha256": "d007c4fd8c9c4b5113690ab0b159e05c5aa9b2d31b69efc40875826cc095594b",
}
# What auditwheel's own tests expect where `auditwheel show` on this (glibc) host gives no verdict to
# compare with, and ours (None: no tag at all).
BUNDLED_EXPECTED = {
    # tests/integration/test_nonplatform_wheel.py: "unknown architecture", exit 1 -- soft-float ARM and MIPS
    # have no policy; never another architecture's tag.
    "glibc/testsimple-0.0.1-cp313-cp313-linux_armv5l.whl": (None, "soft-float"),
    "glibc/testsimple-0.0.1-cp313-cp313-linux_mips64.whl": (None, "EM_MIPS"),
    # tests/unit/test_lddtree.py: "we can't detect libc for this library" (a cp310 musl extension has the
    # -linux-gnu suffix and needs no library); auditwheel show stops with InvalidLibcError. It needs nothing
    # of either libc: glibc assumed, and the tag.libc-assumed note says musllinux fits as well.
    "musllinux_1_2/testsimple-0.0.1-cp310-cp310-linux_x86_64.whl": ("manylinux_2_5_x86_64", ""),
    # tests/integration/test_nonplatform_wheel.py: a pure wheel is "not a platform wheel", exit 1.
    "plumbum-1.6.8-py2.py3-none-any.whl": (None, ""),
    # tests/integration/test_bundled_wheels.py::test_analyze_wheel_abi_pyfpe: linux, for PyFPE_jbuf.
    "fpewheel-0.0.0-cp35-cp35m-linux_x86_64.whl": ("linux_x86_64", "PyFPE_jbuf"),
}


@pytest.fixture(scope="module")
def bundled_wheels() -> dict[str, Path]:
    """auditwheel's bundled test wheels, from its sdist on PyPI (fetched by hash, extracted once)."""
    import tarfile

    sdist = fetch(AUDITWHEEL_SDIST)
    root = CACHE / "auditwheel-bundled"
    if not root.is_dir():
        part = swap.part(root)
        shutil.rmtree(part, ignore_errors=True)
        with tarfile.open(sdist) as tar:
            for m in tar.getmembers():
                if "/tests/bundled-wheels/" in m.name and m.isfile() and m.name.endswith(".whl"):
                    rel = m.name.split("/tests/bundled-wheels/", 1)[1]
                    out = part / rel
                    out.parent.mkdir(parents=True, exist_ok=True)
                    out.write_bytes(tar.extractfile(m).read())  # type: ignore[union-attr]
        try:
            part.rename(root)
        except OSError:  # another checkout sharing the cache extracted it meanwhile
            if not root.is_dir():
                raise
            shutil.rmtree(part)
    return {str(p.relative_to(root)): p for p in sorted(root.rglob("*.whl"))}


# The only errors the third-party policy finds in auditwheel's test wheels, each true.
BUNDLED_ERRORS = {
    # Renamed from a CPython 3.11 build: WHEEL says cp311, the suffix cpython-311; MIPS asks for an
    # executable stack (PT_GNU_STACK RWE).
    "glibc/testsimple-0.0.1-cp313-cp313-linux_mips64.whl": {"wheel.wheel-file", "tag.ext-suffix", "elf.execstack"},
    # Tagged manylinux2014, needs GLIBC_2.29, CXXABI_1.3.9, GLIBCXX_3.4.22 (auditwheel repair retags it
    # manylinux_2_31, as auditwheel's test_libpython expects).
    "python_mscl-67.0.1.0-cp313-cp313-manylinux2014_aarch64.whl": {"tag.manylinux-overclaim"},
}


def test_auditwheels_own_test_wheels_get_the_verdict_its_tests_expect(bundled_wheels: dict[str, Path]) -> None:
    assert len(bundled_wheels) == 25
    wrong = []
    for rel, wheel in bundled_wheels.items():
        res = audit_wheel(wheel, THIRD)
        errors = {f.rule for f in res.findings if f.severity == "error"}
        if errors != BUNDLED_ERRORS.get(rel, set()):
            wrong.append(f"{rel}: errors {sorted(errors)}, expected {sorted(BUNDLED_ERRORS.get(rel, set()))}")
        theirs = auditwheel_show(wheel)
        if rel in BUNDLED_EXPECTED:
            want, why = BUNDLED_EXPECTED[rel]
            ok = res.platform == want and why in res.platform_reason and theirs.get("overall_tag") in (None, want)
        else:
            want, ok = theirs_tag(theirs), res.platform == theirs_tag(theirs)
        print(f"{rel}: ours {res.platform} ({res.platform_reason}); auditwheel {theirs.get('overall_tag', theirs)}")
        if not ok:
            wrong.append(f"{rel}: ours {res.platform} ({res.platform_reason}), expected {want}")
    assert wrong == []
    assumed = audit_wheel(bundled_wheels["musllinux_1_2/testsimple-0.0.1-cp310-cp310-linux_x86_64.whl"], THIRD)
    note = [f.message for f in assumed.findings if f.rule == "tag.libc-assumed"]
    assert note
    assert "musllinux_1_2_x86_64" in note[0]


def test_the_cli_reads_every_bundled_wheel_and_exits_0_or_1(bundled_wheels: dict[str, Path], tmp_path: Path) -> None:
    """One kt-audit run over all of them: a verdict per wheel, no traceback, exit 0 or 1."""
    report = tmp_path / "r.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "audits",
            *map(str, bundled_wheels.values()),
            "--policy",
            "third-party",
            "--json",
            str(report),
        ],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
    )
    assert proc.returncode in (0, 1), proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert len(json.loads(report.read_text())["wheels"]) == 25
