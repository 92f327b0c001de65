"""The lazy CUDA archive: extracted on first CUDA use, then loaded with ctypes.

Importing kt_kernel never touches this module; CPU-only use never extracts or
loads anything CUDA. In a release (``"archive": "release"`` in the ``cuda``
section of ``_build.json``) the libraries travel in the release's lazy payload
(kt_kernel.payload) under ``kt_kernel/cuda/``. A kernel-only wheel carries its
own payload (a tar.xz inside the wheel, described by that section), unpacked into a content-addressed cache,
``$KT_KERNEL_CACHE_DIR`` or ``$XDG_CACHE_HOME/kt-kernel/cuda``, as
``<cache>/<payload sha256>/``, keeping its relative layout: ``lib/libkt_cuda.so``
and ``sm90a/libkt_cuda_sm90a.so``, which finds the former through its RUNPATH
``$ORIGIN/../lib``. Extraction is atomic (temp dir + rename), serialised between
processes by a file lock, and verified member by member against the manifest.
"""

from __future__ import annotations

import ctypes
import hashlib
import io
import os
import posixpath
import shutil
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ._cpu import KTKernelError

# One owner for the cache variable, the crash-test hook, the atomic install and the path check.
from .payload import (
    _CRASH_ENV,
    CACHE_ENV,  # noqa: F401 - kt_kernel.cuda.CACHE_ENV stays importable
    check_owned,
    hold,
    install_atomically,
    is_complete,
    lock_file,
    safe_member_name,
)
from .payload import cache_root as _cache_root
from .payload import locked as _locked

_PKG = Path(__file__).resolve().parent

CUDA_ERROR_INSUFFICIENT_DRIVER = 35
CUDA_ERROR_NO_DEVICE = 100


class CudaError(KTKernelError):
    """The CUDA archive cannot be used; the message says why and what to do."""


class CudaUnavailable(CudaError):
    """No driver or no device: the CUDA kernels cannot run on this machine."""


def _manifest_section() -> dict[str, Any]:
    from . import _MANIFEST

    section = _MANIFEST.get("cuda")
    if not section:
        raise CudaError("this kt-kernel wheel carries no CUDA archive (it was built without KT_CUDA=ON)")
    return dict(section)


def cache_root() -> Path:
    """Where extracted CUDA libraries are cached: $KT_KERNEL_CACHE_DIR, else $XDG_CACHE_HOME/kt-kernel/cuda."""
    return _cache_root("cuda")


def _safe_name(name: str, payload: Path) -> str:
    try:
        return safe_member_name(name, f"CUDA archive {payload}", "reinstall kt-kernel")
    except KTKernelError as exc:  # the same check as the release payload's, reported as this module's error
        raise CudaError(str(exc)) from None


def _extract_into(tmp: Path, payload: Path, data: bytes, files: dict[str, Any]) -> None:
    crash_after = int(os.environ.get(_CRASH_ENV, "0") or 0)
    seen: set[str] = set()
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:xz") as tar:
        for info in tar:
            name = _safe_name(info.name, payload)
            if info.isdir():
                (tmp / name).mkdir(parents=True, exist_ok=True)
                continue
            if info.issym() or info.islnk():
                target = posixpath.normpath(posixpath.join(posixpath.dirname(name), info.linkname))
                if info.linkname.startswith("/") or target.startswith(".."):
                    raise CudaError(
                        f"corrupted CUDA archive {payload}: link {name!r} -> {info.linkname!r} escapes "
                        "the archive root; reinstall kt-kernel"
                    )
                raise CudaError(f"corrupted CUDA archive {payload}: unexpected link member {name!r}")
            if not info.isfile():
                raise CudaError(f"corrupted CUDA archive {payload}: {name!r} is a special file; reinstall kt-kernel")
            expected = files.get(name)
            if expected is None:
                raise CudaError(f"corrupted CUDA archive {payload}: member {name!r} is not in the build manifest")
            fh = tar.extractfile(info)
            content = fh.read() if fh else b""
            actual = hashlib.sha256(content).hexdigest()
            if actual != expected["sha256"]:
                raise CudaError(
                    f"corrupted CUDA archive {payload}: member {name} has sha256 {actual}, the "
                    f"manifest says {expected['sha256']}; reinstall kt-kernel"
                )
            out = tmp / name
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(content)
            out.chmod(0o755)
            seen.add(name)
            if crash_after and len(seen) >= crash_after:
                os._exit(70)
    missing = sorted(set(files) - seen)
    if missing:
        raise CudaError(f"corrupted CUDA archive {payload}: members {missing} are missing; reinstall kt-kernel")


