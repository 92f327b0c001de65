"""Build test artifacts from source: shared libraries (gcc) and wheels with a
correct RECORD, so that each negative test injects exactly one defect."""

from __future__ import annotations

import base64
import hashlib
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest
from packaging.utils import parse_wheel_filename


def record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def read_members(wheel: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(wheel) as zf:
        return {i.filename: zf.read(i) for i in zf.infolist() if not i.filename.endswith("/")}


def write_wheel(path: Path, members: dict[str, bytes], *, regenerate_record: bool = True) -> Path:
    """Write `members` as a wheel; RECORD is rebuilt from them unless told not to."""
    members = dict(members)
    dist_info = next(n.split("/")[0] for n in members if n.split("/")[0].endswith(".dist-info"))
    record = f"{dist_info}/RECORD"
    if regenerate_record:
        rows = [f"{n},{record_hash(d)},{len(d)}" for n, d in sorted(members.items()) if n != record]
        members[record] = ("\n".join([*rows, f"{record},,"]) + "\n").encode()
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for n in sorted(members):
            info = zipfile.ZipInfo(n, (2020, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED  # a ZipInfo defaults to stored
            zf.writestr(info, members[n])
    return path


def retag(members: dict[str, bytes], old: str, new: str) -> dict[str, bytes]:
    """Change the platform tag in WHEEL (the filename is the caller's)."""
    out = dict(members)
    for n, data in members.items():
        if n.endswith(".dist-info/WHEEL"):
            out[n] = data.replace(old.encode(), new.encode())
    return out


def pure_wheel_members(
    name: str = "demo_pkg",
    version: str = "1.0",
    *,
    requires: tuple[str, ...] = (),
    requires_python: str | None = ">=3.10",
    license: str | None = "MIT",
) -> dict[str, bytes]:
    """A clean pure wheel's members; `license`: its License-Expression and a licenses/LICENSE (None: neither)."""
    di = f"{name}-{version}.dist-info"
    meta = f"Metadata-Version: 2.4\nName: {name.replace('_', '-')}\nVersion: {version}\n"
    if license:
        meta += f"License-Expression: {license}\nLicense-File: LICENSE\n"
    if requires_python:
        meta += f"Requires-Python: {requires_python}\n"
    meta += "".join(f"Requires-Dist: {r}\n" for r in requires)
    members = {
        f"{name}/__init__.py": b"VALUE = 1\n",
        f"{di}/METADATA": meta.encode(),
        f"{di}/WHEEL": b"Wheel-Version: 1.0\nGenerator: wheelkit\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    if license:
        members[f"{di}/licenses/LICENSE"] = f"{license} license text of {name}\n".encode()
    return members


def compile_so(tmp: Path, name: str, source: str, *flags: str, lang: str = "c") -> bytes:
    """Compile `source` into a shared object and return its bytes."""
    cc = shutil.which("gcc")
    if cc is None:
        pytest.fail("gcc is required to build the audit fixtures")
    src = tmp / f"{name}.{'S' if lang == 'asm' else 'c'}"
    src.write_text(source)
    out = tmp / name
    proc = subprocess.run(
        [cc, "-shared", "-fPIC", "-O2", "-o", str(out), str(src), *flags], capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        pytest.fail(f"compiling fixture {name} failed:\n{proc.stderr}")
    return out.read_bytes()


def python_sibling(wheel: Path, out: Path, python: str = "cp312") -> Path:
    """TEST FIXTURE, not a build: the kt-kernel wheel relabelled for another CPython (tags, WHEEL,
    extension suffix, RECORD), so the several-wheels-per-release path runs where only one
    interpreter exists. Its extension is still the cp311 binary: never install it. CI builds the
    real cp312 wheel (release.yml, kernel matrix)."""
    tags = parse_wheel_filename(wheel.name)[3]
    here = {t.interpreter for t in tags}
    assert len(here) == 1, f"{wheel.name}: expected one interpreter tag"
    (old,) = here
    (abi,) = {t.abi for t in tags}
    new_abi = "abi3" if abi == "abi3" else python  # cp311-abi3 -> cp312-abi3; cp311-cp311 -> cp312-cp312
    members = {}
    for name, data in read_members(wheel).items():
        new = name.replace(f".cpython-{old[2:]}-", f".cpython-{python[2:]}-")
        tag = (f"Tag: {old}-{abi}-".encode(), f"Tag: {python}-{new_abi}-".encode())
        members[new] = data.replace(*tag) if name.endswith(".dist-info/WHEEL") else data
    out.mkdir(parents=True, exist_ok=True)
    return write_wheel(out / wheel.name.replace(f"-{old}-{abi}-", f"-{python}-{new_abi}-"), members)
