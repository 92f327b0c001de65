"""Findings and the rule catalogue (stable ids; tests assert on them)."""

from __future__ import annotations

import zipfile
from dataclasses import dataclass
from typing import Literal

Severity = Literal["error", "warning", "info"]
Section = Literal["wheel", "cpu", "cuda"]


@dataclass(frozen=True)
class Finding:
    """One problem an analyzer found: rule id, severity, wheel, member, message and fix."""

    rule: str
    severity: Severity
    wheel: str
    member: str
    message: str
    fix: str

    def as_dict(self) -> dict[str, str]:
        return {
            "rule": self.rule,
            "severity": self.severity,
            "wheel": self.wheel,
            "member": self.member,
            "message": self.message,
            "fix": self.fix,
        }


@dataclass(frozen=True)
class Limits:
    """What the reader refuses to decompress (a zip bomb must not exhaust memory or disk)."""

    member_max_bytes: int = 8 << 30
    ratio_max: float = 200.0
    ratio_min_bytes: int = 16 << 20  # the ratio is only judged for members at least this large
    # A nested archive (kt-kernel's tar.xz, the release's zstd parts) unpacks to at most this much,
    # whatever it declares; each of its files is read only up to its declared size.
    archive_max_bytes: int = 16 << 30
    memory_max_bytes: int = 256 << 20  # what the audit holds of a nested archive in memory at once

    def refuse(self, info: zipfile.ZipInfo) -> str:
        """Why the member is not read, or ""."""
        if info.file_size > self.member_max_bytes:
            return (
                f"declares {info.file_size / 2**20:.0f} MiB uncompressed, over the limit of "
                f"{self.member_max_bytes / 2**20:.0f} MiB"
            )
        held = ".dist-info/" in info.filename or info.filename.endswith((".json", ".tar.xz"))
        if held and info.file_size > self.memory_max_bytes:
            return (
                f"declares {info.file_size / 2**20:.0f} MiB, over the limit of {self.memory_max_bytes / 2**20:.0f} MiB "
                "for a file the audit reads whole"
            )
        ratio = info.file_size / max(info.compress_size, 1)
        if info.file_size >= self.ratio_min_bytes and ratio > self.ratio_max:
            return (
                f"expands {ratio:.0f}x ({info.compress_size} -> {info.file_size} bytes), over the limit of "
                f"{self.ratio_max:.0f}x"
            )
        return ""


@dataclass(frozen=True)
class Rule:
    """An audit rule of the catalogue: its stable id, report section and one-line summary."""

    id: str
    section: Section
    summary: str


