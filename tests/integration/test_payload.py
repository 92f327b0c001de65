"""The multi-carrier CUDA payload for real: a several-hundred-MB synthetic archive split
and reassembled, real ELF loading through $ORIGIN from the wheel-relative layout (and
the flattened failure), and the assembled release - its wheels under the budget, its
payload materialized in a fresh venv from the installed carriers alone, its audit
clean, and a corrupted part caught by exactly the payload rules."""

from __future__ import annotations

import ctypes
import hashlib
import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest

from audits import core, load_policy
from carriers import InputError, load, wheelio
from carriers.assemble import assemble
from tests.conftest import KT_SRC, ROOT, load_source_module
from tests.integration.conftest import make_venv
from tests.payloadkit import compressible, make_release, validate_manifest
from tests.wheelkit import compile_so, python_sibling, read_members, write_wheel
from tools.lock import parse_lock

payload: Any = load_source_module("kt_payload_integration", KT_SRC / "payload.py")
MiB = 1 << 20


def test_several_hundred_mb_round_trip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    files = {f"sgl_kernel/big{i}.abi3.so": compressible(100 * MiB, i) for i in range(3)}
    files["sgl_kernel/sm90/common_ops.abi3.so"] = compressible(20 * MiB, 9)
    rel = make_release(tmp_path / "site", files, tmp_path / "build-cache")
    assert sum(len(d) for d in files.values()) > 300 * MiB
    monkeypatch.syspath_prepend(str(rel.site))
    out = payload.materialize(rel.manifest, tmp_path / "cache")
    for name, data in files.items():
        assert (out / name).read_bytes() == data, name
    assert payload.verify(rel.manifest, tmp_path / "cache") == []
    leftovers = [p.name for p in (tmp_path / "cache").iterdir() if p.name.startswith(".tmp")]
    assert leftovers == [], "no concatenated archive or temp dir stays behind"


