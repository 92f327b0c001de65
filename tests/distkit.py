"""Release directories for tests, written through the contract's own writer (base.distdir.write), so a
test's dist/ is a dist/ every stage can open: the files, SHA256SUMS and a valid manifest.json."""

from __future__ import annotations

import dataclasses
import hashlib
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name, parse_wheel_filename

from base import distdir


def wheel(filename: str, data: bytes, **fields: Any) -> distdir.Wheel:
    """The record of a wheel file holding `data` (name and version from its filename)."""
    name, version, _, _ = parse_wheel_filename(filename)
    base = {
        "name": str(canonicalize_name(name)),
        "version": str(version),
        "kind": "native",
        "filename": filename,
        "sha256": hashlib.sha256(data).hexdigest(),
        "size": len(data),
        "pythons": ("3.11",),
        "inputs": (),
        "patches": (),
    }
    return distdir.Wheel(**{**base, **fields})


def install_file(path: str, text: str) -> distdir.InstallFile:
    """The record of install/PROFILE-cp3NN.txt or install/pylock.PROFILE-cp3NN.toml holding `text`."""
    m = re.fullmatch(r"install/(pylock\.)?([a-z0-9-]+)-cp3(\d+)\.(txt|toml)", path)
    assert m, path
    fmt = "pylock" if m.group(1) else "requirements"
    digest = hashlib.sha256(text.encode()).hexdigest()
    return distdir.InstallFile(m.group(2), f"3.{m.group(3)}", path, fmt, digest)  # type: ignore[arg-type]


def make_release(
    dist: Path,
    wheels: Mapping[str, bytes] | None = None,
    install: Mapping[str, str] | None = None,
    records: Mapping[str, Mapping[str, Any]] | None = None,
    **members: Any,
) -> distdir.Manifest:
    """dist/ with these wheel files (filename -> bytes; `records`: filename -> fields of its record to
    override), install files (path -> text) and manifest members; SHA256SUMS and manifest.json written
    by base.distdir.write. Returns the manifest."""
    wheels = {"a-1-py3-none-any.whl": b"a"} if wheels is None else wheels
    dist.mkdir(parents=True, exist_ok=True)
    described = []
    for filename, data in wheels.items():
        (dist / filename).write_bytes(data)
        described.append(wheel(filename, data, **(records or {}).get(filename, {})))
    files = []
    for path, text in (install or {}).items():
        (dist / path).parent.mkdir(parents=True, exist_ok=True)
        (dist / path).write_bytes(text.encode())
        files.append(install_file(path, text))
    fields: dict[str, Any] = {
        "schema_version": 1,
        "kt_version": "1.0",
        "pythons": ("3.11",),
        "torch": "",
        "torch_candidates": (),
        "wheels": tuple(described),
        "install": tuple(files) if install is not None else None,
        **members,
    }
    manifest = distdir.Manifest(**fields)
    distdir.write(dist, manifest)
    return manifest


def rewrite(dist: Path, **members: Any) -> distdir.Manifest:
    """manifest.json rewritten with these members changed (SHA256SUMS as it was)."""
    manifest = dataclasses.replace(distdir.read_manifest(dist / distdir.MANIFEST), **members)
    (dist / distdir.MANIFEST).write_text(distdir.manifest_text(manifest))
    return manifest


def judged(dist: Path, evidence_dir: Path, *, record: bool = True) -> Any:
    """Every check's evidence of a passing release for `dist` (an audit report of exactly its wheels, no known
    vulnerability, each Python's interpreter, venv runs, resolutions and published install files, in
    `evidence_dir`), and, with `record`, the verdict judged from it written into manifest.json as
    release_report writes it. Returns the verdict."""
    import json

    from base import evidence
    from locks.read import install_profiles
    from release import judge as judging
    from verify.registry import run_name, venv_runs

    release = distdir.open_release(dist)
    key = release.key()
    manifest = release.manifest
    audit = {
        "passed": True,
        "findings": [],
        "wheels": [{"filename": w.filename, "sha256": w.sha256, "errors": 0} for w in manifest.wheels],
    }
    (dist / "audit-report.json").write_text(json.dumps(audit))
    (dist / "vulnerabilities.json").write_text(json.dumps({"asked": 1, "found": [], "waived": [], "not_checked": {}}))
    stamp = {"dist_sha256": key, "outcome": "ran", "produced": "now"}
    published = {(f.profile, f.python): f for f in manifest.install or () if f.format == "requirements"}
    for python in manifest.pythons:
        found = {
            "interpreter": {"version": f"{python}.0", "source": "PATH", "path": f"/usr/bin/python{python}", "root": ""},
            "dist_sha256": key,
        }
        evidence.update(python, build=evidence_dir, interpreter=found)
        for profile, on in venv_runs([python]):
            result: dict[str, Any] = {**stamp, "run": run_name(profile, on)}
            if (profile, on) in published:
                f = published[(profile, on)]
                result["install_file"] = {"file": f.file, "sha256": f.sha256}
            evidence.update(python, build=evidence_dir, section="profiles", name=profile, result=result)
        for profile in install_profiles():
            ok = {**stamp, "profile": profile, "python": python, "problems": [], "not_verified": "", "ok": True}
            evidence.update(python, build=evidence_dir, section="resolution", name=profile, result=ok)
    verdict = judging.judge(judging.collect(dist, key, evidence_dir, manifest))
    if record:
        distdir.record_verdict(dist, {**verdict.as_dict(), "dist_sha256": key, "judged": "now"})
    return verdict
