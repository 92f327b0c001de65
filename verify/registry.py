"""Every verification profile of `nox -s verify_install`, in the order a plain run runs them: the one
registry. The command line's choices, the stage keys' entry points, CI's verify matrix and the release
verdict's checks all derive from it.

- ``venv``: the release installed into a fresh venv of the Python's own interpreter as a user installs
  it, then exercised (verify.__main__); a ``published`` profile installs dist/install/<profile>-cp3NN.txt
  exactly as published and runs on every Python of the matrix, the others on the Python the CPU locks
  are made for (lockfiles/*.txt: locks.read.PYTHON_VERSION);
- ``resolution``: normal resolution of every install profile with each Python's own pip (verify.resolution).

The interpreter for each Python comes from base.interpreters (given, PATH, pyenv, uv, a Debian root).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from base.version import python_tag
from locks.read import PYTHON_VERSION

LOCK_PYTHON = PYTHON_VERSION  # the CPython lockfiles/*.txt (sft-cpu, lf-standard) are made for


@dataclass(frozen=True)
class Profile:
    name: str
    runs: str  # "venv" or "resolution"
    what: str
    published: bool = False  # installs its published install file: runs on every Python of the matrix
    upstream_only: bool = False  # installs nothing of dist/: a new build keeps its result

    def pythons(self, matrix: Sequence[str]) -> list[str]:
        """The Pythons this profile runs on, of those asked for (`matrix`)."""
        if self.published or self.runs == "resolution":
            return list(matrix)
        return [LOCK_PYTHON] if LOCK_PYTHON in matrix else []


PROFILES: tuple[Profile, ...] = (
    Profile("sft-cpu", "venv", "the CPU torch lock: kt_kernel.sft training, resume"),
    Profile("sft", "venv", "the published sft install file (CUDA torch, run on the CPU)", published=True),
    Profile("serve", "venv", "the published serve install file: SGLang on CPU, kt-doctor --run", published=True),
    Profile("lf-standard", "venv", "upstream LlamaFactory, no KT wheel", upstream_only=True),
    Profile("lf-kt", "venv", "the published lf-kt install file: LlamaFactory training with use_kt", published=True),
    Profile("lf-upgrade", "venv", "lf-kt installed over an upstream LlamaFactory environment"),
    Profile("resolve", "resolution", "normal resolution of every install profile with each Python's own pip"),
)
BY_NAME = {p.name: p for p in PROFILES}
VENV = tuple(p.name for p in PROFILES if p.runs == "venv")
UPSTREAM_ONLY = frozenset(p.name for p in PROFILES if p.upstream_only)  # no wheel of dist/ installed
PUBLISHED = tuple(p.name for p in PROFILES if p.published)  # the install files exercised on every Python


def run_name(profile: str, python: str) -> str:
    """One run's name: a venv profile on one Python (`sft-cp312`), the verdict's `verify:` item."""
    return f"{profile}-{python_tag(python)}"


def venv_runs(matrix: Sequence[str], chosen: Sequence[str] = VENV) -> list[tuple[str, str]]:
    """(profile, python) of every venv run over `matrix`, in the registry's order, Python by Python."""
    return [
        (p.name, py)
        for py in matrix
        for p in PROFILES
        if p.runs == "venv" and p.name in chosen and py in p.pythons(matrix)
    ]
