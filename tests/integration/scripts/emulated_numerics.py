"""Run inside a fresh venv: scripts/numerics.py against a test-only emulated CPU variant library
(KT_TEST_VARIANT_LIBRARY=<build>/emulated/libkt_cpu_NAME.so) instead of the variant kt_kernel chose.
The library is loaded by kt_kernel's own loader (_core.Variant: ABI check, ops table) and put where
kt_kernel.MoE looks it up; the JSON names it "<name>-emulated"."""

from __future__ import annotations

import os
import runpy
import sys
from pathlib import Path

import kt_kernel

kt_kernel._VARIANT = kt_kernel._core.Variant(os.environ["KT_TEST_VARIANT_LIBRARY"])
kt_kernel.__cpu_variant__ = kt_kernel._VARIANT.name + "-emulated"
sys.argv = [str(Path(__file__).with_name("numerics.py")), *sys.argv[1:]]
runpy.run_path(sys.argv[0], run_name="__main__")