RULES: dict[str, Rule] = {
    r.id: r
    for r in (
        # 1. wheel integrity and metadata
        Rule("wheel.unreadable", "wheel", "the file is not a readable zip / wheel"),
        Rule("wheel.record-missing", "wheel", "no .dist-info/RECORD"),
        Rule("wheel.record-mismatch", "wheel", "a member's sha256 or size differs from RECORD"),
        Rule("wheel.record-unlisted", "wheel", "a member is not listed in RECORD"),
        Rule("wheel.record-phantom", "wheel", "RECORD lists a file the wheel does not contain"),
        Rule("wheel.wheel-file", "wheel", "WHEEL: Root-Is-Purelib or Tag lines disagree with the wheel"),
        Rule("wheel.purelib", "wheel", "WHEEL: Root-Is-Purelib says pure for a native wheel, or the reverse"),
        Rule("wheel.metadata", "wheel", "METADATA: unparseable, name/version differ from the filename"),
        Rule("wheel.requires-dist", "wheel", "a Requires-Dist line does not parse"),
        Rule("wheel.requires-python", "wheel", "no Requires-Python"),
        Rule("wheel.stray-content", "wheel", "__pycache__, .pyc, build directories or object files"),
        Rule("wheel.static-library", "wheel", "a static archive (.a): nothing loads it at run time"),
        Rule("wheel.member-limit", "wheel", "a member's declared size or compression ratio is over the policy's limit"),
        Rule("wheel.duplicate-member", "wheel", "the same path appears twice in the zip"),
        Rule("wheel.unsafe-path", "wheel", "a member or RECORD path is absolute, climbs out, or is ambiguous"),
        Rule("wheel.link-member", "wheel", "a symlink or special-file entry in the zip"),
        Rule("wheel.top-level", "wheel", "a top-level lib/, include/, bin/... that installs into site-packages"),
        Rule("wheel.duplicate-library", "wheel", "identical shared-library bytes stored more than once"),
        Rule("release.path-collision", "wheel", "two distributions of the release install the same path"),
        Rule("dist.name-lookup", "wheel", "code looks a distribution up by an upstream name the release renames"),
        Rule("dist.upstream-record", "wheel", "a renamed distribution without a readable .dist-info/kt_upstream.json"),
        Rule("sbom.missing", "wheel", "no SBOM in .dist-info/sboms/ (PEP 770): nothing says where the bytes came from"),
        Rule("sbom.invalid", "wheel", "an SBOM that is not JSON, not CycloneDX, or not valid against its schema"),
        Rule("sbom.mismatch", "wheel", "the SBOM names another wheel, or leaves out an input, part, graft or file"),
        Rule("license.undeclared", "wheel", "no License-Expression (PEP 639): the wheel does not say its license"),
        Rule("license.invalid", "wheel", "a License-Expression that is not SPDX, or a License-File the wheel lacks"),
        Rule("license.unlicensed-binary", "wheel", "compiled code, a graft or archived files without a license file"),
        # 2. tags
        Rule("tag.ext-suffix", "wheel", "an extension module's suffix does not match the python/abi tag"),
        Rule("tag.manylinux-overclaim", "wheel", "an ELF needs symbol versions newer than the platform tag allows"),
        Rule("tag.not-portable", "wheel", "a native wheel with a plain linux_* tag"),
        Rule("tag.isa-level", "wheel", "an ELF declares an x86-64 ISA level above baseline under a manylinux tag"),
        Rule("tag.forbidden-symbol", "wheel", "an ELF uses a symbol the claimed manylinux policy forbids"),
        Rule("tag.libc-mismatch", "wheel", "an ELF file or extension suffix names the other C library than the tag"),
        Rule("tag.libc-assumed", "wheel", "no tag and no ELF file names the C library: the verdict assumes glibc"),
        Rule("tag.native-any", "wheel", "a wheel tagged for any platform holds native libraries"),
        # 3. ELF / ABI
        Rule("elf.needed-forbidden", "wheel", "DT_NEEDED names a library that must never be needed"),
        Rule("elf.textrel", "wheel", "text relocations (DT_TEXTREL)"),
        Rule("elf.execstack", "wheel", "an executable stack (PT_GNU_STACK with X)"),
        Rule("elf.rwx-segment", "wheel", "a loadable segment that is writable and executable"),
        Rule("elf.exports", "wheel", "dynamic symbols exported beyond PyInit_* and the declared C API"),
        Rule("elf.arch-mismatch", "wheel", "an ELF file's machine, class, byte order or OS ABI differs from the tag"),
        Rule("elf.not-elf", "wheel", "a shared-library or extension member that is not ELF at all"),
        Rule("abi3.limited-api", "wheel", "an abi3 extension uses symbols outside the stable ABI of its oldest Python"),
        Rule("torch.abi-pin", "wheel", "an ELF binds torch's C++ ABI but the wheel does not require torch exactly"),
        Rule("link.unresolved", "wheel", "an undefined symbol binds nowhere in the load scope (--link providers)"),
        Rule("link.provider-missing", "wheel", "a needed library neither the wheel nor the --link providers hold"),
        Rule(
            "elf.unused", "wheel", "a library nothing loads: its name resolves to another copy (info; decides nothing)"
        ),
        # 4. RPATH
        Rule("rpath.not-origin", "wheel", "an RPATH/RUNPATH entry that is not $ORIGIN-relative, or empty"),
        Rule("rpath.unresolved", "wheel", "a non-system DT_NEEDED that does not resolve inside the wheel"),
        # 5. ISA per CPU variant
        Rule("isa.forbidden-feature", "cpu", "a variant uses an instruction outside its allowed ISA set"),
        Rule("isa.marker-missing", "cpu", "a variant never uses its distinguishing feature (mislabeled)"),
        Rule("isa.loader-above-baseline", "cpu", "the loader/detection code uses an instruction above baseline"),
        Rule("isa.variant-missing", "cpu", "a CPU variant library is missing from the wheel"),
        Rule(
            "isa.graft-above-baseline", "wheel", "a library the wheel loads runs undeclared code above x86-64 baseline"
        ),
        Rule("isa.graft-dispatch", "wheel", "a library the wheel loads picks code above baseline at run time (info)"),
        # 6. SASS / PTX
        Rule("cuda.arch-set", "cuda", "a CUDA library's (arch, kind) set differs from the policy"),
        Rule("cuda.kernel-missing", "cuda", "a kernel is missing for an architecture it should have"),
        Rule("cuda.ptx-version", "cuda", "PTX ISA newer than the policy's minimum driver can JIT"),
        Rule("cuda.tool-missing", "cuda", "cuobjdump is not available, CUDA checks could not run"),
        Rule("cuda.payload", "cuda", "the lazy CUDA payload is unreadable or unsafe"),
        Rule("cuda.fatbin-unreadable", "cuda", "cuobjdump cannot read the device code embedded in a library"),
        # 9. the release's lazy CUDA archive, across wheels
        Rule("payload.manifest", "cuda", "the payload manifest is missing, unreadable or present twice"),
        Rule("payload.part-missing", "cuda", "a part the manifest lists is not in the release or not in its wheel"),
        Rule("payload.part-duplicate", "cuda", "a part listed twice, or a part member the manifest does not list"),
        Rule("payload.part-order", "cuda", "the manifest's parts are not numbered 1..N in order"),
        Rule("payload.part-version", "cuda", "a part's carrier is another version than the manifest's release wants"),
        Rule("payload.part-mismatch", "cuda", "a part's size or sha256 differs from the manifest"),
        Rule("payload.archive-mismatch", "cuda", "the concatenated parts differ from the manifest or do not unpack"),
        Rule("payload.file-mismatch", "cuda", "an archived file is missing, extra or different from the manifest"),
        Rule("payload.unsafe-member", "cuda", "an archive member escapes the root, or is a link or special file"),
        Rule("payload.carrier-any", "cuda", "a wheel carrying payload parts or the manifest is tagged `any`"),
        Rule("payload.closure", "cuda", "an install that can import the payload's package misses a part carrier"),
        Rule("payload.sass-coverage", "cuda", "an archived CUDA binary runs on none of a required compute capability"),
        # 10. the release's install files (dist/install/), against its wheels
        Rule("install.carrier-hash", "wheel", "an install file pins a release wheel by another hash, version or file"),
        Rule("install.unreadable", "wheel", "an install file of the release cannot be read"),
        # 7. size
        Rule("size.wheel-budget", "wheel", "the wheel is over its size budget"),
        Rule("size.growth", "wheel", "the wheel grew more than the threshold against the baseline"),
        # 8. build manifest
        Rule("manifest.missing", "wheel", "kt_kernel/_build.json is absent or unparseable"),
        Rule("manifest.claim", "wheel", "a claim in _build.json does not hold for the binaries"),
        Rule("manifest.unlisted", "wheel", "a native library in the wheel is not described by _build.json"),
    )
}
