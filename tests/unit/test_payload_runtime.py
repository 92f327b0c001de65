"""kt_kernel.payload against a synthetic installed release: round trip, every error
(each naming its fix), concurrency, crash recovery, the warm path. The module is
loaded from the source file, so no native build is needed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import KT_SRC, load_source_module
from tests.payloadkit import FakeRelease, compressible, installed, make_release

payload: Any = load_source_module("kt_payload_under_test", KT_SRC / "payload.py")

FILES = {
    "sgl_kernel/flash_ops.abi3.so": compressible(3 << 20, 1),
    "sgl_kernel/sm90/common_ops.abi3.so": compressible(1 << 20, 2),
    "sgl_kernel/sm100/common_ops.abi3.so": compressible(1 << 20, 3),
    "kt_kernel/cuda/lib/libkt_cuda.so": compressible(300_000, 4),
}


@pytest.fixture
def release(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeRelease:
    return installed(tmp_path, monkeypatch, FILES)


def test_round_trip_keeps_the_wheel_relative_layout(release: FakeRelease, tmp_path: Path) -> None:
    out = payload.materialize(release.manifest)
    assert out == tmp_path / "cache" / release.data()["archive"]["sha256"]
    for name, data in FILES.items():
        assert (out / name).read_bytes() == data
    assert payload.verify(release.manifest) == []
    assert payload.find_manifest() == release.manifest  # found beside sgl_kernel, without importing it
    assert "sgl_kernel" not in sys.modules


def test_warm_path_neither_extracts_nor_hashes(release: FakeRelease, monkeypatch: pytest.MonkeyPatch) -> None:
    first = payload.materialize(release.manifest)

    def boom(*_: object) -> None:
        raise AssertionError("the warm path must not stream the parts again")

    monkeypatch.setattr(payload, "_extract_stream", boom)
    monkeypatch.setattr(payload, "locate_parts", boom)
    assert payload.materialize(release.manifest) == first
    log = (first.parent / "extractions.log").read_text().splitlines()
    assert len(log) == 1


def test_missing_carrier_names_what_to_install(release: FakeRelease) -> None:
    import shutil

    shutil.rmtree(release.dist_info("transformers-kt"))
    with pytest.raises(payload.PayloadError) as exc:
        payload.materialize(release.manifest)
    msg = str(exc.value)
    assert "transformers-kt==5.19.0.post1 (part 4/5) not installed" in msg
    assert "Install transformers-kt==5.19.0.post1, or" in msg  # exactly the missing carrier, then the extra
    assert "kt-kernel==" not in msg  # installed carriers are not asked for again
    assert "ktransformers[serve]==0.6.1" in msg


def test_parts_from_two_releases_name_both_versions(release: FakeRelease) -> None:
    meta = release.dist_info("sglang-kt") / "METADATA"
    meta.write_text(meta.read_text().replace("Version: 0.6.1", "Version: 0.6.0"))
    with pytest.raises(payload.PayloadError, match=r"two releases.*wants sglang-kt==0\.6\.1, but sglang-kt 0\.6\.0"):
        payload.materialize(release.manifest)


def test_corrupted_part_is_named(release: FakeRelease, tmp_path: Path) -> None:
    part = release.parts[2]
    data = bytearray(part.read_bytes())
    data[len(data) // 2] ^= 0xFF
    part.write_bytes(bytes(data))
    with pytest.raises(payload.PayloadError, match=r"corrupted part 3/5 \(sglang-kt 0\.6\.1, sglang/_kt_payload/"):
        payload.materialize(release.manifest)
    cache = tmp_path / "cache"
    assert not list(cache.glob(".tmp-*")), "a failed extraction leaves nothing behind"
    assert not (cache / release.data()["archive"]["sha256"]).exists()


def test_part_truncated_by_one_byte(release: FakeRelease) -> None:
    part = release.parts[4]
    size = part.stat().st_size
    part.write_bytes(part.read_bytes()[:-1])
    with pytest.raises(
        payload.PayloadError,
        match=rf"part 5/5 \(accelerate-kt .* is {size - 1} bytes, the manifest "
        rf"says {size}",
    ):
        payload.materialize(release.manifest)


def test_not_enough_disk_space_says_needed_and_free(
    release: FakeRelease, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    class Usage:
        free = 1 << 20

    monkeypatch.setattr(payload.shutil, "disk_usage", lambda _: Usage())
    with pytest.raises(
        payload.PayloadError,
        match=rf"not enough disk space in {tmp_path / 'cache'}: .* needs 5 MiB, "
        r"1 MiB are free.*KT_KERNEL_CACHE_DIR",
    ):
        payload.materialize(release.manifest)


def test_unwritable_cache_names_path_and_variable(
    release: FakeRelease, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    monkeypatch.setenv("KT_KERNEL_CACHE_DIR", str(blocker / "sub"))
    with pytest.raises(
        payload.PayloadError,
        match=rf"cannot write the CUDA payload cache {blocker / 'sub'}.*"
        "set KT_KERNEL_CACHE_DIR",
    ):
        payload.materialize(release.manifest)


def test_upstream_sgl_kernel_without_manifest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "sgl_kernel").mkdir()
    (tmp_path / "sgl_kernel" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(payload.PayloadError, match="upstream sglang-kernel, not the KT build"):
        payload.find_manifest()


def test_tampered_cache_file_is_reported_by_verify(release: FakeRelease) -> None:
    out = payload.materialize(release.manifest)
    target = out / "sgl_kernel/sm90/common_ops.abi3.so"
    data = bytearray(target.read_bytes())
    data[0] ^= 1
    target.write_bytes(bytes(data))
    problems = payload.verify(release.manifest)
    assert len(problems) == 1
    assert "sgl_kernel/sm90/common_ops.abi3.so: sha256" in problems[0]


def test_truncated_cache_file_is_extracted_again(release: FakeRelease) -> None:
    out = payload.materialize(release.manifest)
    target = out / "sgl_kernel/flash_ops.abi3.so"
    target.write_bytes(target.read_bytes()[:100])
    assert payload.materialize(release.manifest) == out
    assert target.read_bytes() == FILES["sgl_kernel/flash_ops.abi3.so"]


_RUNNER = """
import importlib.util, sys
spec = importlib.util.spec_from_file_location("p", sys.argv[1])
m = importlib.util.module_from_spec(spec); sys.modules["p"] = m; spec.loader.exec_module(m)
print(m.materialize(m.Path(sys.argv[2])))
"""


def _run(release: FakeRelease, env: dict[str, str]) -> subprocess.Popen[str]:
    full = {**os.environ, "PYTHONPATH": str(release.site), **env}
    return subprocess.Popen(
        [sys.executable, "-c", _RUNNER, str(KT_SRC / "payload.py"), str(release.manifest)],
        env=full,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_eight_concurrent_first_uses_extract_once(release: FakeRelease, tmp_path: Path) -> None:
    procs = [_run(release, {"KT_KERNEL_CACHE_DIR": str(tmp_path / "cache")}) for _ in range(8)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1] for o in outs]
    assert len({o[0].strip() for o in outs}) == 1
    log = (tmp_path / "cache" / "extractions.log").read_text().splitlines()
    assert len(log) == 1, log


def test_crash_mid_extraction_then_recovery(release: FakeRelease, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    crashed = _run(release, {"KT_KERNEL_CACHE_DIR": str(cache), "KT_KERNEL_TEST_CRASH_AFTER_MEMBERS": "2"})
    crashed.communicate(timeout=120)
    assert crashed.returncode == 70
    assert list(cache.glob(".tmp-*")), "the crash left a partial extraction"
    assert not (cache / release.data()["archive"]["sha256"]).exists()
    out = payload.materialize(release.manifest, cache)
    assert not list(cache.glob(".tmp-*"))
    assert payload.verify(release.manifest, cache) == []
    assert (out / "kt_kernel/cuda/lib/libkt_cuda.so").read_bytes() == FILES["kt_kernel/cuda/lib/libkt_cuda.so"]


def test_cli_where_before_and_after(release: FakeRelease, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert payload.main(["where", "--manifest", str(release.manifest)]) == 1
    assert "not materialized" in capsys.readouterr().err
    assert payload.main(["materialize", "--manifest", str(release.manifest)]) == 0
    where = capsys.readouterr().out.strip()
    assert payload.main(["where", "--manifest", str(release.manifest)]) == 0
    assert capsys.readouterr().out.strip() == where
    assert payload.main(["verify", "--manifest", str(release.manifest)]) == 0
    assert "4 files match the manifest" in capsys.readouterr().out


def test_a_manifest_the_schema_refuses() -> None:
    import jsonschema

    from tests.payloadkit import validate_manifest

    with pytest.raises(jsonschema.ValidationError, match="'parts' is a required property"):
        validate_manifest({"schema_version": 1, "release": "0.6.1", "provider": {}, "archive": {}, "files": {}})


def test_member_escaping_the_root_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rel = make_release(tmp_path / "site", {"../../evil.so": b"x" * 1000, "sgl_kernel/ok.so": b"y"}, tmp_path / "b")
    monkeypatch.syspath_prepend(str(rel.site))
    with pytest.raises(payload.PayloadError, match=r"member '\.\./\.\./evil\.so' points outside the archive root"):
        payload.materialize(rel.manifest, tmp_path / "cache")
    assert not (tmp_path / "evil.so").exists()
    assert not list((tmp_path / "cache").glob(".tmp-*"))


def test_long_member_names_use_pax_headers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Names past ustar's 100 bytes travel in PAX headers; the runtime's tar reader honours them."""
    name = "sgl_kernel/" + "d" * 120 + "/common_ops.abi3.so"
    rel = make_release(tmp_path / "site", {name: b"z" * 5000}, tmp_path / "b")
    monkeypatch.syspath_prepend(str(rel.site))
    out = payload.materialize(rel.manifest, tmp_path / "cache")
    assert (out / name).read_bytes() == b"z" * 5000


