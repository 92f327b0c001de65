"""The lazy CUDA archive, without a GPU: promised cubins, real ELF loading of
the extracted layout (and the flattened failure it fixes), the no-driver error,
and extraction under concurrency, crashes and hostile payloads."""

from __future__ import annotations

import hashlib
import io
import json
import lzma
import re
import shutil
import subprocess
import tarfile
import zipfile
from pathlib import Path
from typing import Any

import pytest

from audits.readers._cuda import find_cuobjdump
from tests.integration.conftest import SCRIPTS, Venv

SCRIPT = str(SCRIPTS / "cuda_archive.py")
# Decided independently of the code under test: the driver's device nodes or nvidia-smi.
HAS_GPU = Path("/dev/nvidia0").exists() or shutil.which("nvidia-smi") is not None
PROMISED = {
    "lib/libkt_cuda.so": ({"sm_80", "sm_86", "sm_89", "sm_90", "sm_120"}, {"sm_120"}),
    "sm90a/libkt_cuda_sm90a.so": ({"sm_90a"}, set()),
}


@pytest.fixture(scope="module")
def section(kt_wheel: Path) -> dict[str, Any]:
    with zipfile.ZipFile(kt_wheel) as zf:
        data: dict[str, Any] = json.loads(zf.read("kt_kernel/_build.json"))["cuda"]
    if not data:
        pytest.fail(f"{kt_wheel.name} has no CUDA archive; the tests session builds with --cuda")
    return data


@pytest.fixture(scope="module")
def payload(kt_wheel: Path, section: dict[str, Any]) -> bytes:
    with zipfile.ZipFile(kt_wheel) as zf:
        return zf.read(section["payload"])


def _members(payload: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(payload), mode="r:xz") as tar:
        return {i.name: tar.extractfile(i).read() for i in tar if i.isfile()}  # type: ignore[union-attr]


def test_libraries_hold_exactly_the_promised_cubins(payload: bytes, tmp_path: Path) -> None:
    tool = find_cuobjdump()
    if tool is None:
        pytest.fail("cuobjdump missing: lockfiles/test.txt installs nvidia-cuda-cuobjdump")
    members = _members(payload)
    assert set(members) == set(PROMISED)
    for name, (sass, ptx) in PROMISED.items():
        lib = tmp_path / Path(name).name
        lib.write_bytes(members[name])
        elf = subprocess.run([tool, "--list-elf", str(lib)], capture_output=True, text=True, check=True).stdout
        listed = subprocess.run([tool, "--list-ptx", str(lib)], capture_output=True, text=True, check=False).stdout
        assert set(re.findall(r"\.(sm_\w+)\.cubin", elf)) == sass, name
        assert set(re.findall(r"\.(sm_\w+)\.ptx", listed)) == ptx, name


def test_manifest_describes_every_payload_file(payload: bytes, section: dict[str, Any]) -> None:
    assert hashlib.sha256(payload).hexdigest() == section["sha256"]
    for name, data in _members(payload).items():
        assert section["files"][name]["sha256"] == hashlib.sha256(data).hexdigest()
    sizes = section["sizes"]
    assert sizes["xz"] < sizes["zip_deflate"] < sizes["tar"]


def test_extracted_layout_loads(fresh_venv: Venv, tmp_path: Path) -> None:
    out = fresh_venv.json(SCRIPT, "load-layout", str(tmp_path / "cache"))
    common, hopper = out["loaded"]
    assert common.endswith("/lib/libkt_cuda.so")
    assert hopper.endswith("/sm90a/libkt_cuda_sm90a.so")
    err, text = out["device_count_error"]
    assert re.search(r"driver|device|no error", text), f"not a CUDA runtime error string: {text!r}"
    if HAS_GPU:
        assert err == 0, f"cudaGetDeviceCount failed on a machine with a GPU: {text}"
    else:
        assert err != 0, "a device was found on a machine without a GPU?"


def test_flattened_layout_fails_and_legacy_loader_copes(fresh_venv: Venv, tmp_path: Path) -> None:
    """The old failure: flattening the archive breaks $ORIGIN/../lib; the legacy path preloads instead."""
    out = fresh_venv.json(SCRIPT, "load-flattened", str(tmp_path / "cache"))
    assert "libkt_cuda.so: cannot open shared object file" in out["error"]
    assert all(out["legacy_loaded"])


@pytest.mark.skipif(HAS_GPU, reason="this machine has an NVIDIA GPU; tests/gpu launches the kernels here")
def test_launcher_without_driver_says_so(fresh_venv: Venv, tmp_path: Path) -> None:
    out = fresh_venv.json(SCRIPT, "launch", str(tmp_path / "cache"))
    assert out["error"] is not None, "a CUDA device was found on a machine without a GPU?"
    assert out["error"].startswith("CudaUnavailable: ")
    assert "no NVIDIA driver" in out["error"] or "no CUDA device" in out["error"]


