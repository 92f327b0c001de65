"""The one way the carriers run a tool: output captured, and a failure raised as the caller's
CarrierError naming the step, the exit status and the tail of what the tool said."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence

from .errors import CarrierError


def run(cmd: Sequence[str], step: str, error: type[CarrierError], hint: str = "") -> str:
    """Run `cmd`; its stdout, or `error` saying which step failed and why (no traceback, no
    CalledProcessError for the user). `hint` says what to do about it."""
    try:
        proc = subprocess.run(list(cmd), capture_output=True, text=True, check=False)
    except OSError as exc:  # the tool itself is missing
        raise error(f"{step}: cannot run {cmd[0]} ({exc})" + (f"; {hint}" if hint else "")) from None
    if proc.returncode != 0:
        said = (proc.stderr.strip() or proc.stdout.strip())[-2000:]
        raise error(f"{step} failed (exit {proc.returncode}): {said}" + (f"\n{hint}" if hint else ""))
    return proc.stdout
