"""The release's lazy CUDA archive: what goes in, compressed once per input hash,
cut into parts that ride in the part-carrying wheels, described by one manifest.

Which members go in, the per-wheel budget and the compression are policy data
(audits/policy/default.toml, [payload] and [size]); which carriers hold the parts
and the manifest is carrier data (carriers/carriers.toml). kt_kernel.payload reads
the result at run time; the audits check it (audits/analyzers/payload_rules.py).
The manifest's schema: audits/schemas/payload-manifest.schema.json.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import hashlib
import io
import json
import os
import re
import shutil
import tarfile
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.utils import parse_wheel_filename

from audits.platforms import glibc_of
from audits.readers import cuobjdump_tool, list_archs
from base import cachedir, distdir, paths, swap

from . import licensing, sbom, wheelio
from .draft import Draft
from .errors import ConsistencyError, InputError
from .model import PART_DIR, Carrier, CarrierSet

SCHEMA_VERSION = 1
# Bump when the archive's layout changes: it is part of the cache key.
FORMAT = 3
COMPRESSION = "zstd"
# What the manifest's provider needs at run time to read the archive.
RUNTIME_REQUIRES = ("zstandard>=0.22",)
# Zip local header + central directory entry + RECORD line for one part, generously.
PART_OVERHEAD = 4096
# kt-kernel's build manifest, written by its CMake build (kernel/cmake); the packer rewrites its cuda
# section. The audit reads the same member (audits.analyzers.manifest_rules.MANIFEST: pinned equal).
BUILD_MANIFEST = "kt_kernel/_build.json"


def policy() -> Any:
    """The audit policy (one owner of the budget and the [payload] limits)."""
    from audits.policy import load_policy

    pol = load_policy()
    if pol.payload is None:
        raise ConsistencyError(f"{pol.source}: no [payload] section, but carriers.toml assigns payload parts")
    return pol


def say(msg: str) -> None:
    """A progress line of the payload packer."""
    print(f"[payload] {msg}", flush=True)


def take_archived(members: dict[str, bytes], include: tuple[str, ...], min_bytes: int) -> dict[str, bytes]:
    """Move every member matching `include` with at least `min_bytes` out of `members`; return them."""
    picked = {
        n: d for n, d in members.items() if len(d) >= min_bytes and any(fnmatch.fnmatchcase(n, p) for p in include)
    }
    for n in picked:
        del members[n]
    return picked


def check_kernel_coverage(build: Mapping[str, Any], pol: Any) -> list[str]:
    """What a kt-kernel build manifest lacks of the release's CPU ladder and CUDA matrix (a shard
    build - one --variant, one --arch - must never become a release)."""
    problems = []
    missing = [v.name for v in pol.variants if v.name not in build.get("variants", {})]
    if missing:
        problems.append(f"CPU variants {missing} are not built (the ladder has {[v.name for v in pol.variants]})")
    files = (build.get("cuda") or {}).get("files", {})
    for lib in pol.cuda_libraries:
        have = files.get(lib.member)
        if have is None:
            problems.append(f"the CUDA library {lib.member} is not built")
            continue
        short = sorted((lib.sass - set(have.get("sass", []))) | (lib.ptx - set(have.get("ptx", []))))
        if short:
            problems.append(f"{lib.member} lacks {short} of the policy's CUDA matrix")
    return problems


def take_kernel_cuda(members: dict[str, bytes], pol: Any) -> dict[str, bytes]:
    """Move kt-kernel's own CUDA libraries out of its wheel (its tar.xz) to `kt_cuda_root/...` in the
    release archive, and point _build.json's cuda section at the release payload."""
    root = pol.payload.kt_cuda_root
    build = json.loads(members[BUILD_MANIFEST])
    problems = check_kernel_coverage(build, pol)
    if problems:
        raise InputError(
            "the kt-kernel wheel is a partial build and cannot be released: "
            + "; ".join(problems)
            + ". Build the whole kernel (nox -s build_cuda, no --variant/--arch); dist/ was not touched"
        )
    cuda = build.get("cuda")
    if not cuda or "payload" not in cuda:
        raise InputError(
            f"the kt-kernel wheel has no CUDA archive ({BUILD_MANIFEST} has no cuda.payload); build it "
            "with nox -s build_cuda (the release ships CUDA kernels)"
        )
    blob = members.pop(cuda["payload"])
    out: dict[str, bytes] = {}
    with tarfile.open(fileobj=io.BytesIO(blob), mode="r:xz") as tar:
        for info in tar:
            if info.isfile():
                fh = tar.extractfile(info)
                out[f"{root}/{info.name}"] = fh.read() if fh else b""
    if sorted(f"{root}/{n}" for n in cuda["files"]) != sorted(out):
        raise InputError(
            f"kt-kernel's CUDA archive holds {sorted(out)}, its {BUILD_MANIFEST} lists "
            f"{sorted(cuda['files'])}; rebuild kt-kernel"
        )
    build["cuda"] = {
        "archive": "release",
        "root": root,
        "compression": COMPRESSION,
        "layout": cuda["layout"],  # the kernel build writes it (the schema requires it)
        "files": cuda["files"],
        **({"runtime": cuda["runtime"]} if "runtime" in cuda else {}),  # the statically linked CUDA runtime
    }
    members[BUILD_MANIFEST] = (json.dumps(build, indent=2, sort_keys=True) + "\n").encode()
    return out