def test_cpu_only_use_never_touches_cuda(fresh_venv: Venv, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    out = fresh_venv.json(SCRIPT, "cpu-only", str(cache), env={"KT_KERNEL_CACHE_DIR": str(cache)})
    assert out == {
        "action": "cpu-only",
        "cuda_module_imported": False,
        "cuda_library_mapped": False,
        "cache_exists": False,
    }


def test_eight_processes_one_extraction(fresh_venv: Venv, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    procs = [
        subprocess.Popen([str(fresh_venv.python), SCRIPT, "extract", str(cache)], stdout=subprocess.PIPE, text=True)
        for _ in range(8)
    ]
    roots = {json.loads(p.communicate(timeout=300)[0])["root"] for p in procs}
    assert all(p.returncode == 0 for p in procs)
    assert len(roots) == 1
    assert len((cache / "extractions.log").read_text().splitlines()) == 1
    assert not list(cache.glob(".tmp-*"))


def test_crash_mid_extraction_then_recovery(fresh_venv: Venv, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    crashed = fresh_venv.run(
        SCRIPT, "extract", str(cache), env={"KT_KERNEL_TEST_CRASH_AFTER_MEMBERS": "1"}, check=False
    )
    assert crashed.returncode == 70
    assert list(cache.glob(".tmp-*")), "the crash should leave a partial temp dir behind"
    root = Path(fresh_venv.json(SCRIPT, "extract", str(cache))["root"])
    assert (root / ".complete").is_file()
    assert not list(cache.glob(".tmp-*"))


def _payload_with(members: dict[str, bytes], extra: tarfile.TarInfo | None = None) -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        if extra is not None:
            tar.addfile(extra, io.BytesIO(b"x" * extra.size))
    return lzma.compress(raw.getvalue())


def _extract_in_venv(venv: Venv, tmp_path: Path, section: dict[str, Any], payload: bytes) -> str:
    pkg = tmp_path / "pkg"
    (pkg / Path(section["payload"]).parent).mkdir(parents=True)
    (pkg / section["payload"]).write_bytes(payload)
    section = dict(section, sha256=hashlib.sha256(payload).hexdigest())
    code = (
        "import json, sys; from pathlib import Path; from kt_kernel import cuda\n"
        "s = json.loads(sys.argv[1])\n"
        "try:\n    cuda.extract(s, Path(sys.argv[2]), Path(sys.argv[3])); print('ok')\n"
        "except cuda.CudaError as e:\n    print(e)\n"
    )
    return venv.run("-c", code, json.dumps(section), str(tmp_path / "cache"), str(pkg)).stdout.strip()


def test_tampered_member_is_named(fresh_venv: Venv, tmp_path: Path, payload: bytes, section: dict[str, Any]) -> None:
    members = _members(payload)
    members["lib/libkt_cuda.so"] += b"\0"
    msg = _extract_in_venv(fresh_venv, tmp_path, section, _payload_with(members))
    assert "member lib/libkt_cuda.so has sha256" in msg
    assert not (tmp_path / "cache" / hashlib.sha256(_payload_with(members)).hexdigest()).exists()


def test_path_traversal_member_is_refused(
    fresh_venv: Venv, tmp_path: Path, payload: bytes, section: dict[str, Any]
) -> None:
    evil = tarfile.TarInfo("../../evil.so")
    evil.size = 4
    msg = _extract_in_venv(fresh_venv, tmp_path, section, _payload_with(_members(payload), evil))
    assert "points outside the archive root" in msg
    assert not (tmp_path / "evil.so").exists()


def test_link_escaping_the_root_is_refused(
    fresh_venv: Venv, tmp_path: Path, payload: bytes, section: dict[str, Any]
) -> None:
    link = tarfile.TarInfo("lib/libcuda.so.1")
    link.type, link.linkname, link.size = tarfile.SYMTYPE, "/usr/lib/libcuda.so.1", 0
    msg = _extract_in_venv(fresh_venv, tmp_path, section, _payload_with(_members(payload), link))
    assert "escapes the archive root" in msg


def test_unwritable_cache_names_path_and_variable(fresh_venv: Venv) -> None:
    out = fresh_venv.run(SCRIPT, "launch", "/proc/kt-cache", env={"KT_KERNEL_CACHE_DIR": "/proc/kt-cache"}, check=False)
    # The driver is checked first: without one the launcher says so and never touches the cache.
    if not HAS_GPU:
        assert "CudaUnavailable" in out.stdout + out.stderr
    # Extraction errors show with a driver. Exercise extract directly:
    res = fresh_venv.run(SCRIPT, "extract", "/proc/kt-cache", check=False)
    assert "cannot write the CUDA cache /proc/kt-cache" in res.stderr
    assert "KT_KERNEL_CACHE_DIR" in res.stderr


def test_warm_path_checks_sizes_and_ownership(fresh_venv: Venv, tmp_path: Path) -> None:
    """kt_kernel.cuda's warm path checks what the payload's does: a library truncated after its
    marker was written is extracted again, and a cache others can write is refused with the fix."""
    cache = tmp_path / "cache"
    root = Path(fresh_venv.json(SCRIPT, "extract", str(cache))["root"])
    lib = root / "lib" / "libkt_cuda.so"
    size = lib.stat().st_size
    lib.write_bytes(lib.read_bytes()[:100])
    assert fresh_venv.json(SCRIPT, "extract", str(cache))["root"] == str(root)
    assert lib.stat().st_size == size
    cache.chmod(0o777)
    res = fresh_venv.run(SCRIPT, "extract", str(cache), check=False)
    assert res.returncode != 0
    assert "writable by others (mode 777)" in res.stderr
    assert "chmod go-w" in res.stderr
