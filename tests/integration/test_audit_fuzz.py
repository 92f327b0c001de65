"""The audit never crashes on its input: seeded mutants of real wheels (the kt-kernel wheel, a
small payload release made by the real packer, a pure wheel) each end in exit 0 or 1 with a
report, never 2 or 3, never a traceback, within bounded time and memory; and the nested-archive
bombs (kt-kernel's tar.xz, the release's zstd parts) are refused within 256 MiB of memory and of
any temporary file."""

from __future__ import annotations

import hashlib
import json
import lzma
import os
import resource
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import zstandard

from tests.conftest import ROOT
from tests.fuzzkit import compressed_bomb, mutants
from tests.payloadkit import compressible, release_wheels
from tests.wheelkit import pure_wheel_members, read_members, write_wheel

MUTANTS_PER_SEED = {"kt": 200, "release": 40, "pure": 60}  # 200 + 6 x 40 + 60 = 500
LIMIT = 256 << 20  # peak RSS and the largest temporary file, per audit run
SECONDS_PER_MUTANT = 20.0


def _limited(rss: int = 4 << 30, fsize: int = LIMIT) -> Any:
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (rss, rss))
        resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))

    return apply


def _audit_dirs(dirs: list[Path], work: Path, timeout: int) -> dict[str, Any]:
    """Audit every directory in one child process (address space 4 GiB, no file over 256 MiB)."""
    todo, result = work / "todo.json", work / "result.json"
    todo.write_text(json.dumps([str(d) for d in dirs]))
    env = {**os.environ, "TMPDIR": str(work / "tmp")}
    (work / "tmp").mkdir(exist_ok=True)
    proc = subprocess.run(
        [sys.executable, "-m", "tests.fuzzkit", str(todo), str(result)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        preexec_fn=_limited(),
        check=False,
    )
    assert proc.returncode == 0, f"the fuzz driver itself died ({proc.returncode}):\n{proc.stderr[-3000:]}"
    data: dict[str, Any] = json.loads(result.read_text())
    return data


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory, kt_wheel: Path) -> dict[str, list[Path]]:
    work = tmp_path_factory.mktemp("fuzz-src")
    files = {
        "sgl_kernel/sm90/libflash.so": compressible(300_000, 1),
        "sgl_kernel/sm100/libflash.so": compressible(200_000, 2),
        "kt_kernel/cuda/lib/libkt_cuda.so": compressible(150_000, 3),
    }
    release = release_wheels(work / "release", files, work / "build")
    members = pure_wheel_members("demo_pkg", requires=("numpy>=1.26",))
    members["demo_pkg/meta.py"] = b"from importlib.metadata import version\nV = version('numpy')\n"
    members["demo_pkg/data.json"] = json.dumps({"a": [1, 2, {"b": None}]}).encode()
    pure = write_wheel(work / "demo_pkg-1.0-py3-none-any.whl", members)
    return {"kt": [kt_wheel], "release": release, "pure": [pure]}


def test_500_mutants_never_crash_the_audit(sources: dict[str, list[Path]], tmp_path: Path) -> None:
    made = []
    for group, wheels in sources.items():
        for w in wheels:
            siblings = tuple(s for s in wheels if s != w)
            made += list(mutants(w, tmp_path / "m", 7, MUTANTS_PER_SEED[group], siblings))
    assert len(made) >= 500
    dirs = [m.path.parent for m in made]
    result = _audit_dirs(dirs, tmp_path, timeout=1200)
    runs = {r["dir"]: r for r in result["runs"]}
    crashed = [
        f"{m.kind} {m.origin} ({m.detail}): exit {runs[m.path.parent.name]['status']}\n"
        f"{runs[m.path.parent.name]['error']}"
        for m in made
        if runs[m.path.parent.name]["status"] not in (0, 1)
    ]
    assert not crashed, f"{len(crashed)} of {len(made)} mutants crashed the audit:\n" + "\n".join(crashed[:5])
    assert all(r["report"] for r in runs.values()), "a run ended without writing its JSON report"
    slow = [(d, r["seconds"]) for d, r in runs.items() if r["seconds"] > SECONDS_PER_MUTANT]
    assert not slow, f"mutants over {SECONDS_PER_MUTANT}s: {slow[:5]}"
    assert result["peak_rss"] < 1 << 30, f"peak RSS {result['peak_rss'] / 2**20:.0f} MiB over 1 GiB"
    # The mutants are defects the audit sees: most fail it, with the rules their kinds aim at.
    failed = Counter(m.kind for m in made if runs[m.path.parent.name]["status"] == 1)
    assert sum(failed.values()) >= 0.6 * len(made), f"too few mutants failed the audit: {failed}"
    rules: Counter[str] = Counter()
    for d in {m.path.parent for m in made}:
        rules.update({f["rule"] for f in json.loads((d / "report.json").read_text())["findings"]})
    for rule in ("wheel.unreadable", "wheel.record-mismatch", "payload.part-mismatch", "payload.manifest"):
        assert rules[rule], f"no mutant was reported under {rule}: {rules}"


