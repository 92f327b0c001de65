"""Inputs: upstream wheels fetched with pip and verified against the lock, or a
git commit built with `python -m build`. Everything is cached by content."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version

from base import cachedir, paths, progress, stagecache, swap
from base.version import python_tag
from locks.read import parse_lock
from locks.targets import download, serves

from . import proc
from .errors import InputError
from .model import Source

LOCK = paths.LOCKFILES / "carrier-inputs.txt"
CACHE_ENV = "KT_RELEASE_CACHE"


@dataclass(frozen=True)
class Input:
    """A verified input wheel: name, version, path and sha256."""

    name: str
    version: str
    path: Path
    sha256: str


sha256 = stagecache.file_sha256  # the hex sha256 of a file (its one owner is base, below every stage)


def default_cache() -> Path:
    """Where downloaded inputs are kept (KT_RELEASE_CACHE, else build/cache/inputs)."""
    return Path(os.environ.get(CACHE_ENV) or paths.INPUTS_CACHE)


def locked_pins(lock: Path = LOCK) -> dict[str, tuple[str, tuple[str, ...]]]:
    """name -> (version, allowed sha256s) from the hash-locked inputs."""
    return {n: (str(p.version), p.hashes) for n, p in parse_lock(lock).items()}


def fetch_matrix(name: str, pythons: Sequence[str], lock: Path = LOCK, cache: Path | None = None) -> list[Input]:
    """The locked wheels of upstream `name` that together serve every Python of `pythons`, each file once
    (a py3-none-any or abi3 wheel serves them all; a cp3XX wheel one each)."""
    found: list[Input] = []
    for python in pythons:
        if not any(serves(i.path.name, python) for i in found):
            found.append(fetch(name, lock, cache, python=python))
    return found


def fetch(name: str, lock: Path = LOCK, cache: Path | None = None, *, python: str = "3.11") -> Input:
    """The locked wheel of upstream `name` for CPython `python`, downloaded once and verified every time."""
    pins = locked_pins(lock)
    key = canonicalize_name(name)
    if key not in pins:
        raise InputError(f"{lock}: {name} is not locked; add it to lockfiles/carrier-inputs.in and run `nox -s lock`")
    version, hashes = pins[key]
    cache = cachedir.owned(cache or default_cache(), "inputs cache")
    if (cache / key).is_dir():
        cachedir.owned(cache / key, "inputs cache")
    for cached in sorted((cache / key).glob("*.whl")) if (cache / key).is_dir() else []:
        if parse_wheel_filename(cached.name)[1] == Version(version) and serves(cached.name, python):
            digest = sha256(cached)
            if digest in hashes:
                return Input(key, version, cached, digest)
            cached.unlink()  # stale or tampered cache entry: fetch again
    abi = python_tag(python)
    with tempfile.TemporaryDirectory() as tmp:
        progress.say("inputs", f"downloading {name}=={version} for CPython {python} (locked by hash) ...")
        index = os.environ.get("KT_INPUT_INDEX_URL", "https://pypi.org/simple")
        got = download([f"{name}=={version}"], python, Path(tmp), f"inputs: {name} ({abi})", index_url=index)
        wheels = sorted(Path(tmp).glob("*.whl"))
        if got.returncode != 0 and "No matching distribution" in got.stderr:
            raise InputError(
                f"{name}=={version} publishes no wheel for CPython {python} (x86_64 manylinux), which the "
                f"release's Python matrix (pythons in carriers/carriers.toml) includes. Drop {python} from "
                "the matrix, lock a version of it that has one, or build a partial development release for "
                "the Pythons it has (nox -s build_all -- --partial 3.11); nothing was written to dist/"
            )
        if got.returncode != 0 or len(wheels) != 1:
            raise InputError(
                f"downloading {name}=={version} for CPython {python} failed:\n{got.stderr.strip()[-2000:]}"
            )
        digest = sha256(wheels[0])
        if digest not in hashes:
            raise InputError(
                f"{wheels[0].name}: sha256 {digest} is not the locked hash "
                f"({', '.join(hashes)}) in {lock.name}. The index served different bytes than were locked; "
                "nothing was written to dist/. Re-lock (nox -s lock) only if the new file is expected."
            )
        dest = cachedir.owned(cache / key, "inputs cache") / wheels[0].name
        # Into the cache under a name of its own, then renamed: another process (a second test worker)
        # never reads a half-copied entry, even where the temporary folder is another file system.
        staged = swap.part(dest)
        shutil.move(str(wheels[0]), staged)
        staged.replace(dest)
    return Input(key, version, dest, digest)


def verify(path: Path, name: str, lock: Path = LOCK) -> Input:
    """Check a wheel given by hand (tests, offline mirrors) against the lock."""
    version, hashes = locked_pins(lock)[canonicalize_name(name)]
    digest = sha256(path)
    if digest not in hashes:
        raise InputError(
            f"{path.name}: sha256 {digest} is not the locked hash ({', '.join(hashes)}) in {lock.name}; "
            "refusing to use it"
        )
    return Input(canonicalize_name(name), version, path, digest)


def build_source(name: str, source: Source, cache: Path | None = None) -> Input:
    """Build a wheel from `source.git` at exactly `source.commit` (python -m build)."""
    cache = (cache or default_cache()) / "source" / source.commit
    done = sorted(cache.glob("*.whl")) if cache.is_dir() else []
    if done:
        return Input(canonicalize_name(name), parse_wheel_filename(done[0].name)[1].public, done[0], sha256(done[0]))
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "src"

        def git(*args: str) -> str:
            return proc.run(["git", *args], f"git {' '.join(args)} for {name} ({source.git})", InputError)

        git("clone", "--quiet", "--no-checkout", source.git, str(tree))
        git("-C", str(tree), "checkout", "--quiet", "--detach", source.commit)
        head = git("-C", str(tree), "rev-parse", "HEAD").strip()
        if head != source.commit:
            raise InputError(f"{source.git}: checked out {head}, not the pinned commit {source.commit}")
        out = Path(tmp) / "out"
        proc.run(
            [sys.executable, "-m", "build", "--wheel", "--outdir", str(out), str(tree)],
            f"building {name} from {source.git}@{source.commit[:12]}",
            InputError,
        )
        wheels = sorted(out.glob("*.whl"))
        if len(wheels) != 1:
            raise InputError(
                f"building {name} from {source.git}@{source.commit[:12]} made {len(wheels)} wheels, not one"
            )
        cache.mkdir(parents=True, exist_ok=True)
        dest = cache / wheels[0].name
        staged = swap.part(dest)  # renamed whole into place, as fetched wheels
        shutil.move(str(wheels[0]), staged)
        staged.replace(dest)
    version = parse_wheel_filename(dest.name)[1].public
    return Input(canonicalize_name(name), version, dest, sha256(dest))
