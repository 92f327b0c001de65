"""A wheel of the assembly before it is written, and the one function that finishes it.

A builder returns a draft: the wheel's members in memory (or the kernel wheel's file, or the wheel
memo's bytes, as they are) and what finishing will apply (`Finish`). The payload step and the provider's
manifest edit the members and the finish (the part a wheel carries, the archive's origins, the tags);
`Draft.finished` applies, in this order, the license (the expression and its files into METADATA and
licenses/), the tags (WHEEL) and the SBOM (CycloneDX, with the libraries grafted into the final members),
and `Draft.write` writes the wheel once.
"""

from __future__ import annotations

import dataclasses
import io
import zipfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from . import licensing, sbom, wheelio


def no_executable(members: Mapping[str, bytes]) -> frozenset[str]:
    return frozenset()


@dataclass(eq=False)
class Finish:
    """What finishing applies to a wheel. `license` None: the license its METADATA states stays (the
    kernel's own, or a memo wheel's, applied before), `license_files` joining it where there are any;
    `sbom` False: no SBOM of ours (a kernel wheel as built)."""

    name: str
    version: str
    kt_version: str
    provenance: sbom.Provenance = field(default_factory=sbom.Provenance)
    license: str | None = None
    license_what: str = ""
    license_files: dict[str, bytes] = field(default_factory=dict)
    sbom: bool = True
    tags: list[str] | None = None

    def changes(self) -> bool:
        return self.license is not None or bool(self.license_files) or self.sbom or self.tags is not None


class Draft:
    """One wheel in memory until it is written (once)."""

    def __init__(
        self,
        filename: str,
        finish: Finish,
        *,
        members: dict[str, bytes] | None = None,
        source: Path | None = None,
        data: bytes | None = None,
        executable: Callable[[Mapping[str, bytes]], frozenset[str]] = no_executable,
    ) -> None:
        assert (members is not None) + (source is not None) + (data is not None) == 1
        self.filename = filename
        self.finish = finish
        self.source = source  # the file it was read from, while unedited
        self._data = data  # its final bytes, while unedited
        self._members = members
        self.executable = executable  # which members are written 0755
        self.stored: frozenset[str] = frozenset()  # members stored as they are (already compressed)

    def __repr__(self) -> str:
        return f"Draft({self.filename!r})"

    def members(self) -> dict[str, bytes]:
        """Its members, to read or edit: from here on it is written from them, finished."""
        if self._members is None:
            raw = self._data if self._data is not None else self.source
            assert raw is not None
            self._members = wheelio.read(raw, self.filename)
        self._data = self.source = None
        return self._members

    def names(self) -> list[str]:
        """Its member names, without taking its members for editing."""
        if self._members is not None:
            return list(self._members)
        with zipfile.ZipFile(io.BytesIO(self._data) if self._data is not None else self.source) as zf:  # type: ignore[arg-type]
            return zf.namelist()

    def finished(self, *, with_sbom: bool | None = None) -> dict[str, bytes]:
        """Its members with the license, the tags and the SBOM applied (a copy: the draft stays editable).
        `with_sbom` False: measured as it stands before its SBOM (the payload's plan of the kernel wheel)."""
        f = self.finish
        m = dict(self.members())
        di = wheelio.dist_info(m)
        expression = f.license
        if expression is None and f.license_files:  # files to add beside a license applied before (a memo wheel)
            expression = licensing.declared(m[f"{di}/METADATA"].decode("utf-8"))
        if expression is not None:
            licensing.apply(m, di, expression, f.license_what or f.name, extra=f.license_files)
        if f.tags is not None:
            wheelio.set_tags(m, f.tags)
        if f.sbom if with_sbom is None else with_sbom:
            prov = dataclasses.replace(f.provenance, grafted=sbom.grafted(m), static=sbom.static(m))
            sbom.add(m, di, f.name, f.version, f.kt_version, prov)
        return m

    def encode(self, *, with_sbom: bool | None = None) -> bytes:
        """Its finished bytes, in memory (to measure it, or to write it)."""
        m = self.finished(with_sbom=with_sbom)
        buf = io.BytesIO()
        wheelio.write_to(buf, m, self.executable(m), self.stored)
        return buf.getvalue()

    def encoded(self, data: bytes) -> None:
        """Its final bytes, already encoded by `encode` (written as they are unless edited again)."""
        self._data = data

    def write(self, out: Path) -> Path:
        """The wheel into `out`, once: its final bytes, its unedited source (nothing to finish), or its
        members finished and encoded."""
        dest = out / self.filename
        if self._data is not None:
            wheelio.write_bytes(dest, self._data)
        elif self.source is not None and not self.finish.changes():
            with self.source.open("rb") as src, wheelio.atomic(dest) as fh:
                while chunk := src.read(1 << 20):
                    fh.write(chunk)
        else:
            m = self.finished()
            wheelio.write(dest, m, self.executable(m), self.stored)
        return dest
