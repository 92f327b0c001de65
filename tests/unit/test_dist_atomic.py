"""dist/ is the previous release or the new one, never a mix or nothing: failures after the
staging is complete (the consistency check, the final rename) leave the previous dist/ byte for
byte; the kernel wheel is placed by one rename, mode 0644, and a failed copy leaves the old one.
The assembly's wheel building is replaced by a stand-in; what is tested is the swap."""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from base import distdir, swap
from carriers import ConsistencyError, load
from carriers import assemble as assembly
from carriers.assemble import Built
from carriers.consistency import Report
from carriers.draft import Draft, Finish
from tests import distkit
from tests.conftest import ROOT


def _previous(dist: Path) -> dict[str, bytes]:
    dist.mkdir()
    (dist / "old-1.0-py3-none-any.whl").write_bytes(b"old wheel")
    (dist / "SHA256SUMS").write_text("old sums\n")
    return {p.name: p.read_bytes() for p in dist.iterdir()}


def _fake_build(tmp: Path) -> object:
    def build_set(cs: object, kernel: Path, out: Path, **_: object) -> list[Built]:
        wheel = out / "new-1.0-py3-none-any.whl"
        wheel.write_bytes(b"new wheel")
        return [
            Built(
                "kt-kernel",
                "1.0",
                "native",
                Draft(wheel.name, Finish("kt-kernel", "1.0", "1.0", sbom=False), source=wheel),
                out,
            )
        ]

    return build_set


def _state(dist: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in dist.iterdir()}


def _stub_building(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The assembly's wheel building and metadata reading replaced: what runs for real is the swap."""
    monkeypatch.setattr(assembly, "build_set", _fake_build(tmp_path))
    monkeypatch.setattr(assembly, "read_metadata", lambda path: ("1.0", []))


def _leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.startswith(".dist."))


def test_a_failed_consistency_check_after_staging_leaves_dist(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    dist = tmp_path / "dist"
    before = _previous(dist)
    _stub_building(tmp_path, monkeypatch)
    monkeypatch.setattr("carriers.consistency.check", lambda cs, meta: Report(("drift",), "", ()))
    with pytest.raises(ConsistencyError, match="drift"):
        assembly.assemble(load(), tmp_path / "k.whl", dist, install_files=False)
    assert _state(dist) == before
    assert _leftovers(tmp_path) == []


@pytest.mark.parametrize("exchange", [True, False], ids=["renameat2-exchange", "two-renames"])
def test_a_failed_swap_puts_the_previous_release_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, exchange: bool
) -> None:
    dist = tmp_path / "dist"
    before = _previous(dist)
    _stub_building(tmp_path, monkeypatch)
    monkeypatch.setattr("carriers.consistency.check", lambda cs, meta: Report((), "torch", ()))
    real = Path.rename

    def rename(self: Path, target: Path) -> Path:
        if self.name.startswith(".dist.kt-") and self.name.endswith(".staging"):
            raise OSError(28, "No space left on device")
        return real(self, target)

    def no_space(a: Path, b: Path) -> bool:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(swap, "exchange", no_space if exchange else lambda a, b: False)
    monkeypatch.setattr(Path, "rename", rename)
    with pytest.raises(OSError, match="No space left"):
        assembly.assemble(load(), tmp_path / "k.whl", dist, install_files=False)
    assert _state(dist) == before
    assert _leftovers(tmp_path) == []


def test_a_successful_assembly_replaces_dist_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    dist = tmp_path / "dist"
    _previous(dist)
    _stub_building(tmp_path, monkeypatch)
    monkeypatch.setattr("carriers.consistency.check", lambda cs, meta: Report((), "torch", ()))
    assembly.assemble(load(), tmp_path / "k.whl", dist, install_files=False)
    assert sorted(_state(dist)) == ["SHA256SUMS", "manifest.json", "new-1.0-py3-none-any.whl"]
    assert _leftovers(tmp_path) == []


