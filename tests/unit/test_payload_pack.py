"""The packer: what goes into the archive, how parts are sized by the budget, how part
carriers are retagged, that the archive is deterministic and cached, and that the
carrier set's closure pulls every part wherever sgl_kernel can be imported."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from carriers import payload
from carriers.consistency import payload_closure
from carriers.errors import ConsistencyError
from carriers.graph import Graph
from carriers.model import load

MiB = 1 << 20


def test_only_large_matching_members_go_into_the_archive() -> None:
    members = {
        "sgl_kernel/flash_ops.abi3.so": b"x" * (2 * MiB),
        "sgl_kernel/sm90/common_ops.abi3.so": b"y" * MiB,
        "sgl_kernel/spatial_ops.abi3.so": b"z" * 1000,
        "sgl_kernel/__init__.py": b"w" * (3 * MiB),
        "triton_kernels/big.so": b"v" * (3 * MiB),
    }
    taken = payload.take_archived(members, ("sgl_kernel/*.so", "sgl_kernel/*/*.so"), MiB)
    assert sorted(taken) == ["sgl_kernel/flash_ops.abi3.so", "sgl_kernel/sm90/common_ops.abi3.so"]
    assert sorted(members) == ["sgl_kernel/__init__.py", "sgl_kernel/spatial_ops.abi3.so", "triton_kernels/big.so"]


def test_parts_fill_every_wheel_to_one_size_and_sum_to_the_archive() -> None:
    bases = [("a", 1 * MiB), ("b", 0), ("c", 40 * MiB), ("d", 12 * MiB), ("e", MiB // 2)]
    sizes = payload.plan_parts(170 * MiB + 7, bases, 100 * MiB, 4 * MiB)
    assert sum(sizes) == 170 * MiB + 7
    totals = [b + s for (_, b), s in zip(bases, sizes, strict=True)]
    assert max(totals) - min(totals) <= 8, totals  # every wheel ends at the same size
    assert max(totals) <= 96 * MiB
    assert sizes[2] == min(sizes), "the wheel with the most content gets the smallest part"


def test_a_wheel_fuller_than_the_level_still_gets_a_part() -> None:
    sizes = payload.plan_parts(10 * MiB, [("a", 0), ("b", 80 * MiB)], 100 * MiB, 4 * MiB)
    assert sizes[1] >= 1
    assert sum(sizes) == 10 * MiB


def test_archive_too_large_for_the_budget_is_refused() -> None:
    with pytest.raises(ConsistencyError, match=r"does not fit: the 2 part carriers have .* raise size.wheel_budget"):
        payload.plan_parts(300 * MiB, [("a", 0), ("b", 0)], 100 * MiB, 4 * MiB)
    with pytest.raises(ConsistencyError, match=r"no room for an archive part in b \(97.0 MiB\)"):
        payload.plan_parts(MiB, [("a", 0), ("b", 97 * MiB)], 100 * MiB, 4 * MiB)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("ktransformers-0.6.1-py3-none-any.whl", ["py3-none-manylinux_2_34_x86_64"]),
        ("kt_kernel-0.6.1-cp311-cp311-manylinux_2_34_x86_64.whl", ["cp311-cp311-manylinux_2_34_x86_64"]),
        ("x-1-cp310-abi3-manylinux2014_x86_64.whl", ["cp310-abi3-manylinux_2_34_x86_64"]),  # floor raised
    ],
)
def test_part_carriers_take_the_archive_platform(name: str, expected: list[str]) -> None:
    assert payload.retag(name, "manylinux_2_34_x86_64") == expected


def test_archive_platform_is_the_newest_glibc_floor() -> None:
    wheels = [Path("a-1-cp310-abi3-manylinux2014_x86_64.whl"), Path("b-1-cp311-cp311-manylinux_2_34_x86_64.whl")]
    assert payload.archive_platform(wheels) == "manylinux_2_34_x86_64"


def test_archive_is_deterministic_and_built_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    entries = {"b/x.so": b"B" * 100_000, "a/y.so": bytes(range(256)) * 100}
    one = payload.build_archive(entries, 3, 20, tmp_path / "one")
    two = payload.build_archive(dict(reversed(entries.items())), 3, 20, tmp_path / "two")
    assert one.sha256 == two.sha256 == hashlib.sha256(one.path.read_bytes()).hexdigest()
    assert one.path.read_bytes() == two.path.read_bytes()
    capsys.readouterr()
    again = payload.build_archive(entries, 3, 20, tmp_path / "one")
    assert "reused" in capsys.readouterr().out
    assert again.path == one.path


def test_the_carrier_set_pulls_every_part_wherever_sgl_kernel_can_be_imported() -> None:
    cs = load()
    versions = {c.name: "1" for c in cs.carriers}
    requires = {c.name: [] for c in cs.carriers}  # type: dict[str, list[str]]
    requires["sglang-kt"] = ["sglang-kernel-kt==1"]
    requires["ktransformers"] = ['sglang-kt==1; extra == "serve"', 'transformers-kt==1; extra == "sft"']
    requires["sglang-kernel-kt"] = [f"{c.name}=={versions[c.name]}" for c in cs.part_carriers]
    problems, roots = payload_closure(cs, requires)
    assert problems == []
    assert {"sglang-kt", "ktransformers[serve]", "sglang-kernel-kt"} <= set(roots)
    assert "ktransformers[sft]" not in roots, "an SFT-only install never needs the payload"
    assert "sglang-kernel-kt" not in Graph(requires).reach("ktransformers[sft]")
    requires["sglang-kernel-kt"] = requires["sglang-kernel-kt"][:-1]
    problems, _ = payload_closure(cs, requires)
    assert problems
    assert all("accelerate-kt" in p for p in problems)


def test_a_kernel_only_change_recompresses_only_its_own_frame(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    sgl = {"sgl_kernel/flash_ops.abi3.so": bytes(range(256)) * 4000}
    first = payload.build_archive({**sgl, "kt_kernel/cuda/lib/libkt_cuda.so": b"v1" * 1000}, 3, 20, tmp_path)
    capsys.readouterr()
    compressed: list[str] = []
    real = payload._compressor

    def spy(level: int, window: int) -> object:
        compressed.append("frame")
        return real(level, window)

    monkeypatch.setattr(payload, "_compressor", spy)
    second = payload.build_archive({**sgl, "kt_kernel/cuda/lib/libkt_cuda.so": b"v2" * 1000}, 3, 20, tmp_path)
    out = capsys.readouterr().out
    assert "sgl_kernel/: 1 files, frame" in out
    assert "reused" in out
    assert "sgl_kernel/: compressing" not in out
    assert len(compressed) == 2, "the kt_kernel frame and the end marker, never sgl_kernel's"
    assert first.sha256 != second.sha256
    assert second.files["sgl_kernel/flash_ops.abi3.so"] == first.files["sgl_kernel/flash_ops.abi3.so"]


def test_a_shard_kernel_build_is_refused_naming_what_is_missing() -> None:
    from audits.policy import load_policy

    pol = load_policy()
    full = {
        "variants": {v.name: {} for v in pol.variants},
        "cuda": {
            "files": {lib.member: {"sass": sorted(lib.sass), "ptx": sorted(lib.ptx)} for lib in pol.cuda_libraries}
        },
    }
    assert payload.check_kernel_coverage(full, pol) == []
    shard = {"variants": {"avx2": {}}, "cuda": {"files": {"lib/libkt_cuda.so": {"sass": ["sm_75"], "ptx": []}}}}
    problems = payload.check_kernel_coverage(shard, pol)
    assert any("'amx'" in p and "not built" in p for p in problems)
    assert any("lib/libkt_cuda.so lacks" in p and "sm_80" in p for p in problems)
    assert any("sm90a/libkt_cuda_sm90a.so is not built" in p for p in problems)


def test_the_cache_keeps_the_most_recently_used_archives(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each kernel change makes a new whole archive; the cache (shared between checkouts by the tests)
    keeps ARCHIVES_KEPT of them, the most recently used, and every frame."""
    monkeypatch.setattr(payload, "_describe", lambda entries: {n: {} for n in entries})
    theirs = tmp_path / "archive-backup.tar.zst"  # a name build_archive never writes
    theirs.write_bytes(b"a user's file")
    made = []
    for i in range(payload.ARCHIVES_KEPT + 2):
        made.append(payload.build_archive({f"kt_kernel/lib{i}.so": bytes([i]) * 1000}, 3, 20, tmp_path).path)
    assert sorted(tmp_path.glob("archive-*.tar.zst")) == sorted([theirs, *made[-payload.ARCHIVES_KEPT :]])
    payload.build_archive({"kt_kernel/lib0.so": bytes([0]) * 1000}, 3, 20, tmp_path)  # the oldest, made again
    kept = sorted(p for p in tmp_path.glob("archive-*.tar.zst") if p != theirs)
    assert len(kept) == payload.ARCHIVES_KEPT
    assert theirs.read_bytes() == b"a user's file"
    assert made[0] in kept
    assert made[-payload.ARCHIVES_KEPT] not in kept
    assert len(list(tmp_path.glob("frame-*.zst"))) == payload.ARCHIVES_KEPT + 2


