"""Rule 6: the lazy CUDA archive - payload safety, SASS/PTX coverage per
library, every kernel for every arch, PTX ISA within the driver floor; and the
ELF/RPATH rules inside the payload's own layout."""

from __future__ import annotations

import posixpath
from typing import Any

from ..model import Finding
from ..policy import Policy
from ..readers import WheelFacts
from ..readers._cuda import CudaFacts, KernelPayload
from ..readers._json import BUILD_MANIFEST, load
from . import elf_rules, wheel_rules
from ._common import finding
from .manifest_rules import MANIFEST


def _version_key(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in v.split("."))


def cuda(
    w: WheelFacts, kp: KernelPayload | None, policy: Policy, system: frozenset[str]
) -> tuple[list[Finding], dict[str, Any]]:
    """The rules over kt-kernel's own CUDA archive, from facts its reader collected."""
    fn = w.filename
    if kp is None:
        return [], {}
    if kp.error:
        return [finding("cuda.payload", fn, kp.member, f"unreadable payload: {kp.error}", "rebuild the wheel")], {}
    out: list[Finding] = []
    for name, kind, linkname in kp.entries:
        norm = posixpath.normpath(name)
        if name.startswith("/") or norm == ".." or norm.startswith("../"):
            out.append(
                finding(
                    "cuda.payload",
                    fn,
                    kp.member,
                    f"member {name!r} escapes the archive root",
                    "pack the payload with kernel/cmake/pack_cuda_payload.py only",
                )
            )
        elif kind == "special":
            out.append(
                finding(
                    "cuda.payload",
                    fn,
                    kp.member,
                    f"member {name!r} is a special file",
                    "the payload holds regular files only",
                )
            )
        elif kind == "link":
            out.append(
                finding(
                    "cuda.payload",
                    fn,
                    kp.member,
                    f"member {name!r} is a link to {linkname!r}",
                    "the payload holds regular files only; the loader refuses links",
                )
            )
    files = set(kp.files)
    manifest = w.member(MANIFEST)
    claimed: dict[str, Any] = {}
    if manifest is not None:
        doc, _problem = load(manifest.data or b"", BUILD_MANIFEST)  # manifest_rules reports a bad one
        claimed = (doc or {}).get("cuda") or {}
    if claimed:
        if claimed.get("sha256") != kp.sha256:
            out.append(
                finding(
                    "manifest.claim",
                    fn,
                    kp.member,
                    f"payload sha256 {kp.sha256} differs from the claimed {claimed.get('sha256')}",
                    "rebuild the wheel",
                )
            )
        for name in sorted(set(claimed.get("files", {})) ^ files):
            where = "listed in _build.json but not in the payload" if name not in files else "not in _build.json"
            out.append(finding("manifest.claim", fn, f"{kp.member}!{name}", f"{name} is {where}", "rebuild the wheel"))
    elfs = list(kp.elfs)
    out += elf_rules.elf_abi(fn, str(w.name), elfs, policy)
    # The payload's libraries load on the user's system too: the platform tag must cover them.
    out += wheel_rules.platform_overclaims(w, elfs)
    out += elf_rules.rpath(fn, elfs, sorted(files), system, (), policy.always_external)
    section: dict[str, Any] = {"payload": kp.member, "payload_bytes": kp.size, "libraries": {}}
    if not kp.cuda_inspected:
        out.append(
            finding(
                "cuda.tool-missing",
                fn,
                kp.member,
                "cuobjdump not found: SASS/PTX were not checked",
                "install nvidia-cuda-cuobjdump (lockfiles/audit.txt) or set KT_CUOBJDUMP",
            )
        )
        return out, section
    lib_findings, section["libraries"] = check_libraries(fn, f"{kp.member}!", kp.cuda, policy)
    out += lib_findings
    return out, section


