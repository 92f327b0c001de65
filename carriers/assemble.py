"""Assemble the release into dist/: every carrier wheel, checked for
consistency, with SHA256SUMS and manifest.json - swapped in atomically, so a
failure leaves the previous dist/ exactly as it was."""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.utils import parse_wheel_filename

from tools import progress

from . import consistency, inputs, payload, transform, wheelio
from .errors import ConsistencyError, InputError
from .model import Carrier, CarrierSet


@dataclass
class Built:
    """One wheel the assembly wrote, with its inputs and patches for manifest.json."""

    name: str
    version: str
    kind: str
    path: Path
    inputs: list[dict[str, str]] = field(default_factory=list)
    patches: list[dict[str, str]] = field(default_factory=list)
    payload: dict[str, Any] | None = None  # the lazy CUDA archive's summary (on one entry)


read_metadata = wheelio.read_metadata  # (Version, Requires-Dist) of a built wheel


@dataclass(frozen=True)
class _Job:
    """What every carrier builder reads."""

    cs: CarrierSet
    out: Path
    versions: Mapping[str, str]
    sources: Mapping[str, inputs.Input]
    upstream_of: Mapping[str, str]
    kernels: Sequence[Path]
    take: Callable[[dict[str, bytes]], None] | None  # the payload hook, for the carrier that provides it


def _native(job: _Job, c: Carrier) -> list[Built]:
    """kt-kernel: the built wheel(s), one per Python, as they are."""
    out = []
    for k in job.kernels:
        dest = job.out / k.name
        shutil.copyfile(k, dest)
        out.append(Built(c.name, job.versions[c.name], c.kind, dest))
    return out


def _umbrella(job: _Job, c: Carrier) -> list[Built]:
    return [Built(c.name, job.versions[c.name], c.kind, transform.umbrella(c, job.cs, job.versions, job.out))]


def _derived(job: _Job, c: Carrier) -> list[Built]:
    """A fork (patched, renamed) or a repack (renamed requirements only) of its hash-checked input."""
    src = job.sources[c.name]
    hook = job.take if c.payload_manifest else None
    path = transform.derive(c, job.cs, src.path, job.out, job.versions, job.upstream_of, take=hook)
    return [
        Built(
            c.name,
            job.versions[c.name],
            c.kind,
            path,
            inputs=[{"name": src.name, "version": src.version, "filename": src.path.name, "sha256": src.sha256}],
            patches=[{"file": p.name, "sha256": inputs.sha256(p)} for p in c.patches],
        )
    ]


# carrier kind -> how it is built (carriers.toml `kind`; the model refuses any other)
BUILDERS: dict[str, Callable[[_Job, Carrier], list[Built]]] = {
    "native": _native,
    "umbrella": _umbrella,
    "fork": _derived,
    "repack": _derived,
}


def build_set(
    cs: CarrierSet,
    kernel: Path | Sequence[Path],
    out: Path,
    *,
    lock: Path = inputs.LOCK,
    cache: Path | None = None,
    given: Mapping[str, Path] | None = None,
    only: frozenset[str] | None = None,
) -> list[Built]:
    """Every carrier (or `only` these) into `out`. given: upstream name -> wheel path (verified against the lock).
    `kernel`: the kt-kernel wheel, or one per Python of the matrix (cp311, cp312): each ships, each carries
    the same archive part."""
    given = given or {}
    kernels = check_kernels([kernel] if isinstance(kernel, Path) else list(kernel))
    kernel_wheel = kernels[0]
    sources: dict[str, inputs.Input] = {}
    for c in cs.carriers:
        if c.kind not in ("fork", "repack"):
            continue
        if c.source is not None:
            sources[c.name] = inputs.build_source(c.name, c.source, cache)
        elif c.upstream in given:
            sources[c.name] = inputs.verify(given[c.upstream], c.upstream, lock)
        else:
            sources[c.name] = inputs.fetch(c.upstream, lock, cache)
    upstream_of = {n: i.version for n, i in sources.items()}
    versions: dict[str, str] = {}
    for c in cs.carriers:
        if c.kind == "native":
            versions[c.name] = str(parse_wheel_filename(kernel_wheel.name)[1])
            if versions[c.name] != cs.kt_version:
                raise ConsistencyError(
                    f"{kernel_wheel.name} is version {versions[c.name]}, the KT version is "
                    f"{cs.kt_version}; rebuild kt-kernel (nox -s build_cuda)"
                )
        else:
            versions[c.name] = transform.carrier_version(c, cs, upstream_of.get(c.name, ""))
    built: list[Built] = []
    archived: dict[str, bytes] = {}
    with_payload = bool(cs.part_carriers) and only is None

    pol = payload.policy() if with_payload else None  # one read of the budget and the [payload] limits

    def take(members: dict[str, bytes]) -> None:
        assert pol is not None  # only hooked in when the set has a payload
        archived.update(payload.take_archived(members, pol.payload.include, pol.payload.min_bytes))

    job = _Job(cs, out, versions, sources, upstream_of, kernels, take if with_payload else None)
    todo = [c for c in cs.carriers if only is None or c.name in only]
    for c in progress.each(todo, "assemble", describe=lambda c: f"{c.name} ({c.kind})"):
        built += BUILDERS[c.kind](job, c)
    if with_payload:
        provider = cs.payload_provider
        assert provider is not None
        native = [b for b in built if b.kind == "native"]
        result = payload.attach(
            cs,
            {b.name: b.path for b in built if b not in native[1:]},
            archived,
            versions,
            [sources[provider.name].path],
            (cache or inputs.default_cache()).parent / "payload",
            pol,
            siblings=[b.path for b in native[1:]],
        )
        for b in built:
            b.path = result.siblings.get(b.path, b.path) if b in native[1:] else result.wheels.get(b.name, b.path)
        built[0].payload = payload.manifest_summary(result.manifest)
    return built


