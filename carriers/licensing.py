"""Licenses of the release's wheels (PEP 639): every wheel states a ``License-Expression`` (SPDX) and ships
the license files of what it bundles under ``.dist-info/licenses/``, each listed by a ``License-File``
header.

- a fork or repack states its upstream's expression where the upstream declares one, else the one
  carriers.toml gives it (``license = "SPDX"``); both given and different is an error;
- the umbrella states kt-kernel's (kernel/pyproject.toml owns the project's license) and ships kt-kernel's
  license files;
- the payload's provider ships the license files of every wheel an archived file was taken from, under
  ``licenses/payload/<distribution>/``.

A METADATA this edits becomes Metadata-Version 2.4 (the version that defines the two headers); the
free-text ``License`` header and the license classifiers go, since the expression supersedes them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from packaging.licenses import InvalidLicenseExpression, canonicalize_license_expression
from packaging.utils import canonicalize_name

from . import wheelio
from .errors import InputError

METADATA_VERSION = "2.4"
LICENSES = "licenses"  # under the .dist-info directory (PEP 639)
PAYLOAD_DIR = "payload"  # licenses/payload/<distribution>/: where the provider keeps the payload's licenses
_LICENSE_NAMES = ("LICEN", "COPYING", "NOTICE", "AUTHORS")  # pre-PEP 639 files at the .dist-info root


def canonical(expression: str, where: str) -> str:
    """The SPDX expression in its canonical spelling; InputError naming `where` if it is none."""
    try:
        return str(canonicalize_license_expression(expression))
    except InvalidLicenseExpression as exc:
        raise InputError(f"{where}: license {expression!r} is not an SPDX license expression ({exc})") from None


def declared(meta: str) -> str | None:
    """The License-Expression a METADATA declares, if any."""
    found = wheelio.metadata_field(meta, "License-Expression")
    return found[0] if found else None


def expression_for(carrier: str, configured: str, upstream: str, meta: str) -> str:
    """The expression a fork or repack states: its upstream's, or carriers.toml's where the upstream has none."""
    theirs = declared(meta)
    ours = canonical(configured, f"carriers.toml [{carrier}]") if configured else None
    if theirs is not None:
        theirs = canonical(theirs, f"upstream {upstream}'s License-Expression")
        if ours is not None and ours != theirs:
            raise InputError(
                f"carriers.toml [{carrier}]: license = {configured!r}, but upstream {upstream} declares "
                f"License-Expression: {theirs}; drop the key: the upstream's expression is the one stated"
            )
        return theirs
    if ours is None:
        legacy = wheelio.metadata_field(meta, "License")
        first = legacy[0].strip().splitlines()[0] if legacy and legacy[0].strip() else ""
        said = f" (its License header says {first!r})" if first else ""
        raise InputError(
            f"carriers.toml [{carrier}]: upstream {upstream} declares no License-Expression{said}; "
            f'state its SPDX expression: license = "Apache-2.0" (or whatever its license file says) in [{carrier}]'
        )
    return ours


def license_files(members: Mapping[str, bytes], di: str) -> dict[str, bytes]:
    """path under licenses/ -> bytes, of every license file a wheel's .dist-info holds (a pre-PEP 639
    wheel's LICENSE, COPYING, NOTICE at the .dist-info root included, by their names)."""
    prefix = f"{di}/{LICENSES}/"
    out = {n[len(prefix) :]: d for n, d in members.items() if n.startswith(prefix)}
    for n, d in members.items():
        base = n[len(di) + 1 :]
        if n.startswith(f"{di}/") and "/" not in base and base.upper().startswith(_LICENSE_NAMES):
            out.setdefault(base, d)
    return out