def _cuobjdump() -> str:
    """The locked cuobjdump (or KT_CUOBJDUMP's, which the assembly's key names), never one found on PATH:
    what it says of each binary ships in the payload's manifest."""
    tool = cuobjdump_tool(allow_path=False)
    if tool is None:
        raise InputError(
            "cuobjdump is needed to describe the CUDA archive's binaries; install lockfiles/audit.txt "
            "(nvidia-cuda-cuobjdump) or name one with KT_CUOBJDUMP"
        )
    say(f"cuobjdump: {tool.path} ({tool.source}; {tool.version})")
    return tool.path


@dataclass(frozen=True)
class Archive:
    """The packed archive: its file, size, sha256, frames and per-file facts."""

    path: Path
    sha256: str
    size: int
    window_log: int
    files: dict[str, dict[str, Any]]


def _describe(entries: Mapping[str, bytes]) -> dict[str, dict[str, Any]]:
    """size, sha256 and (for ELF files, by cuobjdump) SASS/PTX of every entry."""
    files: dict[str, dict[str, Any]] = {
        n: {"size": len(d), "sha256": hashlib.sha256(d).hexdigest()} for n, d in sorted(entries.items())
    }
    elfs = sorted(n for n, d in entries.items() if d[:4] == b"\x7fELF")
    tool = _cuobjdump() if elfs else ""
    with tempfile.TemporaryDirectory() as tmp:
        for name in elfs:
            p = Path(tmp) / "lib.so"
            p.write_bytes(entries[name])
            try:
                sass, ptx = list_archs(tool, p)
            except ValueError as exc:
                raise InputError(f"{name}: {exc}") from None
            files[name]["sass"], files[name]["ptx"] = sorted(sass), sorted(ptx)
    return files


def _compressor(level: int, window: int) -> Any:
    import zstandard

    # Long-distance matching over a 2**window window; frame checksums let the decompressor
    # itself notice corrupted bytes.
    params = zstandard.ZstdCompressionParameters.from_level(
        level, window_log=window, enable_ldm=True, write_checksum=True, threads=os.cpu_count() or 1
    )
    return zstandard.ZstdCompressor(compression_params=params)


def _tar_header(name: str, size: int) -> bytes:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = size, 0, 0o755
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")


def _tools() -> dict[str, str]:
    """Every tool that shapes a frame: the compressor (python-zstandard and the zstd it bundles) and the
    cuobjdump whose description of each binary ships in the payload's manifest (its version line)."""
    import zstandard

    tool = cuobjdump_tool(allow_path=False)
    return {
        "zstandard": f"{zstandard.__version__} (zstd {zstandard.ZSTD_VERSION})",
        "cuobjdump": tool.version if tool else "none",
    }