def listing(w: WheelFacts) -> tuple[list[Finding], dict[str, Any]]:
    """Every ELF member of any wheel that embeds CUDA device code (a .nv_fatbin section): its
    SASS and PTX architectures and bytes per architecture, as cuobjdump lists them; or, without
    cuobjdump, the explicit note that the CUDA content was not inspected."""
    carriers = sorted((e.member, e.fatbin_bytes) for e in w.elfs.values() if e.fatbin_bytes)
    if not carriers:
        return [], {}
    if not w.cuda_inspected:
        names = ", ".join(n for n, _ in carriers[:3]) + (f" and {len(carriers) - 3} more" if len(carriers) > 3 else "")
        return [
            finding(
                "cuda.tool-missing",
                w.filename,
                carriers[0][0],
                f"cuda: not inspected: {len(carriers)} ELF file(s) embed CUDA device code ({names}) and "
                "cuobjdump is not available",
                "install nvidia-cuda-cuobjdump (lockfiles/audit.txt) or set KT_CUOBJDUMP",
                "warning",
            )
        ], {"inspected": False, "files": dict(carriers)}
    out: list[Finding] = []
    files: dict[str, Any] = {}
    for c in w.cuda:
        if c.error:
            out.append(
                finding(
                    "cuda.fatbin-unreadable",
                    w.filename,
                    c.member,
                    f"cuobjdump cannot read its embedded device code ({c.fatbin_bytes} bytes of .nv_fatbin): {c.error}",
                    "rebuild the library; check it with cuobjdump --list-elf",
                )
            )
        files[c.member] = {
            "fatbin_bytes": c.fatbin_bytes,
            "sass": list(c.sass),
            "ptx": list(c.ptx),
            "arch_bytes": dict(c.arch_bytes),
        }
    return out, {"inspected": True, "files": files}


def check_libraries(
    fn: str, prefix: str, facts: dict[str, tuple[int, CudaFacts | str]], policy: Policy
) -> tuple[list[Finding], dict[str, Any]]:
    """The policy's per-library CUDA rules (arch set, every kernel per arch, PTX ISA floor) over
    cuobjdump facts: library path (as the policy names it) -> (bytes, facts or the reader's error)."""
    out: list[Finding] = []
    libraries: dict[str, Any] = {}
    for lib in policy.cuda_libraries:
        label = f"{prefix}{lib.member}"
        entry = facts.get(lib.member)
        if entry is None:
            out.append(
                finding(
                    "cuda.arch-set",
                    fn,
                    label,
                    f"{lib.member} is not in the payload",
                    "build with KT_CUDA=ON and every architecture (nox -s build_cuda)",
                )
            )
            continue
        size, cfacts = entry
        if isinstance(cfacts, str):
            out.append(finding("cuda.payload", fn, label, cfacts, "rebuild the CUDA libraries"))
            continue
        if cfacts.sass != lib.sass or cfacts.ptx != lib.ptx:
            missing = sorted((lib.sass - cfacts.sass) | (lib.ptx - cfacts.ptx))
            extra = sorted((cfacts.sass - lib.sass) | (cfacts.ptx - lib.ptx))
            out.append(
                finding(
                    "cuda.arch-set",
                    fn,
                    label,
                    f"holds SASS {sorted(cfacts.sass)} + PTX {sorted(cfacts.ptx)}; the policy wants SASS "
                    f"{sorted(lib.sass)} + PTX {sorted(lib.ptx)} (missing {missing or 'none'}, "
                    f"unexpected {extra or 'none'})",
                    "set CUDA_ARCHITECTURES in kernel/CMakeLists.txt (KT_CUDA_ARCHS) to the policy's list",
                )
            )
        wanted = policy.cuda_kernels if lib.member.endswith("libkt_cuda.so") else ()
        for arch in sorted(cfacts.sass):
            names = cfacts.kernels.get(arch, frozenset())
            for k in wanted:
                if not any(k in n for n in names):
                    out.append(
                        finding(
                            "cuda.kernel-missing",
                            fn,
                            label,
                            f"kernel {k} has no {arch} SASS",
                            "check the kernel is compiled for every architecture (no __CUDA_ARCH__ guard drops it)",
                        )
                    )
        for v in sorted(cfacts.ptx_versions):
            if policy.cuda_min_driver_ptx_isa and _version_key(v) > _version_key(policy.cuda_min_driver_ptx_isa):
                out.append(
                    finding(
                        "cuda.ptx-version",
                        fn,
                        label,
                        f"PTX ISA {v} is newer than {policy.cuda_min_driver_ptx_isa}, the newest the policy's minimum "
                        "driver can JIT",
                        "build the PTX with an older toolkit, or raise min_driver_ptx_isa (and the "
                        "documented driver floor) in the policy",
                    )
                )
        libraries[lib.member] = {
            "bytes": size,
            "sass": sorted(cfacts.sass),
            "ptx": sorted(cfacts.ptx),
            "ptx_isa": sorted(cfacts.ptx_versions),
            "kernels": {a: len(k) for a, k in sorted(cfacts.kernels.items())},
            "arch_bytes": dict(sorted(cfacts.arch_bytes.items())),
        }
    return out, libraries
