"""Wheel (zip) reader: members, RECORD, WHEEL, METADATA, filename tags."""

from __future__ import annotations

import zipfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from packaging.tags import Tag
from packaging.utils import InvalidWheelFilename, NormalizedName, parse_wheel_filename
from packaging.version import Version

from ..errors import AuditError


@dataclass(frozen=True)
class Member:
    name: str
    data: bytes
    mode: int  # unix mode bits from the zip entry
    kind: str = "file"  # "file", "link" (S_IFLNK) or "special" (fifo, device, socket), from the zip entry

    @staticmethod
    def kind_of(external_attr: int) -> str:
        ftype = (external_attr >> 16) & 0o170000
        return "file" if ftype in (0, 0o100000) else "link" if ftype == 0o120000 else "special"

    @property
    def size(self) -> int:
        return len(self.data)


@dataclass(frozen=True)
class WheelFacts:
    path: Path
    name: NormalizedName
    version: Version
    tags: frozenset[Tag]
    members: tuple[Member, ...]
    duplicates: tuple[str, ...]
    dist_info: str

    @property
    def filename(self) -> str:
        return self.path.name

    def member(self, name: str) -> Member | None:
        for m in self.members:
            if m.name == name:
                return m
        return None

    def text(self, name: str) -> str | None:
        m = self.member(name)
        return None if m is None else m.data.decode("utf-8", errors="replace")


def read_wheel(path: Path) -> WheelFacts:
    try:
        name, version, _build, tags = parse_wheel_filename(path.name)
    except InvalidWheelFilename as exc:
        raise AuditError(f"{path}: not a wheel filename ({exc}); audits take built .whl files") from exc
    try:
        with zipfile.ZipFile(path) as zf:
            infos = zf.infolist()
            members = tuple(
                Member(i.filename, zf.read(i), (i.external_attr >> 16) & 0o7777, Member.kind_of(i.external_attr))
                for i in infos
            )
    except (OSError, zipfile.BadZipFile) as exc:
        raise AuditError(f"{path}: cannot read the wheel: {exc}") from exc
    counts = Counter(m.name for m in members)
    dist_infos = sorted({m.name.split("/", 1)[0] for m in members if m.name.split("/", 1)[0].endswith(".dist-info")})
    return WheelFacts(
        path=path, name=name, version=version, tags=frozenset(tags),
        members=tuple(m for m in members if not m.name.endswith("/")),
        duplicates=tuple(sorted(n for n, c in counts.items() if c > 1)),
        dist_info=dist_infos[0] if dist_infos else "",
    )  # fmt: skip