def _reuse(target: Path, desc: Path, key: str, whole: list[Any]) -> dict[str, Any] | None:
    """The frame's description, if its record and bytes verify: the record names this key and the frame's
    sha256, and the frame still hashes to it (its bytes go into the archive's running sha256, `whole[0]`, in
    the same read). Anything else is dropped (said once) and made again."""
    if not (target.is_file() and desc.is_file()):
        return None
    try:
        record = json.loads(desc.read_text())
        ok = isinstance(record, dict) and record.get("key") == key and isinstance(record.get("files"), dict)
    except (OSError, ValueError):
        ok = False
    if ok:
        own, trial = hashlib.sha256(), whole[0].copy()
        with target.open("rb") as fh:
            while chunk := fh.read(1 << 20):
                own.update(chunk)
                trial.update(chunk)
        if own.hexdigest() == record.get("sha256"):
            whole[0] = trial
            files: dict[str, Any] = record["files"]
            return files
    say(f"frame {key[:16]}: {target.name} does not match its record in {desc.name}; dropped, made again")
    target.unlink(missing_ok=True)
    desc.unlink(missing_ok=True)
    return None


def _frame(
    group: str, entries: Mapping[str, bytes], level: int, window: int, cache: Path, whole: list[Any]
) -> tuple[Path, dict[str, Any]]:
    """One zstd frame holding the tar blocks of one top-level directory's files (no end marker),
    cached by their content and the tools that shape it: a change elsewhere in the archive never recompresses
    this one. A cached frame is used only when its bytes hash to the sha256 its record claims."""
    files = {n: hashlib.sha256(d).hexdigest() for n, d in sorted(entries.items())}
    ident = json.dumps(
        {"format": FORMAT, "level": level, "window": window, "files": files, "tools": _tools()}, sort_keys=True
    )
    key = hashlib.sha256(ident.encode()).hexdigest()
    target, desc = cache / f"frame-{key}.zst", cache / f"frame-{key}.json"
    reused = _reuse(target, desc, key, whole)
    if reused is not None:
        say(f"{group}/: {len(entries)} files, frame {key[:16]} reused from {cache} (sha256 verified)")
        return target, reused
    total = sum(len(d) for d in entries.values())
    say(f"{group}/: describing {len(entries)} files ({total / 2**20:.0f} MiB) with cuobjdump")
    described = _describe(entries)
    tmp = swap.part(target)
    t0 = time.perf_counter()
    say(
        f"{group}/: compressing {total / 2**20:.0f} MiB with zstd-{level} (window 2**{window}, long-distance "
        f"matching, {os.cpu_count()} threads)"
    )
    done = 0
    digest = hashlib.sha256()

    class _Hashed:  # the frame's sha256 as it is written, for its record, and the archive's running one
        def write(self, data: bytes) -> int:
            digest.update(data)
            whole[0].update(data)
            return raw.write(data)

    with tmp.open("wb") as raw, _compressor(level, window).stream_writer(_Hashed(), closefd=False) as zw:
        for name, data in sorted(entries.items()):
            zw.write(_tar_header(name, len(data)))
            zw.write(data)
            zw.write(b"\0" * (-len(data) % tarfile.BLOCKSIZE))
            done += len(data)
            say(
                f"  {name} ({len(data) / 2**20:.1f} MiB): {100 * done / max(total, 1):.0f}% after "
                f"{time.perf_counter() - t0:.0f}s"
            )
    record = {"key": key, "sha256": digest.hexdigest(), "files": described}
    desc_tmp = swap.part(desc)  # the cache may be shared (KT_CACHE_DIR): a reader never sees half a file
    desc_tmp.write_text(json.dumps(record, indent=1) + "\n")
    tmp.replace(target)
    desc_tmp.replace(desc)
    say(f"{group}/: {target.stat().st_size / 2**20:.1f} MiB in {time.perf_counter() - t0:.1f}s")
    return target, described


