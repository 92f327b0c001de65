"""`nox -s assemble`: the release's wheels (carriers.toml: the five carriers, the forks and the
dependency-only repacks) derived reproducibly from hash-checked inputs, the CUDA payload cut into parts
(`payload`), the install files (`install`), all swapped into dist/ whole (`assemble`). Stages above
reach it through `carriers` (load), `model`, `graph`, `wheelio` and `consistency` only."""

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
