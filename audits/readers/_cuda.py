"""CUDA readers: the lazy payload (tar.xz) and cuobjdump's view of a library."""

from __future__ import annotations

import io
import lzma
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ._tar import TarStream

CUOBJDUMP_ENV = "KT_CUOBJDUMP"


@dataclass(frozen=True)
class PayloadEntry:
    """One entry of kt-kernel's tar.xz CUDA archive."""

    name: str
    kind: str  # "file", "dir", "link", "special"
    data: bytes
    linkname: str = ""


def read_payload(data: bytes, max_bytes: int = 256 << 20) -> list[PayloadEntry]:
    """Entries of an xz-compressed tar, nothing extracted; raises ValueError if unreadable or if
    it unpacks to more than `max_bytes` (the policy's memory_max_mib: the files are held)."""
    out = []
    try:
        with lzma.LZMAFile(io.BytesIO(data)) as raw:
            stream = TarStream(raw)
            for e in stream:
                if stream.offset + e.size > max_bytes:
                    raise ValueError(
                        f"unpacks to more than {max_bytes / 2**20:.0f} MiB (the policy's memory_max_mib); "
                        f"{e.name!r} declares {e.size} bytes"
                    )
                out.append(PayloadEntry(e.name, e.kind, stream.read(e.size) if e.kind == "file" else b"", e.linkname))
            while raw.read(1 << 20):  # the xz stream must end cleanly (its check is at the end)
                if raw.tell() > max_bytes:
                    raise ValueError(f"unpacks to more than {max_bytes / 2**20:.0f} MiB after its last entry")
    except (lzma.LZMAError, EOFError, OSError) as exc:
        raise ValueError(f"{type(exc).__name__}: {exc}") from exc
    return out


def find_cuobjdump() -> str | None:
    """cuobjdump from KT_CUOBJDUMP, PATH or the PyPI CUDA wheels; None if absent."""
    if os.environ.get(CUOBJDUMP_ENV):
        path = os.environ[CUOBJDUMP_ENV]
        return path if Path(path).is_file() else None
    found = shutil.which("cuobjdump")
    if found:
        return found
    try:
        import nvidia  # the PyPI CUDA wheels' namespace package

        for p in nvidia.__path__:
            for cand in sorted(Path(p).glob("cu*/bin/cuobjdump")):
                return str(cand)
    except ImportError:
        pass
    return None


@dataclass(frozen=True)
class CudaFacts:
    """What cuobjdump lists of one library: SASS and PTX archs, kernels, PTX ISA, bytes per arch."""

    sass: frozenset[str]
    ptx: frozenset[str]
    # arch -> kernel (mangled) names in that cubin
    kernels: dict[str, frozenset[str]]
    ptx_versions: frozenset[str]
    # arch -> bytes of its cubin (uncompressed), for the size breakdown
    arch_bytes: dict[str, int]


def _run(tool: str, *args: str) -> str:
    proc = subprocess.run([tool, *args], capture_output=True, text=True, check=False)
    if proc.returncode != 0 and "does not contain" not in proc.stderr and "No PTX" not in proc.stderr:
        raise ValueError(f"cuobjdump {' '.join(args[:-1])} failed: {proc.stderr.strip()}")
    return proc.stdout


def list_archs(tool: str, path: Path) -> tuple[frozenset[str], frozenset[str]]:
    """(SASS, PTX) architectures of one ELF file on disk: cuobjdump's lists only (fast on 1 GB binaries)."""
    sass = re.findall(r"\.(sm_\d+[a-z]?)\.cubin", _run(tool, "--list-elf", str(path)))
    ptx = re.findall(r"\.(sm_\d+[a-z]?)\.ptx", _run(tool, "--list-ptx", str(path)))
    return frozenset(sass), frozenset(a.replace("sm_", "compute_") for a in ptx)


