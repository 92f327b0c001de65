"""Publishing to a real index server (pypiserver on 127.0.0.1): computed order,
hash verification, idempotent re-run, and the conflicting-file hard error."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from base import stagecache
from release.publish import PublishError, publish, upload_order
from tests.wheelkit import pure_wheel_members, write_wheel


def _dist(tmp_path: Path, marker: str = "1", specs: dict[str, tuple[str, ...]] | None = None) -> Path:
    """A three-wheel release: top -> mid -> base (and top -> base), unless `specs` says otherwise."""
    dist = tmp_path / f"dist{marker}"
    dist.mkdir()
    specs = specs or {
        "base_kt": (),
        "mid_kt": ("base-kt==1.0",),
        "top_kt": ('mid-kt==1.0; extra == "x"', "base-kt==1.0"),
    }
    wheels = []
    for name, reqs in specs.items():
        m = pure_wheel_members(name, "1.0", requires=reqs)
        m[f"{name}/__init__.py"] = f"MARK = {marker!r}\n".encode()
        path = write_wheel(dist / f"{name}-1.0-py3-none-any.whl", m)
        wheels.append(
            {
                "name": name.replace("_", "-"),
                "filename": path.name,
                "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
            }
        )
    manifest: dict[str, object] = {"schema_version": 1, "wheels": wheels}
    (dist / "manifest.json").write_text(json.dumps(manifest))
    (dist / "SHA256SUMS").write_text("".join(f"{w['sha256']}  {w['filename']}\n" for w in wheels))
    # the release verdict publish requires (release/report.py writes it after every check passed)
    manifest["release"] = {"verdict": "PASSED", "publishable": True, "dist_sha256": stagecache.dist_sha256(dist)}
    (dist / "manifest.json").write_text(json.dumps(manifest))
    return dist


def test_order_is_computed_from_requirements(tmp_path: Path) -> None:
    """Names chosen so that the dependency order is neither alphabetical nor its reverse."""
    specs = {
        "m_base": (),
        "a_mid": ("m-base==1.0",),
        "z_top": ('a-mid==1.0; extra == "x"', "m-base==1.0"),
        "b_leaf": ("z-top==1.0",),
    }
    dist = _dist(tmp_path, "o", specs)
    for given in (sorted(p.name for p in dist.glob("*.whl")), sorted(p.name for p in dist.glob("*.whl"))[::-1]):
        names = [f.split("-")[0] for f in upload_order(dist, given)]
        assert names == ["m_base", "a_mid", "z_top", "b_leaf"]


def test_fresh_then_idempotent(index: tuple[str, Path], tmp_path: Path) -> None:
    url, packages = index
    dist = _dist(tmp_path)
    first = publish(dist, url, url + "simple/", wait_s=30, twine_args=("-u", "kt", "-p", "kt"))
    assert [f for f, _ in first] == upload_order(dist, [p.name for p in dist.glob("*.whl")])
    assert {what for _, what in first} == {"uploaded, verified"}
    assert sorted(p.name for p in packages.iterdir()) == sorted(p.name for p in dist.glob("*.whl"))
    again = publish(dist, url, url + "simple/", wait_s=30, twine_args=("-u", "kt", "-p", "kt"))
    assert {what for _, what in again} == {"already published, identical"}


def test_same_name_different_bytes_is_a_hard_error(index: tuple[str, Path], tmp_path: Path) -> None:
    url, packages = index
    other = _dist(tmp_path, marker="2")
    shutil.copy(other / "mid_kt-1.0-py3-none-any.whl", packages)  # an older build already on the index
    dist = _dist(tmp_path, marker="1")
    with pytest.raises(PublishError, match=r"mid_kt-1\.0-py3-none-any\.whl is already on .* with different content"):
        publish(dist, url, url + "simple/", wait_s=30, twine_args=("-u", "kt", "-p", "kt"))
    assert sorted(p.name for p in packages.iterdir()) == ["base_kt-1.0-py3-none-any.whl", "mid_kt-1.0-py3-none-any.whl"]


def test_cli_reports_unreachable_index(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "release.publish",
            "--repository-url",
            "http://127.0.0.1:9/",
            "--dist",
            str(_dist(tmp_path)),
            "--wait",
            "1",
        ],
        capture_output=True,
        text=True,
        check=False,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert proc.returncode == 1
    assert "cannot reach the index" in proc.stderr


def test_a_requirement_cycle_is_uploaded_as_one_group_after_its_dependencies(tmp_path: Path) -> None:
    """sglang-kt -> sglang-kernel-kt -> (every part carrier, sglang-kt among them): no CycleError;
    the cycle's members go together, after what they require and before what requires them."""
    dist = _dist(
        tmp_path,
        "c",
        {
            "a_part": (),
            "loop_b": ("loop-a==1.0", "a-part==1.0"),
            "loop_a": ("loop-b==1.0",),
            "z_user": ("loop-a==1.0",),
        },
    )
    order = upload_order(dist, sorted(p.name for p in dist.glob("*.whl"))[::-1])
    names = [f.split("-")[0] for f in order]
    assert names == ["a_part", "loop_a", "loop_b", "z_user"]


def test_every_python_wheel_of_a_distribution_is_uploaded(tmp_path: Path) -> None:
    """kt-kernel ships one wheel per Python: both go up, at kt-kernel's place in the order."""
    dist = _dist(tmp_path, "p", {"base_kt": (), "top_kt": ("base-kt==1.0",)})
    (cp311,) = dist.glob("base_kt-*.whl")
    shutil.copy(cp311, dist / "base_kt-1.0-cp312-cp312-manylinux_2_28_x86_64.whl")
    cp311.rename(dist / "base_kt-1.0-cp311-cp311-manylinux_2_28_x86_64.whl")
    order = upload_order(dist, sorted(p.name for p in dist.glob("*.whl"))[::-1])
    assert order == [
        "base_kt-1.0-cp311-cp311-manylinux_2_28_x86_64.whl",
        "base_kt-1.0-cp312-cp312-manylinux_2_28_x86_64.whl",
        "top_kt-1.0-py3-none-any.whl",
    ]