def assemble(cs: CarrierSet, kernel_wheel: Path | Sequence[Path], dist: Path, **kwargs: Any) -> dict[str, Any]:
    """Build, check, describe, then swap `dist` in whole. Returns the manifest."""
    t0 = time.perf_counter()
    dist = dist.resolve()
    dist.parent.mkdir(parents=True, exist_ok=True)
    staging = dist.parent / f".{dist.name}-staging-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    try:
        built = build_set(cs, kernel_wheel, staging, **kwargs)
        metadata = {b.name: read_metadata(b.path) for b in built}
        for b in built:  # the kernel wheels of several Pythons must ask for the same things
            if read_metadata(b.path) != metadata[b.name]:
                raise ConsistencyError(
                    f"{b.path.name} declares other requirements than the {b.name} wheel beside "
                    "it; build every Python's wheel from one source"
                )
        report = consistency.check(cs, metadata)
        if report.problems:
            raise ConsistencyError("the carrier set is inconsistent:\n  " + "\n  ".join(report.problems))
        wheels = []
        for b in built:
            digest = inputs.sha256(b.path)
            wheels.append(
                {
                    "name": b.name,
                    "version": b.version,
                    "kind": b.kind,
                    "filename": b.path.name,
                    "sha256": digest,
                    "size": b.path.stat().st_size,
                    "inputs": b.inputs,
                    "patches": b.patches,
                }
            )
        manifest = {
            "schema_version": 1,
            "kt_version": cs.kt_version,
            "torch": report.torch,
            "torch_candidates": list(report.torch_candidates),
            "wheels": wheels,
        }
        summary = next((b.payload for b in built if b.payload), None)
        if summary:
            manifest["payload"] = summary
        (staging / "SHA256SUMS").write_text("".join(f"{w['sha256']}  {w['filename']}\n" for w in wheels))
        (staging / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
        # The swap: two renames; dist/ is the old tree or the new one, never a mix.
        old = dist.parent / f".{dist.name}-old-{os.getpid()}"
        if dist.exists():
            dist.rename(old)
        try:
            staging.rename(dist)
        except BaseException:
            if old.exists() and not dist.exists():
                old.rename(dist)  # the previous release back in place
            raise
        shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    manifest["elapsed_s"] = round(time.perf_counter() - t0, 2)
    return manifest


def kernel_from(path: Path) -> list[Path]:
    """The repaired kt_kernel wheel(s) in `path` (one per Python of the matrix), or `path` itself."""
    wheels = sorted(path.glob("kt_kernel-*.whl")) if path.is_dir() else [path]
    if not wheels or not all(w.is_file() for w in wheels):
        raise InputError(f"{path}: no repaired kt_kernel wheel; run nox -s build_cuda first")
    return check_kernels(wheels)


def check_kernels(wheels: list[Path]) -> list[Path]:
    """Several kernel wheels are one release for several Pythons: one version, distinct tags."""
    parsed = [(w, parse_wheel_filename(w.name)) for w in sorted(wheels, key=lambda p: p.name)]
    versions = {str(v) for _, (_, v, _, _) in parsed}
    if len(versions) > 1:
        raise InputError(
            f"kt_kernel wheels of several versions {sorted(versions)}: "
            f"{', '.join(w.name for w, _ in parsed)}; rebuild them from one source"
        )
    seen: dict[str, str] = {}
    for w, (_, _, _, tags) in parsed:
        for t in tags:
            if str(t) in seen:
                raise InputError(f"{w.name} and {seen[str(t)]} both claim {t}: keep one kt_kernel wheel per Python")
            seen[str(t)] = w.name
    return [w for w, _ in parsed]
