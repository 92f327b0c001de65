"""Assemble the release into dist/: every carrier wheel, checked for
consistency, with SHA256SUMS and manifest.json - swapped in atomically, so a
failure leaves the previous dist/ exactly as it was."""

from __future__ import annotations

import functools
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.utils import parse_wheel_filename

from base import distdir, progress, stagecache, stages, swap
from base.paths import PAYLOAD_FRAMES, WHEEL_MEMO
from locks.targets import serves

from . import consistency, inputs, install, licensing, payload, transform, wheelio
from .draft import Draft, Finish
from .errors import ConsistencyError, InputError
from .model import Carrier, CarrierSet


@dataclass(eq=False)
class Built:
    """One wheel of the assembly, with its inputs and patches for manifest.json: a draft in memory until
    build_set writes it (once) to `path`."""

    name: str
    version: str
    kind: str
    draft: Draft
    out: Path  # the folder it is written to
    inputs: list[dict[str, str]] = field(default_factory=list)
    patches: list[dict[str, str]] = field(default_factory=list)
    payload: distdir.Payload | None = None  # the lazy CUDA archive's summary (on one entry)

    @property
    def path(self) -> Path:
        """Where it is (or will be) written: its draft's current file name (the payload may retag it)."""
        return self.out / self.draft.filename


read_metadata = wheelio.read_metadata  # (Version, Requires-Dist) of a built wheel


@dataclass(frozen=True)
class _Job:
    """What every carrier builder reads."""

    cs: CarrierSet
    out: Path
    versions: Mapping[str, str]
    sources: Mapping[str, Sequence[inputs.Input]]  # carrier -> its input wheels (one per Python where per-Python)
    upstream_of: Mapping[str, str]
    kernels: Sequence[Path]
    take: Callable[[dict[str, bytes]], None] | None  # the payload hook, for the carrier that provides it
    pins: Mapping[str, str] = field(default_factory=dict)  # transform.release_pins


def _native(job: _Job, c: Carrier) -> list[Built]:
    """kt-kernel: the built wheel(s), one per Python, as they are (until the payload or the SBOM edits them)."""
    finish = functools.partial(Finish, c.name, job.versions[c.name], job.cs.kt_version, sbom=False)
    drafts = [  # as built: the payload step or, where the set has none, the SBOM step finishes them
        Draft(k.name, finish(), source=k, executable=payload.executable) for k in job.kernels
    ]
    return [Built(c.name, job.versions[c.name], c.kind, d, job.out) for d in drafts]


def _umbrella(job: _Job, c: Carrier) -> list[Built]:
    d = transform.umbrella(c, job.cs, job.versions, licensing.project(job.kernels))
    return [Built(c.name, job.versions[c.name], c.kind, d, job.out)]


def _derived(job: _Job, c: Carrier) -> list[Built]:
    """A fork (patched, renamed) or a repack (renamed requirements only) of each of its hash-checked
    inputs: one wheel per input (per Python, where the upstream is per-Python)."""
    hook = job.take if c.payload_manifest else None
    out = []
    for src in job.sources[c.name]:
        d = _derive_once(job, c, src, hook)
        out.append(
            Built(
                c.name,
                job.versions[c.name],
                c.kind,
                d,
                job.out,
                inputs=[{"name": src.name, "version": src.version, "filename": src.path.name, "sha256": src.sha256}],
                patches=[{"file": p.name, "sha256": inputs.sha256(p)} for p in c.patches],
            )
        )
    return out


def _derive_once(job: _Job, c: Carrier, src: inputs.Input, hook: Callable[[dict[str, bytes]], None] | None) -> Draft:
    """transform.derive_draft, or the wheel it made before from exactly this input, carrier set, patch
    series, versions and code (the wheel memo, when one is open). A carrier that hands members to the
    payload (`hook`) is always derived: the payload needs those members."""
    memo = wheelio.current_memo()
    if memo is None or hook is not None:
        return transform.derive_draft(c, job.cs, src.path, job.versions, job.upstream_of, hook, src.sha256, job.pins)
    key = stagecache.value_sha256(
        [
            "derive",
            wheelio.ENCODING,
            src.sha256,
            repr(job.cs),
            [inputs.sha256(p) for p in c.patches],
            dict(job.versions),
            dict(job.upstream_of),
            dict(job.pins),
            _code_key(),
        ]
    )
    name = transform.derived_name(c, src.path, job.versions)
    data = memo.get(key)
    if data is not None:  # finished before: its license applied; its SBOM is made again if a step edits it
        prov = transform.provenance(c, src.path, src.sha256)
        finish = Finish(c.name, job.versions[c.name], job.cs.kt_version, prov)
        if c.retag:  # its tags were decided when it was derived: they are in its WHEEL file
            name = wheelio.wheel_name(c.name, job.versions[c.name], wheelio.compressed_tag(wheelio.tags_of(data)))
        return Draft(name, finish, data=data, executable=transform.derived_executable)
    d = transform.derive_draft(c, job.cs, src.path, job.versions, job.upstream_of, src_sha256=src.sha256, pins=job.pins)
    data = d.encode()
    d.encoded(data)
    memo.put(key, data)
    return d