def extract(section: dict[str, Any] | None = None, root: Path | None = None, package_dir: Path = _PKG.parent) -> Path:
    """The extracted archive's directory; extracts it first if no process has."""
    section = section or _manifest_section()
    if section.get("archive") == "release":
        # A release's kt-kernel: the libraries travel in the release's lazy CUDA payload.
        from .payload import materialize

        return materialize() / str(section["root"])
    root = root or cache_root()
    digest: str = section["sha256"]
    final = root / digest
    # The warm path checks what the payload's does: this user's directory, every file a regular
    # file of its declared size (a library truncated by a full disk is extracted again).
    sizes: dict[str, int | None] = {
        name: int(f["size"]) if "size" in f else None for name, f in section["files"].items()
    }
    check_owned(root, "CUDA cache", CudaError)
    if is_complete(final, sizes, CudaError):
        hold(root, digest, CudaError)
        return final
    lock = lock_file(root, digest, "CUDA cache", CudaError)
    with _locked(lock, CudaError):
        if is_complete(final, sizes, CudaError):  # another process finished while we waited
            hold(root, digest, CudaError)
            return final
        for stale in root.glob(f".tmp-{digest}-*"):  # left by a crash mid-extraction
            shutil.rmtree(stale, ignore_errors=True)
        if final.exists():
            shutil.rmtree(final)
        payload = package_dir / section["payload"]
        try:
            data = payload.read_bytes()
        except OSError as exc:
            raise CudaError(f"the CUDA archive {payload} is unreadable ({exc.strerror}); reinstall kt-kernel") from None
        actual = hashlib.sha256(data).hexdigest()
        if actual != digest:
            raise CudaError(
                f"corrupted CUDA archive {payload}: sha256 {actual}, the manifest says {digest}; reinstall kt-kernel"
            )
        need = f"{sum(s or 0 for s in sizes.values()) / 2**20:.0f} MiB"
        fill = lambda tmp: _extract_into(tmp, payload, data, section["files"])  # noqa: E731
        done = install_atomically(root, digest, fill, need, CudaError)
        hold(root, digest, CudaError)
        return done


def is_legacy(section: dict[str, Any]) -> bool:
    """Payloads before layout 2 put every library in one directory, without inter-library paths."""
    return int(section.get("layout", 1)) < 2 or all("/" not in f for f in section["files"])


@dataclass(frozen=True)
class CudaLibrary:
    """The loaded CUDA libraries: the common one, the Hopper one where the GPU is sm90, and the arch."""

    common: ctypes.CDLL
    hopper: ctypes.CDLL | None
    arch: str

    def gemm(self) -> Any:
        """The grouped GEMM entry point the device should use."""
        if self.hopper is not None:
            return self.hopper.kt_cuda_sm90a_grouped_gemm_bf16
        return self.common.kt_cuda_grouped_gemm_bf16


def load_libraries(root: Path, section: dict[str, Any], with_hopper: bool) -> tuple[ctypes.CDLL, ctypes.CDLL | None]:
    """dlopen the extracted archive (no GPU needed for this step)."""
    files = section["files"]
    common_name = next(f for f in files if posixpath.basename(f) == "libkt_cuda.so")
    hopper_name = next((f for f in files if posixpath.basename(f) == "libkt_cuda_sm90a.so"), None)
    if is_legacy(section):
        # Legacy layout: no RUNPATH between the libraries; load the common one
        # globally first so the Hopper library's DT_NEEDED resolves by soname.
        common = ctypes.CDLL(str(root / common_name), mode=ctypes.RTLD_GLOBAL)
    else:
        common = ctypes.CDLL(str(root / common_name))
    hopper = ctypes.CDLL(str(root / hopper_name)) if with_hopper and hopper_name else None
    return common, hopper


def _check_driver() -> None:
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        raise CudaUnavailable(
            f"no NVIDIA driver: libcuda.so.1 could not be loaded ({exc}). Install the NVIDIA driver, "
            "or use the CPU kernels (kt_kernel.MoE)"
        ) from None


_LOADED: CudaLibrary | None = None


def load() -> CudaLibrary:
    """Extract (once), check driver, device and architecture, and load the archive."""
    global _LOADED  # noqa: PLW0603 - one archive per process
    if _LOADED is not None:
        return _LOADED
    section = _manifest_section()
    _check_driver()
    root = extract(section)
    common, _ = load_libraries(root, section, with_hopper=False)
    count = ctypes.c_int(0)
    err = common.kt_cuda_device_count(ctypes.byref(count))
    if err == CUDA_ERROR_INSUFFICIENT_DRIVER:
        raise CudaUnavailable(
            "the NVIDIA driver is older than this CUDA runtime needs (cudaErrorInsufficientDriver); update the driver"
        )
    if err == CUDA_ERROR_NO_DEVICE or (err == 0 and count.value == 0):
        raise CudaUnavailable("no CUDA device is visible (check CUDA_VISIBLE_DEVICES and nvidia-smi)")
    if err:
        raise CudaError(f"cudaGetDeviceCount failed: {common.kt_cuda_error_string(err)}")
    major, minor = ctypes.c_int(0), ctypes.c_int(0)
    common.kt_cuda_device_capability(0, ctypes.byref(major), ctypes.byref(minor))
    arch = f"sm_{major.value}{minor.value}"
    sass = sorted({a for f in section["files"].values() for a in f["sass"]})
    ptx = sorted({a for f in section["files"].values() for a in f["ptx"]})
    common_file = next(v for f, v in section["files"].items() if posixpath.basename(f) == "libkt_cuda.so")
    # PTX for compute_XY is JIT-compiled by the driver for any device of capability >= X.Y.
    jit_ok = any(int(p.split("_")[1].rstrip("a")) <= major.value * 10 + minor.value for p in common_file["ptx"])
    if arch not in common_file["sass"] and not jit_ok:
        raise CudaError(
            f"this GPU is {arch}, which the CUDA archive does not cover: it holds SASS for "
            f"{', '.join(sass)} and PTX for {', '.join(ptx) or 'nothing'}"
        )
    _, hopper = load_libraries(root, section, with_hopper=(major.value, minor.value) == (9, 0))
    _LOADED = CudaLibrary(common, hopper, arch)
    return _LOADED