_ARCHIVE_NAME = re.compile(paths.PAYLOAD_ARCHIVE_NAME)
ARCHIVES_KEPT = 4  # whole archives kept in the cache, the most recently used (each kernel change makes one)


def _prune_archives(cache: Path, keep: Path) -> None:
    """All but the ARCHIVES_KEPT most recently used archives go (their frames stay: any archive is a
    concatenation of frames, made again in seconds); only the names build_archive writes."""
    cachedir.prune(cache, _ARCHIVE_NAME, keep=[keep], max_count=ARCHIVES_KEPT)


def build_archive(entries: Mapping[str, bytes], level: int, window: int, cache: Path) -> Archive:
    """The deterministic tar.zst of `entries`: one zstd frame per top-level directory (sorted
    members, fixed metadata), then a frame with the tar end marker. Frames are built once per
    content hash, so a kernel-only change never recompresses sglang's 1.1 GB."""
    # A frame and its record are read only from a folder nobody else can write: whoever could plant both
    # could make them agree with each other.
    cachedir.owned(cache, "payload cache")
    groups: dict[str, dict[str, bytes]] = {}
    for name, data in entries.items():
        groups.setdefault(name.split("/", 1)[0], {})[name] = data
    whole = [hashlib.sha256()]  # what the archive must hash to: its verified frames and the end marker, in order
    frames = [_frame(g, groups[g], level, window, cache, whole) for g in sorted(groups)]
    end = _compressor(level, window).compress(b"\0" * (2 * tarfile.BLOCKSIZE))
    digest = hashlib.sha256()
    for path, _ in frames:
        digest.update(path.name.encode())
    target = cache / f"archive-{digest.hexdigest()}.tar.zst"
    # A cached archive with other bytes than its verified frames is dropped and made again; never shipped.
    expected = whole[0]
    expected.update(end)
    if target.is_file():
        with target.open("rb") as fh:
            if hashlib.file_digest(fh, "sha256").hexdigest() == expected.hexdigest():
                os.utime(target)  # recently used: pruned last
            else:
                say(f"{target.name} does not hash to its frames' sha256; dropped, made again")
                target.unlink()
    if not target.is_file():
        tmp = swap.part(target)
        with tmp.open("wb") as out:
            for path, _ in frames:
                with path.open("rb") as src:
                    shutil.copyfileobj(src, out, 1 << 20)
            out.write(end)
        tmp.replace(target)
        _prune_archives(cache, keep=target)
    files = {n: f for _, described in frames for n, f in described.items()}
    return Archive(target, expected.hexdigest(), target.stat().st_size, window, dict(sorted(files.items())))


def plan_parts(archive_size: int, bases: list[tuple[str, int]], budget: int, headroom: int) -> list[int]:
    """Part sizes, one per carrier (in order), filling the wheels to one common size ("water
    filling"): a wheel with much content of its own gets a small part, every wheel gets one,
    and none goes over `budget - headroom`. `bases`: each carrier's wheel size without its part."""
    limit = budget - headroom - PART_OVERHEAD
    full = [f"{n} ({b / 2**20:.1f} MiB)" for n, b in bases if b >= limit]
    if full:
        raise ConsistencyError(
            f"no room for an archive part in {', '.join(full)} under the "
            f"{(budget - headroom) / 2**20:.0f} MiB limit (budget minus headroom); raise "
            "size.wheel_budget_mib or lower payload.headroom_mib in audits/policy/default.toml"
        )
    capacity = sum(limit - b for _, b in bases)
    if capacity < archive_size:
        raise ConsistencyError(
            f"the CUDA archive ({archive_size / 2**20:.1f} MiB) does not fit: the {len(bases)} "
            f"part carriers have {capacity / 2**20:.1f} MiB of room under "
            f"{(budget - headroom) / 2**20:.0f} MiB each; compress harder (payload.zstd_level) or "
            "raise size.wheel_budget_mib"
        )
    if archive_size < len(bases):
        raise ConsistencyError(
            f"the CUDA archive ({archive_size} bytes) is too small to give each of the "
            f"{len(bases)} part carriers a part"
        )

    def total(level: int) -> int:
        return sum(max(level - b, 1) for _, b in bases)

    lo, hi = 0, limit  # the smallest common wheel size that holds the whole archive
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (mid + 1, hi) if total(mid) < archive_size else (lo, mid)
    sizes = [max(lo - b, 1) for _, b in bases]
    excess = sum(sizes) - archive_size
    for i in sorted(range(len(sizes)), key=lambda i: -sizes[i]):  # trim the overshoot from the largest parts
        cut = min(excess, sizes[i] - 1)
        sizes[i] -= cut
        excess -= cut
    return sizes