@functools.cache
def _code_key() -> str:
    """The assembly's code and environment as its stage key derives them (base/stages.wheel_memo): a
    change re-derives every wheel."""
    return stages.wheel_memo()


def _retire_beside(cache: Path) -> None:
    """Earlier assemblies kept the memo and the frames beside the inputs cache (`../wheels`, `../payload`): their
    own names there (and nothing else, in a folder of the running user's) are removed once, and said."""
    import re

    from base import cachedir, paths

    for folder, names in (
        (cache.parent / "wheels", wheelio.MEMO_NAME),
        (cache.parent / "payload", re.compile(paths.PAYLOAD_NAMES)),
    ):
        if folder.is_dir() and not cachedir.problem(folder):
            gone = cachedir.prune(folder, names, max_count=0)
            if gone:
                progress.say("assemble", f"{folder}: removed {len(gone)} of its own old entries (now inside {cache})")


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
    given: Mapping[str, Path | Sequence[Path]] | None = None,
    only: frozenset[str] | None = None,
    pythons: Sequence[str] | None = None,
    memo: bool = True,
) -> list[Built]:
    """Every carrier (or `only` these) into `out`, for every Python of `pythons` (default: the release's
    matrix, cs.pythons). given: upstream name -> wheel path(s) (verified against the lock). `kernel`: the
    kt-kernel wheel(s): one abi3 wheel serves every Python; each carries the same archive part, as every
    wheel of a per-Python part carrier (sglang-kt) does. `memo`: a wheel derived or encoded before from
    exactly the same content is written from the wheel memo (WHEEL_MEMO in the inputs cache; False:
    everything anew)."""
    root = (cache or inputs.default_cache()) / WHEEL_MEMO  # inside the folder named, never beside it
    _retire_beside(cache or inputs.default_cache())
    with wheelio.memo(root if memo else None) as m:
        built = _build_set(cs, kernel, out, lock=lock, cache=cache, given=given, only=only, pythons=pythons)
    if m is not None and m.hits:
        progress.say("assemble", f"wheel memo: {m.hits} wheels reused by content, {m.misses} encoded ({root})")
    return built


def _build_set(
    cs: CarrierSet,
    kernel: Path | Sequence[Path],
    out: Path,
    *,
    lock: Path,
    cache: Path | None,
    given: Mapping[str, Path | Sequence[Path]] | None,
    only: frozenset[str] | None,
    pythons: Sequence[str] | None,
) -> list[Built]:
    given = given or {}
    pythons = tuple(pythons or cs.pythons)
    kernels = check_kernels([kernel] if isinstance(kernel, Path) else list(kernel))
    kernel_wheel = kernels[0]
    sources: dict[str, list[inputs.Input]] = {}
    for c in cs.carriers:
        if c.kind not in ("fork", "repack"):
            continue
        if c.source is not None:
            sources[c.name] = [inputs.build_source(c.name, c.source, cache)]
        elif c.upstream in given:
            paths = given[c.upstream]
            listed = [paths] if isinstance(paths, Path) else list(paths)
            sources[c.name] = [inputs.verify(w, c.upstream, lock) for w in listed]
        else:
            sources[c.name] = inputs.fetch_matrix(c.upstream, pythons, lock, cache)
    upstream_of = {n: i[0].version for n, i in sources.items()}
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

    pins = transform.release_pins(cs, {n: [i.path for i in got] for n, got in sources.items()})
    job = _Job(cs, out, versions, sources, upstream_of, kernels, take if with_payload else None, pins)
    todo = [c for c in cs.carriers if only is None or c.name in only]
    for c in progress.each(todo, "assemble", describe=lambda c: f"{c.name} ({c.kind})"):
        built += BUILDERS[c.kind](job, c)
    if with_payload:
        provider = cs.payload_provider
        assert provider is not None
        groups: dict[str, list[Draft]] = {}
        for b in built:
            groups.setdefault(b.name, []).append(b.draft)
        summary = payload.attach(
            cs,
            groups,
            kernels,
            archived,
            versions,
            [i.path for i in sources[provider.name]],
            (cache or inputs.default_cache()) / PAYLOAD_FRAMES,  # inside the folder named, never beside it
            pol,
        )
        built[0].payload = payload.manifest_summary(summary)
    for b in built:  # a wheel no step gave an SBOM (kt-kernel, where the set has no payload): its own
        if not b.draft.finish.sbom and not wheelio.has_sbom(b.draft.names()):
            b.draft.finish.sbom = True
    if only is None:
        problems = coverage_problems(built, pythons)
        if problems:
            raise InputError(
                "the release does not serve every Python it is built for:\n  "
                + "\n  ".join(problems)
                + "\nnothing was written to dist/"
            )
    for b in built:  # each wheel written once, finished
        b.draft.write(b.out)
    return built


