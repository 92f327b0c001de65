"""The error every release stage's own root derives from, and how a CLI reports it.

Each package has one root (carriers.CarrierError, locks.LockError, verify.VerifyError,
release.ReleaseError, bundle.BundleError, bench.BenchError, maint.MaintError) with the exit code
its CLI returns; the message names the file, the problem and the fix. A CLI catches `StageError`,
prints `error: <message>` and exits with that code: no traceback for a user's mistake. The audit
keeps its own root (audits.errors.AuditError), since it ships alone.
"""

from __future__ import annotations

import sys


class StageError(Exception):
    """A release stage cannot go on; the message says what, where and how to fix it."""

    exit_code = 1


def report(exc: BaseException) -> int:
    """Print `error: <message>` on stderr; the exit code the error carries (1 if it has none)."""
    print(f"error: {exc}", file=sys.stderr)
    code = getattr(exc, "exit_code", 1)
    return code if isinstance(code, int) else 1