def test_a_cached_frame_or_archive_with_other_bytes_is_dropped_and_made_again(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Other bytes under a frame's name (or its record's) never become the release's CUDA archive: the frame is
    checked against the sha256 its record claims before use, the archive against its frames."""
    entries = {"sgl_kernel/x.so": bytes(range(256)) * 400, "kt_kernel/y.so": b"y" * 5000}
    clean = payload.build_archive(entries, 3, 20, tmp_path / "clean")
    cache = tmp_path / "cache"
    first = payload.build_archive(entries, 3, 20, cache)
    assert first.sha256 == clean.sha256
    frame = sorted(cache.glob("frame-*.zst"))[0]
    planted = payload._compressor(3, 20).compress(b"someone else's bytes".ljust(512, b"\0"))
    frame.write_bytes(planted)
    capsys.readouterr()
    again = payload.build_archive(entries, 3, 20, cache)
    out = capsys.readouterr().out
    assert out.count("does not match its record") == 1
    assert again.sha256 == clean.sha256
    assert hashlib.sha256(again.path.read_bytes()).hexdigest() == clean.sha256
    again.path.write_bytes(b"tampered" + again.path.read_bytes()[8:])
    third = payload.build_archive(entries, 3, 20, cache)
    assert "does not hash to its frames' sha256" in capsys.readouterr().out
    assert hashlib.sha256(third.path.read_bytes()).hexdigest() == third.sha256 == clean.sha256
    record = sorted(cache.glob("frame-*.json"))[0]
    record.write_text("{not json")
    assert payload.build_archive(entries, 3, 20, cache).sha256 == clean.sha256


def test_every_tool_that_shapes_a_frame_is_in_its_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A new cuobjdump (or compressor) makes the frame again: the old tool's SASS/PTX description never ships."""
    tools = {"zstandard": "z", "cuobjdump": "cuobjdump 13.0"}
    monkeypatch.setattr(payload, "_describe", lambda entries: {n: {"by": tools["cuobjdump"]} for n in entries})
    monkeypatch.setattr(payload, "_tools", lambda: dict(tools))
    entries = {"sgl_kernel/x.so": b"x" * 1000}
    assert payload.build_archive(entries, 3, 20, tmp_path).files["sgl_kernel/x.so"]["by"] == "cuobjdump 13.0"
    tools["cuobjdump"] = "cuobjdump 13.1"
    assert payload.build_archive(entries, 3, 20, tmp_path).files["sgl_kernel/x.so"]["by"] == "cuobjdump 13.1"
    tools["zstandard"] = "z2"
    before = set(tmp_path.glob("frame-*.zst"))
    payload.build_archive(entries, 3, 20, tmp_path)
    assert len(set(tmp_path.glob("frame-*.zst")) - before) == 1


def test_a_payload_cache_others_can_write_is_refused(tmp_path: Path) -> None:
    """Whoever can write the folder can plant a frame and a record that agree: such a folder is never read."""
    from base.cachedir import CacheError

    cache = tmp_path / "payload"
    cache.mkdir(mode=0o777)
    cache.chmod(0o777)
    with pytest.raises(CacheError, match=r"payload: the payload cache is writable by others"):
        payload.build_archive({"sgl_kernel/x.so": b"x" * 1000}, 3, 20, cache)
    assert list(cache.iterdir()) == []