def _stream(stream: Any) -> ctypes.c_void_p:
    if stream is None:
        import torch

        stream = torch.cuda.current_stream().cuda_stream
    return ctypes.c_void_p(int(stream))


def _check(lib: CudaLibrary, err: int, what: str) -> None:
    if err:
        raise CudaError(f"{what} failed: {lib.common.kt_cuda_error_string(err).decode()}")


def router_topk(logits: Any, topk: int, *, renormalize: bool = True, stream: Any = None) -> tuple[Any, Any]:
    """Softmax + top-k over experts for f32 CUDA logits [tokens, experts]: (ids int64, weights f32)."""
    import torch

    lib = load()
    logits = logits.contiguous().float()
    tokens, experts = logits.shape
    ids = torch.empty((tokens, topk), dtype=torch.int64, device=logits.device)
    weights = torch.empty((tokens, topk), dtype=torch.float32, device=logits.device)
    fn = lib.common.kt_cuda_router_topk_f32
    fn.argtypes = [
        ctypes.c_void_p,
        ctypes.c_int64,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_void_p,
        ctypes.c_void_p,
        ctypes.c_void_p,
    ]
    err = fn(
        logits.data_ptr(), tokens, experts, topk, int(renormalize), ids.data_ptr(), weights.data_ptr(), _stream(stream)
    )
    _check(lib, err, "router_topk")
    return ids, weights


def dequantize(q: Any, scale: Any, fmt: str, cols: int, group_size: int = 0, *, stream: Any = None) -> Any:
    """Dequantise CUDA tensors (layouts as kt_kernel.quantize) to bf16 [rows, cols]."""
    import torch

    lib = load()
    rows = q.numel() * (2 if fmt == "rawint4" else 1) // cols
    out = torch.empty((rows, cols), dtype=torch.bfloat16, device=q.device)
    if fmt == "int8":
        fn = lib.common.kt_cuda_dequant_int8_bf16
        fn.argtypes = [
            ctypes.c_void_p,
            ctypes.c_void_p,
            ctypes.c_int64,
            ctypes.c_int64,
            ctypes.c_void_p,
            ctypes.c_void_p,
        ]
        err = fn(q.data_ptr(), scale.data_ptr(), rows, cols, out.data_ptr(), _stream(stream))
    else:
        fn = lib.common.kt_cuda_dequant_rawint4_bf16
        fn.argtypes = [
            ctypes.c_void_p,
            ctypes.c_void_p,
            ctypes.c_int64,
            ctypes.c_int64,
            ctypes.c_int,
            ctypes.c_void_p,
            ctypes.c_void_p,
        ]
        err = fn(q.data_ptr(), scale.data_ptr(), rows, cols, group_size, out.data_ptr(), _stream(stream))
    _check(lib, err, "dequantize")
    return out


def grouped_gemm(x: Any, offsets: Any, w: Any, *, stream: Any = None) -> Any:
    """y[rows of expert e] = x[rows of e] @ w[e].T; x bf16 [M, k] sorted by expert, w bf16 [E, n, k]."""
    import torch

    lib = load()
    experts, n, k = w.shape
    y = torch.empty((x.shape[0], n), dtype=torch.float32, device=x.device)
    fn = lib.gemm()
    fn.argtypes = [
        ctypes.c_void_p,
        ctypes.c_void_p,
        ctypes.c_int,
        ctypes.c_void_p,
        ctypes.c_int64,
        ctypes.c_int64,
        ctypes.c_void_p,
        ctypes.c_void_p,
    ]
    err = fn(
        x.contiguous().data_ptr(),
        offsets.contiguous().data_ptr(),
        experts,
        w.contiguous().data_ptr(),
        n,
        k,
        y.data_ptr(),
        _stream(stream),
    )
    _check(lib, err, "grouped_gemm")
    return y
