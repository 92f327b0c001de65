"""The benchmarks' one timer: the median of single calls after a warm-up, taken with
time.perf_counter. (pyperf's runner spawns and calibrates worker processes itself; these
benchmarks interleave rounds of ours and the reference in one process, with a bandwidth probe
beside each timing, so they time calls directly.)"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any


def median_seconds(fn: Callable[[], Any], min_reps: int = 3, min_time: float = 0.0) -> float:
    """Median seconds per call of `fn` after one warm-up call: at least `min_reps` calls and at
    least `min_time` seconds of them."""
    fn()
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < min_reps or time.perf_counter() - start < min_time:
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)
