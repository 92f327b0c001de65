"""Progress for long work, so nobody wonders whether a release hung.

On a terminal, a tqdm bar; in a log (CI, a pipe), plain lines: a stage's start and its elapsed
time, and while a quiet subprocess runs, a "still running" line every `every` seconds (never
silent for more than ~10 s of work). Stdlib plus tqdm (locked in toolchain.txt, test.txt).
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import IO, Any, TypeVar

T = TypeVar("T")
HEARTBEAT_S = 10.0


def _tty(stream: IO[str]) -> bool:
    return hasattr(stream, "isatty") and stream.isatty()


def say(label: str, msg: str, stream: IO[str] | None = None) -> None:
    """One timestamped progress line."""
    out = stream or sys.stdout
    out.write(f"[{label} {time.strftime('%H:%M:%S')}] {msg}\n")
    out.flush()


@contextmanager
def stage(label: str, what: str, stream: IO[str] | None = None) -> Iterator[None]:
    """`what` started, and how long it took (or that it failed, after how long)."""
    t0 = time.perf_counter()
    say(label, f"{what} ...", stream)
    try:
        yield
    except BaseException:
        say(label, f"{what}: failed after {time.perf_counter() - t0:.1f}s", stream)
        raise
    say(label, f"{what}: done in {time.perf_counter() - t0:.1f}s", stream)


def each(items: Sequence[T], label: str, describe: Any = str, stream: IO[str] | None = None) -> Iterator[T]:
    """Iterate with progress: a bar on a terminal, a line per item (n/N, elapsed) in a log."""
    out = stream or sys.stderr
    t0 = time.perf_counter()
    if _tty(out):
        from tqdm import tqdm

        bar = tqdm(items, desc=label, unit="step", file=out, leave=True)
        for item in bar:
            bar.set_postfix_str(str(describe(item))[:40])
            yield item
        return
    for i, item in enumerate(items, 1):
        say(label, f"{i}/{len(items)} {describe(item)} ({time.perf_counter() - t0:.0f}s so far)", out)
        yield item


def run_quiet(
    cmd: Sequence[str], label: str, *, every: float = HEARTBEAT_S, stream: IO[str] | None = None, **kwargs: Any
) -> subprocess.CompletedProcess[str]:
    """subprocess.run with captured output, saying "still running" every `every` seconds meanwhile."""
    out = stream or sys.stdout
    done = threading.Event()
    t0 = time.perf_counter()

    def beat() -> None:
        while not done.wait(every):
            say(label, f"still running ({time.perf_counter() - t0:.0f}s)", out)

    thread = threading.Thread(target=beat, daemon=True)
    thread.start()
    try:
        return subprocess.run(list(cmd), capture_output=True, text=True, check=False, **kwargs)
    finally:
        done.set()
        thread.join()


def table(rows: Iterable[tuple[str, float]], title: str = "timing") -> str:
    """A stage-by-stage timing table."""
    rows = list(rows)
    width = max((len(n) for n, _ in rows), default=5)
    lines = [f"{title}:"] + [f"  {n:<{width}}  {s:8.1f} s" for n, s in rows]
    lines.append(f"  {'total':<{width}}  {sum(s for _, s in rows):8.1f} s")
    return "\n".join(lines)