def _move_legacy(members: dict[str, bytes], di: str, listed: list[str], what: str) -> None:
    """License files a pre-2.4 METADATA lists at the .dist-info root move into licenses/ (PEP 639's place)."""
    for name in listed:
        if f"{di}/{LICENSES}/{name}" in members:
            continue
        if f"{di}/{name}" in members:
            members[f"{di}/{LICENSES}/{name}"] = members.pop(f"{di}/{name}")
            continue
        raise InputError(f"{what}: METADATA lists License-File {name}, which the wheel does not ship; fix the input")
    for n in [n for n in members if n.startswith(f"{di}/") and n.count("/") == 1]:
        base = n.split("/", 1)[1]
        if base.upper().startswith(_LICENSE_NAMES) and base not in listed:
            members[f"{di}/{LICENSES}/{base}"] = members.pop(n)


def _header(text: str, expression: str, files: list[str]) -> str:
    """METADATA with Metadata-Version 2.4, the License-Expression and one License-File per file; the old
    License header (with its continuation lines) and the license classifiers removed."""
    head, sep, body = text.partition("\n\n")
    out: list[str] = []
    skipping = False
    for raw in head.split("\n"):
        line = raw
        if skipping and line[:1] in (" ", "\t"):
            continue  # a continuation of the License header being dropped
        skipping = False
        if line.startswith(("License:", "License-Expression:", "License-File:")):
            skipping = line.startswith("License:")
            continue
        if line.startswith("Classifier:") and line.split(":", 1)[1].strip().startswith("License ::"):
            continue
        old = line.split(":", 1)[1] if line.startswith("Metadata-Version:") else METADATA_VERSION
        if _version_key(old) < _version_key(METADATA_VERSION):
            line = f"Metadata-Version: {METADATA_VERSION}"
        out.append(line)
    # after Summary (or Version): where build backends put them
    anchors = [i + 1 for i, line in enumerate(out) if line.startswith(("Version:", "Summary:"))]
    at = max(anchors, default=len(out))
    out[at:at] = [f"License-Expression: {expression}", *(f"License-File: {f}" for f in files)]
    return "\n".join(out) + (sep or "\n\n") + body


def _version_key(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in v.strip().split(".") if x.isdigit())


def apply(
    members: dict[str, bytes], di: str, expression: str, what: str, extra: Mapping[str, bytes] | None = None
) -> None:
    """State `expression` in the wheel's METADATA and list every license file under licenses/ (moving a
    pre-2.4 wheel's root-level ones there first); `extra` adds license files (path under licenses/ -> bytes)."""
    meta_name = f"{di}/METADATA"
    meta = members[meta_name].decode("utf-8")
    _move_legacy(members, di, wheelio.metadata_field(meta, "License-File"), what)
    for path, data in (extra or {}).items():
        members[f"{di}/{LICENSES}/{path}"] = data
    files = sorted(n[len(f"{di}/{LICENSES}/") :] for n in members if n.startswith(f"{di}/{LICENSES}/"))
    members[meta_name] = _header(meta, expression, files).encode("utf-8")


def payload_licenses(origins: Mapping[str, Mapping[str, bytes]]) -> dict[str, bytes]:
    """The provider's payload/<distribution>/<file> license files, from each origin wheel's license files."""
    return {
        f"{PAYLOAD_DIR}/{canonicalize_name(dist)}/{path}": data
        for dist, files in sorted(origins.items())
        for path, data in sorted(files.items())
    }


def of_wheel(path: Path) -> tuple[str | None, dict[str, bytes]]:
    """A built wheel's License-Expression and license files (path under licenses/ -> bytes)."""
    members = wheelio.read(path)
    di = wheelio.dist_info(members)
    return declared(members[f"{di}/METADATA"].decode("utf-8")), license_files(members, di)


def project(kernels: Sequence[Path]) -> tuple[str, dict[str, bytes]]:
    """The project's license, as kt-kernel's wheel states it (kernel/pyproject.toml owns it): its expression
    and license files; InputError if the kernel wheel states none."""
    if not kernels:
        raise InputError("no kt-kernel wheel to take the project's license from; build it (nox -s build_cuda)")
    expression, files = of_wheel(kernels[0])
    if expression is None or not files:
        raise InputError(
            f"{kernels[0].name}: states no License-Expression or ships no license file; rebuild it from this tree "
            "(kernel/pyproject.toml sets license, kernel/LICENSE is the text): nox -s build_cuda"
        )
    return expression, files