def _rss_and_status(where: Path, work: Path) -> tuple[int, int, dict[str, Any]]:
    """Audit `where` alone in a child process limited to 256 MiB files; its peak RSS and status."""
    report = work / "report.json"
    (work / "tmp").mkdir(exist_ok=True)
    code = (
        "import sys\n"
        "from audits.__main__ import main\n"
        f"status = main([{str(where)!r}, '--json', {str(report)!r}])\n"
        "from tests.fuzzkit import peak_rss\n"
        "print(peak_rss())\n"
        "sys.exit(status)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={**os.environ, "TMPDIR": str(work / "tmp")},
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=_limited(),
        check=False,
    )
    assert proc.returncode in (0, 1), proc.stderr[-3000:]
    return int(proc.stdout.split()[-1]), proc.returncode, json.loads(report.read_text())


def test_a_tar_xz_bomb_in_kt_kernel_is_refused_within_bounds(kt_wheel: Path, tmp_path: Path) -> None:
    members = read_members(kt_wheel)
    member = "kt_kernel/cuda_archive/kt_cuda.tar.xz"
    members[member] = compressed_bomb(lambda: lzma.LZMACompressor(preset=0), "lib/libkt_cuda.so", 512 << 20)
    assert len(members[member]) < 200_000
    (tmp_path / "w").mkdir()
    write_wheel(tmp_path / "w" / kt_wheel.name, members)
    rss, status, report = _rss_and_status(tmp_path / "w", tmp_path)
    assert status == 1
    refused = [f for f in report["findings"] if f["rule"] == "cuda.payload" and "memory_max_mib" in f["message"]]
    assert refused, [f["message"] for f in report["findings"]]
    assert rss < LIMIT, f"peak RSS {rss / 2**20:.0f} MiB"


def _rebuilt_release(release: list[Path], out: Path, archive: bytes, files: dict[str, Any]) -> None:
    """The release with its archive replaced by `archive` (cut into the same five parts, the
    manifest's hashes and sizes made to match): only the archive's content is hostile."""
    out.mkdir()
    provider = next(w for w in release if w.name.startswith("sglang_kernel_kt"))
    m_members = read_members(provider)
    manifest = json.loads(m_members["sgl_kernel/_kt_payload.json"])
    n = len(manifest["parts"])
    cut = [len(archive) * i // n for i in range(n + 1)]
    blobs = [archive[cut[i] : cut[i + 1]] for i in range(n)]
    for p, blob in zip(manifest["parts"], blobs, strict=True):
        p["size"], p["sha256"] = len(blob), hashlib.sha256(blob).hexdigest()
    manifest["archive"]["size"], manifest["archive"]["sha256"] = len(archive), hashlib.sha256(archive).hexdigest()
    manifest["files"] = files
    for w in release:
        members = read_members(w)
        if w == provider:
            members["sgl_kernel/_kt_payload.json"] = json.dumps(manifest).encode()
        for p, blob in zip(manifest["parts"], blobs, strict=True):
            if p["member"] in members:
                members[p["member"]] = blob
        write_wheel(out / w.name, members)


@pytest.mark.parametrize("declared", ["undeclared", "declared-small"])
def test_a_zstd_part_bomb_is_refused_within_bounds(
    sources: dict[str, list[Path]], tmp_path: Path, declared: str
) -> None:
    small = b"x" * 1000
    files = {"sgl_kernel/sm90/libflash.so": {"size": len(small), "sha256": hashlib.sha256(small).hexdigest()}}
    name = "sgl_kernel/sm90/libbomb.so" if declared == "undeclared" else "sgl_kernel/sm90/libflash.so"
    from tests.fuzzkit import tar_member

    head = b""
    if declared == "undeclared":
        header, pad = tar_member("sgl_kernel/sm90/libflash.so", len(small))
        head = header + small + bytes(pad)
    params = zstandard.ZstdCompressionParameters.from_level(3, window_log=20)  # the manifest's window
    archive = compressed_bomb(
        lambda: zstandard.ZstdCompressor(compression_params=params).compressobj(), name, 1 << 30, head
    )
    assert len(archive) < 100_000
    _rebuilt_release(sources["release"], tmp_path / "dist", archive, files)
    rss, status, report = _rss_and_status(tmp_path / "dist", tmp_path)
    assert status == 1
    messages = [f["message"] for f in report["findings"] if f["rule"] == "payload.archive-mismatch"]
    assert any("more than its manifest declares" in m for m in messages), messages
    assert rss < LIMIT, f"peak RSS {rss / 2**20:.0f} MiB"
