"""kt-release carriers: the five release wheels and the PEFT/TRL repacks,
derived reproducibly from hash-checked inputs (carriers.toml)."""

from .errors import CarrierError, ConsistencyError, DefinitionError, InputError, PatchError
from .model import Carrier, CarrierSet, load

__all__ = [
    "Carrier",
    "CarrierError",
    "CarrierSet",
    "ConsistencyError",
    "DefinitionError",
    "InputError",
    "PatchError",
    "load",
]
