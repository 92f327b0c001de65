"""The release package's one error root (the report, publishing): exit 1."""

from __future__ import annotations

from base.errors import StageError


class ReleaseError(StageError):
    """The report cannot be written or publishing stopped; the message names the file and the fix."""