def archive_platform(sources: list[Path]) -> str:
    """The platform tag the archive needs: the newest glibc floor among the wheels its files came from."""
    best: tuple[int, int] | None = None
    arch = "x86_64"
    for wheel in sources:
        for tag in parse_wheel_filename(wheel.name)[3]:
            g = glibc_of(tag.platform)
            if g and (best is None or g > best):
                best, arch = g, tag.platform.split("_", 3)[-1] if tag.platform.startswith("manylinux_") else arch
    if best is None:
        raise InputError(f"none of {[w.name for w in sources]} has a manylinux tag; the archive's platform is unknown")
    return f"manylinux_{best[0]}_{best[1]}_{arch}"


def retag(wheel_name: str, platform: str) -> list[str]:
    """Tags for a part carrier: `any` becomes the archive's platform; an older glibc floor is raised to it."""
    out = []
    for tag in sorted(parse_wheel_filename(wheel_name)[3], key=str):
        plat = tag.platform
        g = glibc_of(plat)
        if plat == "any" or (g is not None and g < (glibc_of(platform) or (0, 0))):
            plat = platform
        out.append(f"{tag.interpreter}-{tag.abi}-{plat}")
    return sorted(set(out))


def part_member(c: Carrier, index: int, count: int) -> str:
    """Where part i of n lives inside carrier c's import package."""
    return f"{c.import_package}/{PART_DIR}/cuda.tar.zst.{index:02d}-of-{count:02d}"


def _slices(path: Path, sizes: list[int]) -> list[bytes]:
    with path.open("rb") as fh:
        return [fh.read(n) for n in sizes]


def attach(
    cs: CarrierSet,
    wheels: Mapping[str, Sequence[Draft]],
    kernels: Sequence[Path],
    archived: Mapping[str, bytes],
    versions: Mapping[str, str],
    sources: list[Path],
    cache: Path,
    pol: Any = None,
) -> dict[str, Any]:
    """Build (or reuse) the archive of `archived` plus kt-kernel's CUDA libraries, cut it into parts,
    add each part to every wheel of its carrier (retagged for the archive's platform), and put the
    manifest and the part requirements into the provider's wheel; returns the payload manifest.
    `wheels`: carrier -> its drafts (several where the carrier is per-Python, as sglang-kt is): each
    wheel of a part carrier carries the same part, and every kt-kernel wheel must hold the same CUDA
    libraries. `kernels`: the kernel wheels the native drafts were read from. Every draft is edited in
    memory, what finishing applies with it (the tags, the part its SBOM names, the archive's origins);
    the assembly writes each once."""
    pol = pol or policy()
    provider = cs.payload_provider
    assert provider is not None  # carriers.toml validation guarantees one when parts exist
    native = next(c for c in cs.carriers if c.kind == "native")
    entries = {**archived, **_kernel_cuda(wheels[native.name], pol)}
    archive = build_archive(entries, pol.payload.zstd_level, pol.payload.zstd_window_log, cache)
    platform = archive_platform([*sources, *kernels])
    sizes = _plan(cs, wheels, platform, archive.size, pol)
    count, parts = len(sizes), []
    for i, (c, blob) in enumerate(zip(cs.part_carriers, _slices(archive.path, sizes), strict=True), 1):
        part = sbom.Part(part_member(c, i, count), i, count, len(blob), hashlib.sha256(blob).hexdigest())
        biggest = max(_carry(c, w, blob, part, versions, platform, pol) for w in wheels[c.name])
        parts.append(
            {
                "index": i,
                "distribution": c.name,
                "version": versions[c.name],
                "member": part.member,
                "size": len(blob),
                "sha256": part.sha256,
            }
        )
        say(
            f"part {i}/{count}: {c.name} {versions[c.name]} carries {len(blob) / 2**20:.1f} MiB "
            f"-> {biggest / 2**20:.1f} MiB wheel"
            + (f" (each of {len(wheels[c.name])})" if len(wheels[c.name]) > 1 else "")
        )
    manifest = {
        "schema_version": SCHEMA_VERSION,
        "release": cs.kt_version,
        "provider": {"distribution": provider.name, "version": versions[provider.name]},
        "archive": {
            "sha256": archive.sha256,
            "size": archive.size,
            "compression": COMPRESSION,
            "format": "tar",
            "level": pol.payload.zstd_level,
            "window_log": archive.window_log,
            "platform": platform,
        },
        "parts": parts,
        "files": archive.files,
    }
    origins = _origins(archive.files, entries, archived, sources, kernels, versions[native.name])
    licenses = _origin_licenses(origins, sources, kernels)
    for w in wheels[provider.name]:
        _finish_provider(provider, w, manifest, pol.payload.manifest_member, cs, versions, platform, origins, licenses)
    return manifest