def coverage_problems(built: Sequence[Built] | Sequence[tuple[str, str]], pythons: Sequence[str]) -> list[str]:
    """Every carrier has a wheel that installs on each Python of `pythons` (the per-Python closure:
    whatever a profile pulls on that Python exists for it). `built`: the wheels, or (name, filename) pairs."""
    pairs = [(b.name, b.path.name) if isinstance(b, Built) else b for b in built]
    problems = []
    for name in dict.fromkeys(n for n, _ in pairs):
        wheels = [f for n, f in pairs if n == name]
        for python in pythons:
            if not any(serves(w, python) for w in wheels):
                problems.append(
                    f"{name} has no wheel for CPython {python} (it has {', '.join(wheels)}); "
                    + (
                        "build kt-kernel for it (nox -s build_cuda)"
                        if name == "kt-kernel"
                        else "its upstream input publishes none for that Python"
                    )
                )
    return problems


def check_reused(cs: CarrierSet, manifest: distdir.Manifest, pythons: Sequence[str] | None) -> None:
    """A reused dist/ is checked as a run checks what it assembles: the version file's version, every
    carrier present and serving every Python asked for, and the partial label (a partial dist/ is never
    reused as the whole release). ConsistencyError names each problem and the fix."""
    want = list(pythons or cs.pythons)
    wheels = [(w.name, w.filename) for w in manifest.wheels]
    problems = []
    if manifest.kt_version != cs.kt_version:
        problems.append(f"it is KT {manifest.kt_version}, the version file says {cs.kt_version}")
    if list(manifest.pythons) != want:
        problems.append(f"it serves CPython {', '.join(manifest.pythons)}, asked: {', '.join(want)}")
    if pythons is None and manifest.partial:
        problems.append(f"it is a partial development release (no wheels for {', '.join(manifest.partial.missing)})")
    present = {n for n, _ in wheels}
    problems += [f"no {c.name} wheel" for c in cs.carriers if c.name not in present]
    problems += coverage_problems(wheels, want)
    if problems:
        raise ConsistencyError(
            "dist/ matches its record, but not what this assembly asks for:\n  "
            + "\n  ".join(problems)
            + "\nre-assemble it: nox -s assemble -- --fresh"
        )


def _describe(b: Built, cs: CarrierSet) -> distdir.Wheel:
    """manifest.json's record of one built wheel."""
    return distdir.Wheel(
        name=b.name,
        version=b.version,
        kind=b.kind,  # type: ignore[arg-type]  # carriers.toml's kinds, checked by its schema
        filename=b.path.name,
        sha256=inputs.sha256(b.path),
        size=b.path.stat().st_size,
        pythons=tuple(v for v in cs.pythons if serves(b.path.name, v)),
        inputs=tuple(distdir.Input(**i) for i in b.inputs),
        patches=tuple(distdir.Patch(**p) for p in b.patches),
    )


def assemble(
    cs: CarrierSet, kernel_wheel: Path | Sequence[Path], dist: Path, *, install_files: bool = True, **kwargs: Any
) -> distdir.Manifest:
    """Build, check, describe, write the install files (dist/install/, unless install_files is False: a
    carrier set that is not the release's), then swap `dist` in whole. Returns the manifest."""
    dist = dist.resolve()
    dist.parent.mkdir(parents=True, exist_ok=True)
    staging = swap.staging_name(dist)
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
        wheels = tuple(_describe(b, cs) for b in built)
        pythons = tuple(kwargs.get("pythons") or cs.pythons)
        partial = None
        if pythons != tuple(cs.pythons):  # asked for by name (--partial): never a release, and says so
            partial = distdir.Partial(pythons, tuple(v for v in cs.pythons if v not in pythons))
        files = None
        if install_files:
            progress.say("assemble", "install files: every profile for every Python (dist/install/)")
            files = tuple(install.write(cs, staging, pythons, {w.filename: w.sha256 for w in wheels}))
        manifest = distdir.Manifest(
            schema_version=distdir.SCHEMA_VERSION,
            kt_version=cs.kt_version,
            pythons=pythons,
            torch=report.torch,
            torch_candidates=tuple(report.torch_candidates),
            wheels=wheels,
            install=files,
            partial=partial,
            payload=next((b.payload for b in built if b.payload), None),
        )
        distdir.write(staging, manifest)
        # The swap: dist/ is the old tree or the new one after a kill at any instant, never a mix or absent.
        swap.replace_dir(staging, dist)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
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
