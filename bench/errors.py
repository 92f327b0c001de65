"""The benchmarks' one error root: exit 1 (a reference that does not round-trip, a missing input)."""

from __future__ import annotations

from base.errors import StageError


class BenchError(StageError):
    """A benchmark cannot measure; the message says what is missing or wrong."""
