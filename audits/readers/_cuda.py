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


@dataclass(frozen=True)
class Tool:
    """The cuobjdump that describes or judges CUDA code: its path, where it came from, its own version."""

    path: str
    source: str  # "locked" (nvidia-cuda-cuobjdump, installed from a lock), "KT_CUOBJDUMP", "PATH"
    version: str

    def as_dict(self) -> dict[str, str]:
        return {"path": self.path, "source": self.source, "version": self.version}


def _locked() -> str | None:
    """The cuobjdump of the PyPI CUDA wheels installed in this environment (lockfiles/audit.txt, cuda.txt)."""
    try:
        import nvidia  # the PyPI CUDA wheels' namespace package
    except ImportError:
        return None
    for p in nvidia.__path__:
        for cand in sorted(Path(p).glob("cu*/bin/cuobjdump")):
            return str(cand)
    return None


def _tool_version(path: str) -> str:
    try:
        got = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unknown ({type(exc).__name__})"
    lines = [ln for ln in (got.stdout or got.stderr).splitlines() if ln.strip()]
    return lines[-1].strip() if lines else "unknown"


_TOOLS: dict[tuple[str, str, bool], Tool | None] = {}


def cuobjdump_tool(*, allow_path: bool = True) -> Tool | None:
    """The cuobjdump to use: KT_CUOBJDUMP where it names one (an override, keyed by the stages that read it),
    else the locked one of this environment, else (`allow_path`: the audit of anyone's wheels) the one on
    PATH; None if there is none. What shapes an artifact is never taken from PATH."""
    override = os.environ.get(CUOBJDUMP_ENV, "")
    key = (override, os.environ.get("PATH", ""), allow_path)
    if key not in _TOOLS:
        tool = None
        if override:
            tool = Tool(override, CUOBJDUMP_ENV, _tool_version(override)) if Path(override).is_file() else None
        elif locked := _locked():
            tool = Tool(locked, "locked", _tool_version(locked))
        elif allow_path and (found := shutil.which("cuobjdump")):
            tool = Tool(found, "PATH", _tool_version(found))
        _TOOLS[key] = tool
    return _TOOLS[key]


def find_cuobjdump(*, allow_path: bool = True) -> str | None:
    """cuobjdump_tool()'s path; None if there is none."""
    tool = cuobjdump_tool(allow_path=allow_path)
    return tool.path if tool else None


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
