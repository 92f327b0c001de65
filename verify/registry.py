"""Every verification profile of `nox -s verify_install`, in the order a plain run runs them: the one
registry. The command line's choices, the stage keys' entry points and the release verdict's checks all
derive from it.

- ``venv``: the release installed into a fresh venv as a user installs it, then exercised (verify.__main__);
- ``interpreters``: the release on another CPython, in a Debian root (verify.interpreters);
- ``resolution``: normal resolution of every install profile on every Python of the matrix
  (verify.resolution).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Profile:
    name: str
    runs: str  # "venv", "interpreters" or "resolution"
    what: str
    python: str = ""  # interpreters: the CPython it runs on
    suite: str = ""  # interpreters: the Debian suite whose python3 that is
    upstream_only: bool = False  # installs nothing of dist/: a new build keeps its result


PROFILES: tuple[Profile, ...] = (
    Profile("sft-cpu", "venv", "the CPU torch lock: kt_kernel.sft training, resume"),
    Profile("sft", "venv", "the published sft install file (CUDA torch, run on the CPU)"),
    Profile("serve", "venv", "the published serve install file: SGLang on CPU, kt-doctor --run"),
    Profile("lf-standard", "venv", "upstream LlamaFactory, no KT wheel", upstream_only=True),
    Profile("lf-kt", "venv", "the published lf-kt install file: LlamaFactory training with use_kt"),
    Profile("lf-upgrade", "venv", "lf-kt installed over an upstream LlamaFactory environment"),
    Profile("cp313", "interpreters", "the release on Debian trixie's CPython 3.13", python="3.13", suite="trixie"),
    Profile("resolve", "resolution", "normal resolution of every install profile on every Python"),
)
BY_NAME = {p.name: p for p in PROFILES}
VENV = tuple(p.name for p in PROFILES if p.runs == "venv")
UPSTREAM_ONLY = frozenset(p.name for p in PROFILES if p.upstream_only)  # no wheel of dist/ installed
SUITES = {p.python: p.suite for p in PROFILES if p.runs == "interpreters"}  # CPython -> its Debian suite
PUBLISHED = ("sft", "serve", "lf-kt")  # the install files an interpreters profile exercises as published