def list_arch_bytes(tool: str, path: Path) -> dict[str, int]:
    """SASS arch -> bytes of its cubins in one ELF file on disk (extracted to a temporary
    directory, measured, deleted)."""
    sizes: dict[str, int] = {}
    with tempfile.TemporaryDirectory(prefix="kt-audit-") as out:
        subprocess.run(
            [tool, "--extract-elf", "all", str(Path(path).resolve())], cwd=out, capture_output=True, check=False
        )
        for cubin in Path(out).glob("*.cubin"):
            m = re.search(r"\.(sm_\d+[a-z]?)\.cubin$", cubin.name)
            if m:
                sizes[m.group(1)] = sizes.get(m.group(1), 0) + cubin.stat().st_size
    return sizes


def read_cuda(tool: str, data: bytes) -> CudaFacts:
    """What cuobjdump lists in one ELF: SASS archs, PTX archs, kernels per arch, PTX ISA versions."""
    with tempfile.NamedTemporaryFile(suffix=".so") as fh:
        fh.write(data)
        fh.flush()
        sass = re.findall(r"\.(sm_\d+[a-z]?)\.cubin", _run(tool, "--list-elf", fh.name))
        ptx = [
            a.replace("sm_", "compute_")
            for a in re.findall(r"\.(sm_\d+[a-z]?)\.ptx", _run(tool, "--list-ptx", fh.name))
        ]
        kernels: dict[str, set[str]] = {}
        arch = ""
        for line in _run(tool, "--dump-resource-usage", fh.name).splitlines():
            m = re.match(r"\s*arch = (sm_\w+)", line)
            if m:
                arch = m.group(1)
                kernels.setdefault(arch, set())
            m = re.match(r"\s*Function (\S+):", line)
            if m and arch:
                kernels[arch].add(m.group(1))
        versions = (
            set(re.findall(r"^\.version (\d+\.\d+)", _run(tool, "--dump-ptx", fh.name), re.MULTILINE)) if ptx else set()
        )
        sizes = list_arch_bytes(tool, Path(fh.name))
    return CudaFacts(
        frozenset(sass), frozenset(ptx), {a: frozenset(k) for a, k in kernels.items()}, frozenset(versions), sizes
    )


@dataclass(frozen=True)
class KernelPayload:
    """kt-kernel's own CUDA archive (a tar.xz member of its wheel), read once: its entries (file
    bytes dropped), the ELF facts of its files, and cuobjdump's facts of the libraries asked for."""

    member: str
    size: int
    sha256: str
    error: str  # "" when the archive read to its end
    entries: tuple[tuple[str, str, str], ...]  # (name, kind, linkname)
    files: tuple[str, ...]  # normalized paths of the regular files that stay inside the root
    elfs: tuple[Any, ...]  # ElfFacts of those files, named "<member>!<path>"
    cuda: dict[str, tuple[int, CudaFacts | str]]  # library path -> (bytes, facts or cuobjdump's error)
    cuda_inspected: bool


def read_kernel_payload(
    member: str, data: bytes, sha256: str, tool: str | None, detailed: Collection[str], max_bytes: int = 256 << 20
) -> KernelPayload:
    """Everything the CUDA rules need of the archive, with cuobjdump run here (not in the analyzer)."""
    import posixpath

    from ._elf import read_elf

    try:
        entries = read_payload(data, max_bytes)
    except ValueError as exc:
        return KernelPayload(member, len(data), sha256, str(exc), (), (), (), {}, tool is not None)
    files: dict[str, bytes] = {}
    for e in entries:
        norm = posixpath.normpath(e.name)
        if e.kind == "file" and not (e.name.startswith("/") or norm == ".." or norm.startswith("../")):
            files[norm] = e.data
    elfs = tuple(f for name, blob in sorted(files.items()) if (f := read_elf(f"{member}!{name}", blob)) is not None)
    cuda: dict[str, tuple[int, CudaFacts | str]] = {}
    if tool is not None:
        for lib in detailed:
            if lib in files:
                try:
                    cuda[lib] = (len(files[lib]), read_cuda(tool, files[lib]))
                except ValueError as exc:
                    cuda[lib] = (len(files[lib]), str(exc))
    return KernelPayload(
        member,
        len(data),
        sha256,
        "",
        tuple((e.name, e.kind, e.linkname) for e in entries),
        tuple(sorted(files)),
        elfs,
        cuda,
        tool is not None,
    )