def _kernel_cuda(native: Sequence[Draft], pol: Any) -> dict[str, bytes]:
    """kt-kernel's CUDA libraries, taken out of every kernel wheel: one copy goes into the archive, so
    every kernel wheel (one per Python) must hold the same ones."""
    first: tuple[Draft, dict[str, bytes]] | None = None
    for w in native:
        theirs = take_kernel_cuda(w.members(), pol)
        if first is None:
            first = (w, theirs)
        elif theirs != first[1]:
            differ = sorted(n for n in set(theirs) | set(first[1]) if theirs.get(n) != first[1].get(n))
            raise InputError(
                f"{w.filename} and {first[0].filename} hold different CUDA libraries ({differ}); the release "
                "archive holds one copy: build every kt-kernel wheel from one source"
            )
    return first[1] if first is not None else {}


def _plan(
    cs: CarrierSet,
    wheels: Mapping[str, Sequence[Draft]],
    platform: str,
    archive_size: int,
    pol: Any,
) -> list[int]:
    """The part sizes: each carrier's wheels retagged for the archive's platform and measured in memory
    as they stand without their part (the largest of a carrier's wheels, since the same part must fit
    beside each): a derived wheel finished, a kernel wheel as built (without the SBOM it gets with its part)."""
    bases: list[tuple[str, int]] = []
    for c in cs.part_carriers:
        size = 0
        for w in wheels[c.name]:
            w.finish.tags = retag(w.filename, platform)
            w.executable = executable
            size = max(size, len(w.encode()))
        bases.append((c.name, size))
    return plan_parts(archive_size, bases, pol.wheel_budget_bytes, pol.payload.headroom_bytes)


def _carry(
    c: Carrier,
    w: Draft,
    blob: bytes,
    part: sbom.Part,
    versions: Mapping[str, str],
    platform: str,
    pol: Any,
) -> int:
    """One wheel of a part carrier with its part and an SBOM naming it, encoded and held to the budget;
    its size."""
    m = w.members()
    if not any(n.startswith(f"{c.import_package}/") for n in m):
        raise ConsistencyError(f"{w.filename}: {c.name} has no {c.import_package}/ package to carry part {part.index}")
    m[part.member] = blob
    w.finish.provenance = dataclasses.replace(w.finish.provenance, part=part)
    w.finish.sbom = True
    w.stored = frozenset({part.member})
    data = w.encode()
    if len(data) > pol.wheel_budget_bytes:
        raise ConsistencyError(
            f"{w.filename} would be {len(data) / 2**20:.1f} MiB with its part, over the "
            f"{pol.wheel_budget_bytes / 2**20:.0f} MiB budget"
        )
    w.filename = wheelio.wheel_name(c.name, versions[c.name], wheelio.compressed_tag(retag(w.filename, platform)))
    w.encoded(data)  # written as measured against the budget
    return len(data)


