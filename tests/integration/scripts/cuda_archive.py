"""Run inside a fresh venv with the kt-kernel wheel: exercises the lazy CUDA
archive without a GPU. `python cuda_archive.py ACTION CACHE_DIR` prints JSON."""

from __future__ import annotations

import ctypes
import json
import shutil
import sys
from pathlib import Path

import kt_kernel


def main() -> None:
    action, cache = sys.argv[1], Path(sys.argv[2])
    section = kt_kernel.build_manifest()["cuda"]
    out: dict[str, object] = {"action": action}
    if action != "cpu-only":
        from kt_kernel import cuda
    if action == "extract":
        out["root"] = str(cuda.extract(section, cache))
    elif action == "load-layout":
        root = cuda.extract(section, cache)
        common, hopper = cuda.load_libraries(root, section, with_hopper=True)
        out["loaded"] = [common._name, hopper._name if hopper else None]
        count = ctypes.c_int(-1)
        err = common.kt_cuda_device_count(ctypes.byref(count))
        common.kt_cuda_error_string.restype = ctypes.c_char_p
        out["device_count_error"] = [err, common.kt_cuda_error_string(err).decode()]
    elif action == "load-flattened":
        root = cuda.extract(section, cache)
        flat = cache / "flat"
        flat.mkdir()
        for f in section["files"]:
            shutil.copy(root / f, flat / Path(f).name)
        try:
            ctypes.CDLL(str(flat / "libkt_cuda_sm90a.so"))
            out["error"] = None
        except OSError as exc:
            out["error"] = str(exc)
        legacy = dict(section, layout=1, files={Path(f).name: v for f, v in section["files"].items()})
        common, hopper = cuda.load_libraries(flat, legacy, with_hopper=True)
        out["legacy_loaded"] = [common._name, hopper._name if hopper else None]
    elif action == "launch":
        try:
            cuda.load()
            out["error"] = None
        except cuda.CudaError as exc:
            out["error"] = f"{type(exc).__name__}: {exc}"
    elif action == "cpu-only":
        import numpy as np

        rng = np.random.default_rng(0)
        q = [kt_kernel.quantize(rng.standard_normal(s, dtype=np.float32), "int8") for s in ((2, 64, 64),) * 3]
        kt_kernel.moe_forward(
            rng.standard_normal((2, 64), dtype=np.float32), np.array([[0], [1]]), np.ones((2, 1), np.float32), *q
        )
        maps = Path("/proc/self/maps").read_text()
        out["cuda_module_imported"] = "kt_kernel.cuda" in sys.modules
        out["cuda_library_mapped"] = "libkt_cuda" in maps
        out["cache_exists"] = cache.exists()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