def _build_wheel_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("kt_build_wheel", ROOT / "kernel" / "tools" / "build_wheel.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_kernel_wheel_is_placed_by_one_rename_with_mode_0644(tmp_path: Path) -> None:
    bw = _build_wheel_module()
    out = tmp_path / "out"
    out.mkdir()
    (out / "kt_kernel-0.6.0-cp311-cp311-manylinux_2_34_x86_64.whl").write_bytes(b"older")
    new = tmp_path / "kt_kernel-0.6.1-cp311-cp311-manylinux_2_34_x86_64.whl"
    new.write_bytes(b"newer")
    placed = bw.place(new, out)
    assert [p.name for p in out.iterdir()] == [new.name]
    assert placed.read_bytes() == b"newer"
    assert placed.stat().st_mode & 0o777 == 0o644


def test_a_failed_copy_leaves_the_previous_kernel_wheel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bw = _build_wheel_module()
    out = tmp_path / "out"
    out.mkdir()
    old = out / "kt_kernel-0.6.0-cp311-cp311-manylinux_2_34_x86_64.whl"
    old.write_bytes(b"older")
    new = tmp_path / "kt_kernel-0.6.1-cp311-cp311-manylinux_2_34_x86_64.whl"
    new.write_bytes(b"newer")

    def full(*_: object, **__: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(bw.shutil, "copyfileobj", full)
    with pytest.raises(OSError, match="No space left"):
        bw.place(new, out)
    assert [p.name for p in out.iterdir()] == [old.name]
    assert old.read_bytes() == b"older"


def test_shard_builds_never_reach_the_release_input(tmp_path: Path) -> None:
    bw = _build_wheel_module()
    assert bw.output_dir(None, [], []) == bw.RELEASE_OUT.resolve()  # a complete build
    assert bw.output_dir(None, ["avx2"], None) == (bw.SHARDS / "avx2").resolve()
    assert bw.output_dir(None, [], ["90"]) == (bw.SHARDS / "all-cuda-90").resolve()
    with pytest.raises(bw.BuildError, match=r"cannot go to .*build/kt-kernel/out"):
        bw.output_dir(bw.RELEASE_OUT, [], ["90"])
    assert bw.output_dir(tmp_path, ["avx2"], None) == tmp_path.resolve()  # an explicit elsewhere is fine


def test_an_unknown_cuda_arch_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    bw = _build_wheel_module()
    assert bw.policy_archs() == ["80", "86", "89", "90", "120"]
    with pytest.raises(SystemExit) as exc:
        bw.main(["--cuda-arch", "75"])
    assert exc.value.code == 2
    assert "--cuda-arch '75' is not in the release's matrix; valid: 80, 86, 89, 90, 120" in capsys.readouterr().err


def test_a_wheel_is_reused_only_for_identical_inputs(tmp_path: Path) -> None:
    bw = _build_wheel_module()
    digest = bw.inputs_digest([], [])
    assert digest == bw.inputs_digest([], [])
    assert digest != bw.inputs_digest(["avx2"], [])
    assert digest != bw.inputs_digest([], None)
    wheel = tmp_path / "kt_kernel-0.6.1-cp311-cp311-manylinux_2_34_x86_64.whl"
    wheel.write_bytes(b"w")
    assert bw.up_to_date(tmp_path, digest) is None  # no stamp
    (tmp_path / bw.STAMP).write_text(f"{digest} {wheel.name}\n")
    assert bw.up_to_date(tmp_path, digest) is None  # a stamp without the wheel's own sha256
    (tmp_path / bw.STAMP).write_text(bw.stamp_text(digest, wheel))
    assert bw.up_to_date(tmp_path, digest) == wheel
    assert bw.up_to_date(tmp_path, "0" * 64) is None
    wheel.write_bytes(b"x")  # the same size, other bytes: a corrupted wheel is rebuilt, never reused
    assert bw.up_to_date(tmp_path, digest) is None
    wheel.write_bytes(b"w")
    assert bw.up_to_date(tmp_path, digest) == wheel
    (tmp_path / "kt_kernel-0.6.0-cp311-cp311-manylinux_2_34_x86_64.whl").write_bytes(b"old")
    assert bw.up_to_date(tmp_path, digest) is None  # two wheels: not a build of ours


def _manifest(pythons: list[str], **extra: Any) -> distdir.Manifest:
    from locks.targets import serves

    wheels: list[distdir.Wheel] = []
    for c in load().carriers:
        for v in pythons:
            tag = "cp311-abi3" if c.name == "kt-kernel" else f"cp{v.replace('.', '')}-cp{v.replace('.', '')}"
            name = f"{c.name.replace('-', '_')}-1-{tag}-manylinux_2_34_x86_64.whl"
            if serves(name, v) and all(w.filename != name for w in wheels):
                served = tuple(p for p in pythons if serves(name, p))
                wheels.append(distkit.wheel(name, b"", pythons=served))
    fields: dict[str, Any] = {"kt_version": load().kt_version, "pythons": tuple(pythons), "wheels": tuple(wheels)}
    return distdir.Manifest(schema_version=1, torch="", torch_candidates=(), **{**fields, **extra})


def test_a_reused_dist_is_checked_as_a_run_checks_it() -> None:
    cs = load()
    full = list(cs.pythons)
    assembly.check_reused(cs, _manifest(full), None)  # the whole release: reused as it is
    partial = _manifest(full[:1], partial=distdir.Partial(tuple(full[:1]), tuple(full[1:])))
    assembly.check_reused(cs, partial, full[:1])  # a partial one, asked for as such
    with pytest.raises(ConsistencyError, match="it is a partial development release") as e:
        assembly.check_reused(cs, partial, None)  # never reused as the whole release
    assert "nox -s assemble -- --fresh" in str(e.value)
    bumped = _manifest(full, kt_version="0.0.1")
    with pytest.raises(ConsistencyError, match=f"it is KT 0.0.1, the version file says {cs.kt_version}"):
        assembly.check_reused(cs, bumped, None)
    whole = _manifest(full)
    short = dataclasses.replace(whole, wheels=tuple(w for w in whole.wheels if w.name != "sglang-kt"))
    with pytest.raises(ConsistencyError, match="no sglang-kt wheel"):
        assembly.check_reused(cs, short, None)
