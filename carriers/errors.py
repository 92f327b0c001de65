"""The carriers' one exception root; only the CLI catches it."""

from __future__ import annotations

from base.errors import StageError


class CarrierError(StageError):
    """Assembly cannot go on; the message names the file, the problem and the fix."""


class DefinitionError(CarrierError):
    """carriers.toml is malformed."""


class InputError(CarrierError):
    """An input wheel or source tree is missing, unverifiable or wrong."""


class PatchError(CarrierError):
    """A fork's patch no longer applies."""


class ConsistencyError(CarrierError):
    """The carrier set disagrees with itself (pins, bounds, torch)."""
