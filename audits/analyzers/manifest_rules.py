"""Rule 8: every claim of kt_kernel/_build.json against the wheel's binaries."""

from __future__ import annotations

import fnmatch
from typing import Any

from ..model import Finding
from ..policy import Policy
from ..readers import ElfFacts, FeatureUse, WheelFacts
from ..readers._json import BUILD_MANIFEST, load
from ._common import finding

MANIFEST = "kt_kernel/_build.json"


def manifest(
    w: WheelFacts, elfs: dict[str, ElfFacts], policy: Policy, uses: dict[str, dict[str, FeatureUse]]
) -> list[Finding]:
    """Check every claim of kt_kernel/_build.json against the wheel's binaries."""
    fn = w.filename
    native = [n for n in elfs if n.startswith("kt_kernel/")]
    if not native:
        return []
    m = w.member(MANIFEST)
    if m is None:
        return [
            finding(
                "manifest.missing",
                fn,
                MANIFEST,
                "kt-kernel wheel without its build manifest",
                "build with kernel/CMakeLists.txt, which installs _build.json",
            )
        ]
    data, problem = load(m.data or b"", BUILD_MANIFEST)
    if problem:
        return [finding("manifest.missing", fn, MANIFEST, problem, "rebuild the wheel")]
    variants: dict[str, Any] = data["variants"]
    out: list[Finding] = []
    if data.get("schema_version") != 1:
        out.append(
            finding(
                "manifest.claim",
                fn,
                MANIFEST,
                f"schema_version {data.get('schema_version')!r}",
                "this audit reads schema_version 1",
            )
        )
    if str(data.get("version")) != str(w.version):
        out.append(
            finding(
                "manifest.claim",
                fn,
                MANIFEST,
                f"claims version {data.get('version')}, the wheel is {w.version}",
                "rebuild: the manifest and the wheel take the version from _version.py",
            )
        )
    by_name = {v.name: v for v in policy.variants}
    listed_files = set()
    for name, entry in variants.items():
        file = entry.get("file", "")
        listed_files.add(file)
        pol = by_name.get(name)
        if pol is None:
            out.append(
                finding(
                    "manifest.claim",
                    fn,
                    MANIFEST,
                    f"lists variant {name!r}, which the policy lacks",
                    "add it to cpu_variants.json or drop it from the build",
                )
            )
            continue
        if file not in elfs:
            out.append(
                finding(
                    "manifest.claim",
                    fn,
                    MANIFEST,
                    f"variant {name}: file {file} is not in the wheel",
                    "rebuild; the manifest is generated from the variants actually built",
                )
            )
            continue
        if set(entry.get("features", [])) != set(pol.features):
            msg = (
                f"variant {name} claims features {sorted(entry.get('features', []))}, "
                f"the ladder says {sorted(pol.features)}"
            )
            out.append(finding("manifest.claim", fn, MANIFEST, msg, "rebuild from the current ladder"))
        used = uses.get(file, {})
        if pol.marker not in used:
            out.append(
                finding(
                    "manifest.claim",
                    fn,
                    file,
                    f"variant {name} claims {pol.marker} but its disassembly never uses it",
                    f"see isa.marker-missing for {file}",
                )
            )
        if "sha256" in entry:
            actual = w.member(file).sha256  # type: ignore[union-attr]
            if actual != entry["sha256"]:
                out.append(
                    finding(
                        "manifest.claim",
                        fn,
                        file,
                        f"sha256 {actual} differs from the claimed {entry['sha256']}",
                        "rebuild the wheel",
                    )
                )
    for n in native:
        if fnmatch.fnmatch(n, "kt_kernel/cpu/*.so") and n not in listed_files:
            out.append(
                finding(
                    "manifest.unlisted",
                    fn,
                    n,
                    f"{n} is in the wheel but not in {MANIFEST}",
                    "every variant library must be built by add_cpu_variant(), which lists it",
                )
            )
    return out