def test_wheel_relative_layout_loads_and_the_flattened_one_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dep = compile_so(tmp_path, "libkt_dep.so", "int kt_dep(void) { return 41; }\n", "-Wl,-soname,libkt_dep.so")
    (tmp_path / "libkt_dep.so").write_bytes(dep)
    top = compile_so(
        tmp_path,
        "libkt_top.so",
        "int kt_dep(void);\nint kt_top(void) { return kt_dep() + 1; }\n",
        f"-L{tmp_path}",
        "-lkt_dep",
        "-Wl,-rpath,$ORIGIN/../lib",
        "-Wl,--enable-new-dtags",
    )
    files = {"kt_kernel/cuda/lib/libkt_dep.so": dep, "kt_kernel/cuda/sm90a/libkt_top.so": top}
    rel = make_release(tmp_path / "site", files, tmp_path / "build-cache")
    monkeypatch.syspath_prepend(str(rel.site))
    out = payload.materialize(rel.manifest, tmp_path / "cache")
    assert ctypes.CDLL(str(out / "kt_kernel/cuda/sm90a/libkt_top.so")).kt_top() == 42
    flat = tmp_path / "flat"
    flat.mkdir()
    for name in files:
        shutil.copy(out / name, flat / Path(name).name)
    probe = subprocess.run(
        [sys.executable, "-c", f"import ctypes; ctypes.CDLL({str(flat / 'libkt_top.so')!r})"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert probe.returncode != 0
    assert "libkt_dep.so: cannot open shared object file" in probe.stderr


@pytest.fixture(scope="module")
def release(tmp_path_factory: pytest.TempPathFactory, kt_wheel: Path) -> tuple[Path, dict[str, Any]]:
    dist = tmp_path_factory.mktemp("release") / "dist"
    # Two kernel wheels, as CI's matrix gives: the built cp311 one and a relabelled cp312 fixture.
    sibling = python_sibling(kt_wheel, tmp_path_factory.mktemp("cp312"))
    manifest = assemble(load(), [kt_wheel, sibling], dist)
    return dist, manifest


def _provider(dist: Path) -> Path:
    (wheel,) = dist.glob("sglang_kernel_kt-*.whl")
    return wheel


def _manifest(dist: Path) -> dict[str, Any]:
    with zipfile.ZipFile(_provider(dist)) as zf:
        data: dict[str, Any] = json.loads(zf.read("sgl_kernel/_kt_payload.json"))
    return data


@pytest.mark.network
def test_every_carrier_holds_one_part_and_stays_under_the_budget(release: tuple[Path, dict[str, Any]]) -> None:
    dist, summary = release
    m = _manifest(dist)
    validate_manifest(m)
    assert [p["distribution"] for p in m["parts"]] == [
        "kt-kernel",
        "ktransformers",
        "sglang-kt",
        "transformers-kt",
        "accelerate-kt",
    ]
    budget = load_policy().wheel_budget_bytes
    for w in summary["wheels"]:
        assert w["size"] <= budget, (w["filename"], w["size"])
        if w["name"] in {p["distribution"] for p in m["parts"]}:
            assert not w["filename"].endswith("-any.whl"), f"{w['filename']} carries ELF payload"
    assert set(m["files"]) >= {
        "sgl_kernel/flash_ops.abi3.so",
        "sgl_kernel/sm90/common_ops.abi3.so",
        "sgl_kernel/sm100/common_ops.abi3.so",
        "kt_kernel/cuda/lib/libkt_cuda.so",
        "kt_kernel/cuda/sm90a/libkt_cuda_sm90a.so",
    }
    assert m["files"]["sgl_kernel/flash_ops.abi3.so"]["sass"] == ["sm_80", "sm_86", "sm_90a"]
    assert summary["payload"]["archive_sha256"] == m["archive"]["sha256"]
    with zipfile.ZipFile(_provider(dist)) as zf:
        names = set(zf.namelist())
    assert "sgl_kernel/flash_ops.abi3.so" not in names, "large binaries leave the provider's wheel"
    assert "sgl_kernel/spatial_ops.abi3.so" in names, "small libraries stay ordinary wheel files"


@pytest.mark.network
def test_installed_carriers_materialize_without_torch(release: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    dist, _ = release
    wanted = ["kt_kernel", "ktransformers", "sglang_kt", "transformers_kt", "accelerate_kt", "sglang_kernel_kt"]
    wheels = [str(min(dist.glob(f"{n}-*.whl"))) for n in wanted]  # kt-kernel: cp311 (cp312 is a fixture)
    zstd = parse_lock(ROOT / "lockfiles" / "audit.txt")["zstandard"]
    venv = make_venv(
        tmp_path / "venv", [f"zstandard=={zstd.version} " + " ".join(f"--hash=sha256:{h}" for h in zstd.hashes)]
    )
    uv = shutil.which("uv")
    assert uv is not None
    subprocess.run([uv, "pip", "install", "--quiet", "--python", str(venv.python), "--no-deps", *wheels], check=True)
    env = {"KT_KERNEL_CACHE_DIR": str(tmp_path / "cache")}
    cpu_only = venv.json(
        "-c",
        "import json, sys, numpy as np, kt_kernel; print(json.dumps(sorted(m for m in "
        "sys.modules if m.startswith(('kt_kernel.payload', 'kt_kernel.cuda', 'zstandard')))))",
        env=env,
    )
    assert cpu_only == [], "CPU-only use of kt-kernel never touches the payload"
    assert not (tmp_path / "cache").exists()
    where = venv.run("-m", "kt_kernel.payload", "where", env=env, check=False)
    assert where.returncode == 1
    out = Path(venv.run("-m", "kt_kernel.payload", "materialize", env=env).stdout.strip())
    assert (out / "sgl_kernel/sm90/common_ops.abi3.so").is_file()
    assert venv.run("-m", "kt_kernel.payload", "where", env=env).stdout.strip() == str(out)
    assert "files match the manifest" in venv.run("-m", "kt_kernel.payload", "verify", env=env).stdout
    probe = venv.json(
        "-c",
        "import json, sys, kt_kernel.payload; print(json.dumps(sorted(m for m in sys.modules "
        "if m.split('.')[0] in ('torch', 'sgl_kernel'))))",
        env=env,
    )
    assert probe == []
    # kt-kernel's own CUDA libraries come from the release payload too; its build manifest says so
    import jsonschema

    kt = min(dist.glob("kt_kernel-*.whl"))
    with zipfile.ZipFile(kt) as zf:
        build = json.loads(zf.read("kt_kernel/_build.json"))
    schema = json.loads((ROOT / "kernel" / "cmake" / "build-manifest.schema.json").read_text())
    jsonschema.validate(build, schema)
    assert build["cuda"]["archive"] == "release"
    root = venv.run("-c", "import kt_kernel.cuda as c; print(c.extract())", env=env).stdout.strip()
    assert Path(root) == out / "kt_kernel/cuda"
    subprocess.run([uv, "pip", "uninstall", "--quiet", "--python", str(venv.python), "accelerate-kt"], check=True)
    env2 = {"KT_KERNEL_CACHE_DIR": str(tmp_path / "cache2")}
    failed = venv.run("-m", "kt_kernel.payload", "materialize", env=env2, check=False)
    assert failed.returncode == 2
    assert "accelerate-kt==1.15.0.post1 (part 5/5) not installed" in failed.stderr
    assert "Traceback" not in failed.stderr


@pytest.mark.network
def test_release_audit_is_clean_and_a_corrupted_part_is_caught(
    release: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    dist, _ = release
    policy = load_policy()
    clean = core.run([dist], policy)
    assert clean["passed"], [f for f in clean["findings"] if f["severity"] == "error"]
    assert set(clean["payload"]["coverage"]) >= {"sgl_kernel/flash_ops.abi3.so"}
    bad = tmp_path / "dist"
    shutil.copytree(dist, bad)
    (wheel,) = bad.glob("transformers_kt-*.whl")
    members = wheelio.read(wheel)
    part = next(n for n in members if "/_kt_payload/" in n)
    data = bytearray(members[part])
    data[1000] ^= 0x55
    members[part] = bytes(data)
    wheelio.write(wheel, members, stored=frozenset({part}))
    report = core.run([bad], policy)
    errors = {f["rule"] for f in report["findings"] if f["severity"] == "error"}
    # The part's bytes, the archive they make, and the one archived file those bytes land in.
    assert errors == {"payload.part-mismatch", "payload.archive-mismatch", "payload.file-mismatch"}, errors
    assert [f["member"] for f in report["findings"] if f["rule"] == "payload.part-mismatch"] == [part]
    assert len([f for f in report["findings"] if f["rule"] == "payload.file-mismatch"]) == 1


@pytest.mark.network
def test_a_partial_kernel_build_never_reaches_dist(
    release: tuple[Path, dict[str, Any]], kt_wheel: Path, tmp_path: Path
) -> None:
    """A kernel wheel missing a CPU variant (as a `--variant` shard is) is refused; dist/ stays byte-identical."""
    dist, _ = release
    before = {p.name: p.read_bytes() for p in sorted(dist.iterdir())}
    members = wheelio.read(kt_wheel)
    build = json.loads(members["kt_kernel/_build.json"])
    del build["variants"]["amx"]
    members["kt_kernel/_build.json"] = json.dumps(build).encode()
    shard = tmp_path / kt_wheel.name
    wheelio.write(shard, members)
    with pytest.raises(InputError, match=r"partial build.*CPU variants \['amx'\] are not built.*dist/ was not touched"):
        assemble(load(), shard, dist)
    assert {p.name: p.read_bytes() for p in sorted(dist.iterdir())} == before


@pytest.mark.network
def test_every_python_gets_a_kernel_wheel_carrying_the_same_part(release: tuple[Path, dict[str, Any]]) -> None:
    """One kt-kernel wheel per Python of the matrix reaches dist/, SHA256SUMS, the audit and the
    install: each carries part 1 byte for byte, the audit passes with both, and an install on this
    interpreter is offered only the wheel its tags accept."""
    from tools.verify_install import carrier_lines

    dist, summary = release
    kernels = sorted(p.name for p in dist.glob("kt_kernel-*.whl"))
    assert [k.split("-")[2] for k in kernels] == ["cp311", "cp312"]
    sums = (dist / "SHA256SUMS").read_text()
    assert all(k in sums for k in kernels)
    assert sorted(w["filename"] for w in summary["wheels"] if w["name"] == "kt-kernel") == kernels
    part = _manifest(dist)["parts"][0]
    for k in kernels:
        with zipfile.ZipFile(dist / k) as zf:
            blob = zf.read(part["member"])
        assert hashlib.sha256(blob).hexdigest() == part["sha256"], k
    report = core.run([dist], load_policy())
    assert [f for f in report["findings"] if f["severity"] == "error"] == []
    (line,) = carrier_lines(dist, ["kt-kernel"])
    assert f"-cp{sys.version_info.major}{sys.version_info.minor}-" in line


@pytest.mark.network
def test_kernel_wheels_with_different_cuda_libraries_are_refused(tmp_path: Path, kt_wheel: Path) -> None:
    members = read_members(kt_wheel)
    build = json.loads(members["kt_kernel/_build.json"])
    blob = members[build["cuda"]["payload"]]
    import io
    import tarfile

    out = io.BytesIO()
    with tarfile.open(fileobj=io.BytesIO(blob), mode="r:xz") as src, tarfile.open(fileobj=out, mode="w:xz") as dst:
        for info in src:
            data = src.extractfile(info).read() + (b"\0" if info.name.endswith("libkt_cuda.so") else b"")  # type: ignore[union-attr]
            info.size = len(data)
            dst.addfile(info, io.BytesIO(data))
    members[build["cuda"]["payload"]] = out.getvalue()
    (tmp_path / "src").mkdir()
    other = python_sibling(write_wheel(tmp_path / "src" / kt_wheel.name, members), tmp_path / "cp312")
    dist = tmp_path / "dist"
    with pytest.raises(InputError, match=r"hold different CUDA libraries \(\['kt_kernel/cuda/lib/libkt_cuda.so'\]\)"):
        assemble(load(), [kt_wheel, other], dist)
    assert not dist.exists()
