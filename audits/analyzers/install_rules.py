"""The release's install files against its wheels: every package of the release an install file
pins carries exactly the sha256 of that release wheel for the file's Python (a pylock's path names
that very file), and every install file is readable. Pure: facts in, findings out."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import PurePosixPath

from packaging.tags import compatible_tags, cpython_tags
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename

from ..model import Finding
from ..readers._install import InstallFile
from ._common import finding

_FIX = "rebuild the release (nox -s build_all): the assembly writes dist/install/ from the wheels beside it"


def _serves(filename: str, python: str) -> bool:
    version = tuple(int(x) for x in python.split("."))  # python: "3.N" from the reader's own pattern
    pairs = {(t.interpreter, t.abi) for t in [*cpython_tags(version, platforms=["any"]), *compatible_tags(version)]}
    return any((t.interpreter, t.abi) in pairs for t in parse_wheel_filename(filename)[3])


def analyze(files: Sequence[InstallFile], wheels: Mapping[str, str]) -> list[Finding]:
    """`wheels`: filename -> sha256 of every wheel audited beside the install files."""
    out: list[Finding] = []
    release: dict[str, list[tuple[str, str, str]]] = {}  # name -> (version, filename, sha256)
    for filename, sha in wheels.items():
        try:
            dist, version, _, _ = parse_wheel_filename(filename)
        except InvalidWheelFilename:
            continue  # wheel.unreadable already names it; no install file can pin it

        release.setdefault(canonicalize_name(dist), []).append((str(version), filename, sha))
    for f in files:
        if f.error:
            out.append(finding("install.unreadable", f.label, "", f"the install file cannot be read: {f.error}", _FIX))
            continue
        for name, pin in sorted(f.pins.items()):
            if name not in release:
                continue  # a third-party package: its hashes come from its index
            candidates = [(v, fn, sha) for v, fn, sha in release[name] if v == pin.version]
            if f.python:
                candidates = [c for c in candidates if _serves(c[1], f.python)]
            if not candidates:
                have = ", ".join(fn for _, fn, _ in release[name])
                out.append(
                    finding(
                        "install.carrier-hash",
                        f.label,
                        name,
                        f"pins {name}=={pin.version} for CPython {f.python or '?'}, but the release has no such "
                        f"wheel (it has {have})",
                        _FIX,
                    )
                )
                continue
            shas = {sha for _, _, sha in candidates}
            if not pin.hashes or not pin.hashes <= shas:  # only the release's own bytes may install
                out.append(
                    finding(
                        "install.carrier-hash",
                        f.label,
                        name,
                        f"pins {name}=={pin.version} with sha256 {', '.join(sorted(pin.hashes)) or '(none)'}; the "
                        f"release's wheel is {', '.join(sorted(shas))}",
                        _FIX,
                    )
                )
            names = {fn for _, fn, _ in candidates}
            for path in pin.files:
                if PurePosixPath(path).name not in names:
                    out.append(
                        finding(
                            "install.carrier-hash",
                            f.label,
                            name,
                            f"names the file {path}, which is not the release's {name} wheel "
                            f"({', '.join(sorted(names))})",
                            _FIX,
                        )
                    )
    return out