@pytest.mark.parametrize(
    ("shape", "says"),
    [
        ([], "the manifest is a JSON list, not an object"),
        ("text", "the manifest is a JSON str, not an object"),
        ({"files": {"sgl_kernel/a.so": "x"}}, "files['sgl_kernel/a.so'] is a JSON str, not an object"),
        ({"files": {"sgl_kernel/a.so": {"size": "12", "sha256": "0" * 64}}}, "size is '12', not a int"),
        ({"files": {"sgl_kernel/a.so": {"size": True, "sha256": "0" * 64}}}, "size is True, not a int"),
        ({"parts": [7]}, "parts[0] is a JSON int, not an object"),
        ({"archive": []}, "the manifest.archive is [], not a dict"),
        (
            {"files": {"sgl_kernel/a": {"size": 1, "sha256": "0"}, "sgl_kernel/a/b.so": {"size": 1, "sha256": "0"}}},
            "'sgl_kernel/a' is a file and also the directory of 'sgl_kernel/a/b.so'",
        ),
    ],
)
def test_every_malformed_manifest_shape_is_a_payload_error_naming_the_file(
    release: FakeRelease, tmp_path: Path, capsys: pytest.CaptureFixture[str], shape: Any, says: str
) -> None:
    """Each shape the schema refuses is a PayloadError naming the file, the problem and the fix, in the
    library and in the command (exit 2, no traceback)."""
    import json

    data = shape if not isinstance(shape, dict) else {**release.data(), **shape}
    bad = tmp_path / "manifest.json"
    bad.write_text(json.dumps(data))
    with pytest.raises(payload.PayloadError) as exc:
        payload.materialize(bad)
    assert str(bad) in str(exc.value)
    assert says in str(exc.value)
    assert "reinstall sglang-kernel-kt" in str(exc.value)
    assert payload.main(["materialize", "--manifest", str(bad)]) == 2
    assert says in capsys.readouterr().err


def test_a_non_integer_crash_hook_is_a_payload_error(release: FakeRelease, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KT_KERNEL_TEST_CRASH_AFTER_MEMBERS", "two")
    with pytest.raises(payload.PayloadError, match="KT_KERNEL_TEST_CRASH_AFTER_MEMBERS='two' is not an integer"):
        payload.materialize(release.manifest)
    assert not list(Path(os.environ["KT_KERNEL_CACHE_DIR"]).glob(".tmp-*"))


def test_a_file_where_the_cache_entry_belongs_is_named(release: FakeRelease) -> None:
    root = Path(os.environ["KT_KERNEL_CACHE_DIR"])
    root.mkdir(mode=0o700)
    (root / release.data()["archive"]["sha256"]).write_text("not a directory")
    with pytest.raises(payload.PayloadError, match="is not a directory; remove it"):
        payload.materialize(release.manifest)
