"""A synthetic installed release for the payload runtime tests: an archive built by the
real packer (carriers/payload.py) from files the test makes, cut into parts, each part
installed as a member of a fake distribution (a .dist-info with METADATA and RECORD)
in a site directory that importlib.metadata finds, plus the manifest beside a fake
sgl_kernel package."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from carriers import payload as packer

SCHEMA = Path(__file__).resolve().parent.parent / "audits" / "schemas" / "payload-manifest.schema.json"


def validate_manifest(manifest: dict[str, Any]) -> None:
    """The manifest against its JSON Schema (audits/schemas/payload-manifest.schema.json)."""
    import jsonschema

    jsonschema.validate(manifest, json.loads(SCHEMA.read_text()))


CARRIERS = (
    ("kt-kernel", "0.6.1", "kt_kernel"),
    ("ktransformers", "0.6.1", "ktransformers"),
    ("sglang-kt", "0.6.1", "sglang"),
    ("transformers-kt", "5.19.0.post1", "transformers"),
    ("accelerate-kt", "1.15.0.post1", "accelerate"),
)


@dataclass(frozen=True)
class FakeRelease:
    site: Path
    manifest: Path
    files: dict[str, bytes]
    parts: list[Path]

    def data(self) -> dict[str, Any]:
        loaded: dict[str, Any] = json.loads(self.manifest.read_text())
        return loaded

    def dist_info(self, distribution: str) -> Path:
        version = next(v for n, v, _ in CARRIERS if n == distribution)
        return self.site / f"{distribution.replace('-', '_')}-{version}.dist-info"


def compressible(size: int, seed: int) -> bytes:
    """Bytes that compress like code: repeated blocks with a little noise."""
    block = hashlib.sha256(str(seed).encode()).digest() * 64
    out = bytearray()
    i = 0
    while len(out) < size:
        out += block + i.to_bytes(8, "little") + os.urandom(8 if i % 7 == 0 else 0)
        i += 1
    return bytes(out[:size])


def install_dist(site: Path, name: str, version: str, files: dict[str, bytes]) -> Path:
    di = site / f"{name.replace('-', '_')}-{version}.dist-info"
    di.mkdir(parents=True, exist_ok=True)
    (di / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n\n")
    rows = []
    for rel, data in files.items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_bytes(data)
        rows.append(f"{rel},,{len(data)}")
    (di / "RECORD").write_text("\n".join([*rows, f"{di.name}/METADATA,,", f"{di.name}/RECORD,,"]) + "\n")
    return di


def make_release(site: Path, files: dict[str, bytes], cache: Path, *, level: int = 3, window: int = 20) -> FakeRelease:
    archive = packer.build_archive(files, level, window, cache)
    n = len(CARRIERS)
    base = archive.size // n
    sizes = [base] * (n - 1) + [archive.size - base * (n - 1)]
    blobs = packer._slices(archive.path, sizes)
    parts: list[dict[str, Any]] = []
    paths = []
    for i, ((name, version, pkg), blob) in enumerate(zip(CARRIERS, blobs, strict=True), 1):
        member = f"{pkg}/_kt_payload/cuda.tar.zst.{i:02d}-of-{n:02d}"
        install_dist(site, name, version, {member: blob})
        paths.append(site / member)
        parts.append(
            {
                "index": i,
                "distribution": name,
                "version": version,
                "member": member,
                "size": len(blob),
                "sha256": hashlib.sha256(blob).hexdigest(),
            }
        )
    manifest = {
        "schema_version": 1,
        "release": "0.6.1",
        "provider": {"distribution": "sglang-kernel-kt", "version": "0.4.10.post1"},
        "archive": {
            "sha256": archive.sha256,
            "size": archive.size,
            "compression": "zstd",
            "format": "tar",
            "level": level,
            "window_log": window,
            "platform": "manylinux_2_34_x86_64",
        },
        "parts": parts,
        "files": archive.files,
    }
    validate_manifest(manifest)
    path = site / "sgl_kernel" / "_kt_payload.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    (site / "sgl_kernel" / "__init__.py").write_text("")
    path.write_text(json.dumps(manifest, indent=1) + "\n")
    return FakeRelease(site, path, dict(files), paths)


def installed(tmp_path: Path, monkeypatch: Any, files: dict[str, bytes]) -> FakeRelease:
    """A synthetic release installed under `tmp_path` on sys.path, the cache in `tmp_path/cache`."""
    rel = make_release(tmp_path / "site", files, tmp_path / "build-cache")
    monkeypatch.syspath_prepend(str(rel.site))
    monkeypatch.setenv("KT_KERNEL_CACHE_DIR", str(tmp_path / "cache"))
    return rel


def release_wheels(out: Path, files: dict[str, bytes], work: Path) -> list[Path]:
    """The same synthetic release as wheels in `out`: the five part carriers and the manifest's
    provider (sglang-kernel-kt, requiring every part carrier exactly), each with a correct RECORD;
    for the audit's payload rules and its fuzz test."""
    from tests.wheelkit import write_wheel

    rel = make_release(work / "site", files, work / "cache")
    tag = "py3-none-manylinux_2_34_x86_64"
    out.mkdir(parents=True, exist_ok=True)

    def wheel(name: str, version: str, members: dict[str, bytes], requires: tuple[str, ...] = ()) -> Path:
        stem = f"{name.replace('-', '_')}-{version}"
        meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\nRequires-Python: >=3.11\n"
        meta += "".join(f"Requires-Dist: {r}\n" for r in requires)
        members = {
            **members,
            f"{stem}.dist-info/METADATA": meta.encode(),
            f"{stem}.dist-info/WHEEL": (
                f"Wheel-Version: 1.0\nGenerator: payloadkit\nRoot-Is-Purelib: false\nTag: {tag}\n"
            ).encode(),
        }
        return write_wheel(out / f"{stem}-{tag}.whl", members)

    made = []
    for (name, version, pkg), part in zip(CARRIERS, rel.parts, strict=True):
        member = part.relative_to(rel.site).as_posix()
        made.append(wheel(name, version, {f"{pkg}/__init__.py": b"", member: part.read_bytes()}))
    pins = tuple(f"{n}=={v}" for n, v, _ in CARRIERS)
    made.append(
        wheel(
            "sglang-kernel-kt",
            "0.4.10.post1",
            {"sgl_kernel/__init__.py": b"", "sgl_kernel/_kt_payload.json": rel.manifest.read_bytes()},
            (*pins, "zstandard>=0.22"),
        )
    )
    return made
