"""The maintainer actions' one error root: exit 1."""

from __future__ import annotations

from base.errors import StageError


class MaintError(StageError):
    """A maintainer action cannot go on; the message says what and the fix."""
