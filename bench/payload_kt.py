"""Run by path with the venv holding KTransformers 0.7.2's carriers: their own runtime materializes its CUDA
payload (sgl_kernel/payload_runtime.py, _materialize_all: the parts concatenated into a temporary
payload.tar.gz, hashed, extracted, every file hashed, renamed into SGL_KERNEL_KT_CACHE_DIR). sgl_kernel's
__init__ imports torch and loads its CUDA ops, which materialization never needs: the package is entered
without running it, so the measured work is theirs alone. Prints {"seconds", "dir"} as JSON."""

from __future__ import annotations

import importlib.util
import json
import sys
import time
import types


def main() -> None:
    spec = importlib.util.find_spec("sgl_kernel")
    if spec is None or spec.submodule_search_locations is None:
        raise SystemExit("sgl_kernel (KTransformers' kt-kernel 0.7.2) is not installed in this environment")
    package = types.ModuleType("sgl_kernel")
    package.__path__ = list(spec.submodule_search_locations)
    sys.modules["sgl_kernel"] = package
    t0 = time.perf_counter()
    from sgl_kernel import payload_runtime

    root = payload_runtime._materialize_all()
    print(json.dumps({"seconds": time.perf_counter() - t0, "dir": str(root)}))


if __name__ == "__main__":
    main()