def _origins(
    files: Mapping[str, Mapping[str, Any]],
    entries: Mapping[str, bytes],
    archived: Mapping[str, bytes],
    sources: Sequence[Path],
    kernels: Sequence[Path],
    kernel_version: str,
) -> dict[str, dict[str, object]]:
    """Each archived file with its sha256, size and the wheel it was taken from: the provider's upstream
    input (sglang-kernel's libraries) or kt-kernel's own build (its CUDA libraries)."""
    named = [(parse_wheel_filename(s.name), s.name) for s in sources]
    upstream = ", ".join(f"{name} {version} ({file})" for (name, version, _, _), file in named)
    kernel = f"kt-kernel {kernel_version} ({', '.join(k.name for k in kernels)})"
    return {
        path: {"sha256": info["sha256"], "size": info["size"], "origin": upstream if path in archived else kernel}
        for path, info in files.items()
        if path in entries
    }


def _origin_licenses(
    origins: Mapping[str, Mapping[str, object]], sources: Sequence[Path], kernels: Sequence[Path]
) -> dict[str, bytes]:
    """The license files the provider ships for the archive (licenses/payload/<distribution>/): those of
    each wheel an archived file was taken from (`origins`: _origins'; the provider's upstream input,
    kt-kernel's build)."""
    named = {str(o["origin"]).split()[0] for o in origins.values()}
    wheels = [(str(parse_wheel_filename(s.name)[0]), s) for s in sources] + [("kt-kernel", k) for k in kernels[:1]]
    return licensing.payload_licenses({name: licensing.of_wheel(w)[1] for name, w in wheels if name in named})


def executable(members: Mapping[str, bytes]) -> frozenset[str]:
    return frozenset(n for n in members if "/scripts/" in n or n.endswith(".so") or ".so." in n)


def _finish_provider(
    c: Carrier,
    draft: Draft,
    manifest: dict[str, Any],
    member: str,
    cs: CarrierSet,
    versions: Mapping[str, str],
    platform: str,
    origins: dict[str, dict[str, object]],
    licenses: Mapping[str, bytes],
) -> None:
    """Manifest into the provider's wheel; it requires every part carrier exactly, and zstandard.
    Tagged for the archive's platform: it is the package that loads the archived binaries. Its SBOM
    lists every archived file with its origin; its licenses/ holds the payload origins' license files."""
    members = draft.members()
    draft.finish.tags = retag(draft.filename, platform)
    draft.filename = wheelio.wheel_name(c.name, versions[c.name], wheelio.compressed_tag(draft.finish.tags))
    members[member] = (json.dumps(manifest, indent=1, sort_keys=True) + "\n").encode()
    meta_name = f"{wheelio.dist_info(members)}/METADATA"
    lines = [f"Requires-Dist: {p.name}=={versions[p.name]}" for p in cs.part_carriers]
    lines += [f"Requires-Dist: {r}" for r in RUNTIME_REQUIRES]
    members[meta_name] = wheelio.edit_metadata(members[meta_name].decode("utf-8"), append=lines).encode("utf-8")
    draft.finish.license_files = {**draft.finish.license_files, **licenses}  # beside the fork's own license
    draft.finish.provenance = dataclasses.replace(draft.finish.provenance, archive=origins)
    draft.executable = executable


def manifest_summary(manifest: Mapping[str, Any]) -> distdir.Payload:
    """What dist/manifest.json records of the payload."""
    return distdir.Payload(
        archive_sha256=manifest["archive"]["sha256"],
        archive_size=manifest["archive"]["size"],
        files=len(manifest["files"]),
        extracted_size=sum(f["size"] for f in manifest["files"].values()),
        parts=tuple(
            distdir.Part(**{k: p[k] for k in ("index", "distribution", "version", "size", "sha256")})
            for p in manifest["parts"]
        ),
    )
