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
from base.version import python_tag
from carriers import InputError, load, wheelio
from carriers.assemble import assemble
from locks.read import parse_lock
from tests import distkit
from tests.conftest import KT_SRC, ROOT, load_source_module
from tests.integration.conftest import make_venv
from tests.payloadkit import compressible, make_release, validate_manifest
from tests.wheelkit import compile_so, python_sibling, read_members, write_wheel

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
    # The one abi3 kernel wheel serves every Python; sglang-kt and xgrammar-kt come once per Python.
    manifest = assemble(load(), [kt_wheel], dist)
    return dist, manifest.as_json()  # manifest.json's content, as every reader sees it


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
    schema = json.loads((ROOT / "audits" / "schemas" / "build-manifest.schema.json").read_text())
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
    # The part's bytes, the archive they make, the one archived file those bytes land in, the install
    # files that pin the wheel by its old sha256, and the wheel's own SBOM, which lists the part by its sha256.
    assert errors == {
        "payload.part-mismatch",
        "payload.archive-mismatch",
        "payload.file-mismatch",
        "install.carrier-hash",
        "sbom.mismatch",
    }, errors
    assert [f["member"] for f in report["findings"] if f["rule"] == "sbom.mismatch"] == [part]
    stale = {f["wheel"] for f in report["findings"] if f["rule"] == "install.carrier-hash"}
    assert stale == {f"install/{p}-{t}.txt" for p in ("sft", "serve", "lf-kt") for t in ("cp311", "cp312", "cp313")} | {
        f"install/pylock.{p}-{t}.toml" for p in ("sft", "serve", "lf-kt") for t in ("cp311", "cp312", "cp313")
    }
    assert [f["member"] for f in report["findings"] if f["rule"] == "payload.part-mismatch"] == [part]
    assert len([f for f in report["findings"] if f["rule"] == "payload.file-mismatch"]) == 1


@pytest.mark.network
def test_a_partial_kernel_build_never_reaches_dist(
    release: tuple[Path, dict[str, Any]], kt_wheel: Path, tmp_path: Path
) -> None:
    """A kernel wheel missing a CPU variant (as a `--variant` shard is) is refused; dist/ stays byte-identical."""
    dist, _ = release
    before = {str(p.relative_to(dist)): p.read_bytes() for p in sorted(dist.rglob("*")) if p.is_file()}
    members = wheelio.read(kt_wheel)
    build = json.loads(members["kt_kernel/_build.json"])
    del build["variants"]["amx"]
    members["kt_kernel/_build.json"] = json.dumps(build).encode()
    shard = tmp_path / kt_wheel.name
    wheelio.write(shard, members)
    with pytest.raises(InputError, match=r"partial build.*CPU variants \['amx'\] are not built.*dist/ was not touched"):
        assemble(load(), shard, dist)
    assert {str(p.relative_to(dist)): p.read_bytes() for p in sorted(dist.rglob("*")) if p.is_file()} == before


@pytest.mark.network
def test_every_python_of_the_matrix_gets_its_wheels_each_carrying_the_same_part(
    release: tuple[Path, dict[str, Any]],
) -> None:
    """The per-Python carriers (sglang-kt carries part 3, xgrammar-kt none) reach dist/ once per Python of
    carriers.toml's matrix, the one abi3 kt-kernel wheel serves them all, every wheel of a part carrier
    holds its part byte for byte, the audit passes, the manifest says which Pythons each wheel serves,
    and an install on this interpreter is offered only the wheels its tags accept."""
    from verify.venv import carrier_lines

    dist, summary = release
    pythons = list(load().pythons)
    assert summary["pythons"] == pythons
    assert "partial" not in summary
    tags = [python_tag(v) for v in pythons]
    for name in ("sglang_kt", "xgrammar_kt"):
        assert sorted(p.name.split("-")[2] for p in dist.glob(f"{name}-*.whl")) == tags, name
    (kernel,) = dist.glob("kt_kernel-*.whl")
    assert "-cp311-abi3-" in kernel.name
    for w in summary["wheels"]:
        expected = (
            pythons
            if w["name"] not in ("sglang-kt", "xgrammar-kt")
            else [v for v in pythons if python_tag(v) in w["filename"]]
        )
        assert w["pythons"] == expected, w["filename"]
    sums = (dist / "SHA256SUMS").read_text()
    assert all(w["filename"] in sums for w in summary["wheels"])
    part = next(p for p in _manifest(dist)["parts"] if p["distribution"] == "sglang-kt")
    for wheel in sorted(dist.glob("sglang_kt-*.whl")):
        with zipfile.ZipFile(wheel) as zf:
            blob = zf.read(part["member"])
        assert hashlib.sha256(blob).hexdigest() == part["sha256"], wheel.name
    report = core.run([dist], load_policy())
    assert [f for f in report["findings"] if f["severity"] == "error"] == []
    (line,) = carrier_lines(dist, ["sglang-kt"])
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


@pytest.mark.network
def test_install_files_for_every_profile_and_python_pin_the_release_wheels(
    release: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    """dist/install/ holds both forms for every install profile and Python, listed in SHA256SUMS and the
    manifest; every pylock is valid PEP 751; every carrier is pinned by its wheel's own sha256 (the
    audit agrees); an install file tampered with is caught by exactly install.carrier-hash."""
    from packaging.pylock import Pylock

    from audits.readers._install import read_install_files
    from locks import read as lock

    dist, summary = release
    pythons = load().pythons
    expected = sorted(
        f"install/{form.format(p=p, t=python_tag(v))}"
        for p in lock.install_profiles()
        for v in pythons
        for form in ("{p}-{t}.txt", "pylock.{p}-{t}.toml")
    )
    assert sorted(f["file"] for f in summary["install"]) == expected
    sums = {n: d for d, n in (line.split("  ", 1) for line in (dist / "SHA256SUMS").read_text().splitlines())}
    for f in summary["install"]:
        assert hashlib.sha256((dist / f["file"]).read_bytes()).hexdigest() == sums[f["file"]] == f["sha256"]
    wheel_sha = {w["filename"]: w["sha256"] for w in summary["wheels"]}
    for facts in read_install_files(dist):
        assert not facts.error, facts.label
        for name, pin in facts.pins.items():
            ours = [fn for fn in wheel_sha if fn.startswith(name.replace("-", "_") + "-")]
            if ours:
                assert pin.hashes <= set(wheel_sha.values()), (facts.label, name)
        if facts.label.endswith(".toml"):
            Pylock.from_dict(__import__("tomllib").loads(facts.path.read_text())).validate()
    serve312 = (dist / "install" / "serve-cp312.txt").read_text()
    (sg,) = [w for w in summary["wheels"] if w["filename"].startswith("sglang_kt-") and "-cp312-" in w["filename"]]
    assert f"sglang-kt==0.6.1 \\\n    --hash=sha256:{sg['sha256']}\n" in serve312
    pinned = {line.split("==")[0] for line in serve312.splitlines() if "==" in line and not line.startswith("#")}
    assert not pinned & {"transformers", "accelerate", "sglang", "sglang-kernel", "peft", "trl"}  # the forks only
    assert {"transformers-kt", "sglang-kt", "sglang-kernel-kt", "kt-kernel"} <= pinned
    assert "--no-binary" not in serve312
    for python in ("311", "312", "313"):  # no profile needs an sdist on any Python of the matrix
        for profile in ("serve", "lf-kt", "sft"):
            assert "--no-binary" not in (dist / "install" / f"{profile}-cp{python}.txt").read_text(), (profile, python)
    # tampered: another sha256 for kt-kernel in one file
    copy = tmp_path / "dist"
    shutil.copytree(dist, copy)
    target = copy / "install" / "sft-cp311.txt"
    (kt,) = [w for w in summary["wheels"] if w["name"] == "kt-kernel"]
    target.write_text(target.read_text().replace(kt["sha256"], "0" * 64))
    report = core.run([copy], load_policy())
    errors = [(f["rule"], f["wheel"], f["member"]) for f in report["findings"] if f["severity"] == "error"]
    assert errors == [("install.carrier-hash", "install/sft-cp311.txt", "kt-kernel")]


@pytest.mark.network
def test_an_offline_bundle_installs_and_materializes_with_every_index_unreachable(
    release: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    """nox -s bundle's builder on the smallest profile that shows the whole path: the payload's carriers
    with zstandard and numpy (the serve profile adds ~4 GB of CUDA torch; verify_install's realm). The
    bundle is installed by hash in a network namespace with no interface but loopback, and the CUDA
    payload then materializes from the installed carriers; a missing file is an error naming it."""
    from bundle.build import BundleError, build

    dist, summary = release
    small = tmp_path / "dist"
    (small / "install").mkdir(parents=True)
    names = ["kt_kernel", "ktransformers", "sglang_kt", "transformers_kt", "accelerate_kt", "sglang_kernel_kt"]
    lines = ["--only-binary :all:"]
    for n in names:
        wheel = min(dist.glob(f"{n}-*.whl"))  # sglang-kt: the cp311 wheel
        shutil.copyfile(wheel, small / wheel.name)
        (w,) = [x for x in summary["wheels"] if x["filename"] == wheel.name]
        lines.append(f"{w['name']}=={w['version']} \\\n    --hash=sha256:{w['sha256']}")
    for lockname, dep in (("audit", "zstandard"), ("runtime-cpu", "numpy")):
        pin = parse_lock(ROOT / "lockfiles" / f"{lockname}.txt")[dep]
        lines.append(f"{dep}=={pin.version}" + "".join(f" \\\n    --hash=sha256:{h}" for h in pin.hashes))
    install = small / "install" / "payload-cp311.txt"
    kept = {
        w["filename"]: (small / w["filename"]).read_bytes()
        for w in summary["wheels"]
        if (small / w["filename"]).exists()
    }
    records = {w["filename"]: {"kind": w["kind"], "pythons": tuple(w["pythons"])} for w in summary["wheels"]}
    distkit.make_release(small, kept, {"install/payload-cp311.txt": "\n".join(lines) + "\n"}, records=records)
    out = tmp_path / "bundle"
    got = build(small, "payload", "3.11", out)
    assert got.files == len(names) + 2 + 2  # the wheels, the install file, the README
    assert sorted(p.name for p in out.iterdir() if not p.name.endswith(".whl")) == ["README.md", install.name]
    assert f"--find-links . --require-hashes -r {install.name}" in (out / "README.md").read_text()
    with pytest.raises(BundleError, match="exists"):
        build(small, "payload", "3.11", out)
    script = (
        "set -e\n"
        "! python3 -c 'import socket; socket.create_connection((\"pypi.org\", 443), timeout=3)' 2>/dev/null\n"
        f"{sys.executable} -m venv {tmp_path / 'venv'}\n"
        f"{tmp_path / 'venv/bin/pip'} install -q --isolated --no-index --find-links {out} --require-hashes "
        f"--no-deps -r {out / install.name}\n"
        f"KT_KERNEL_CACHE_DIR={tmp_path / 'cache'} {tmp_path / 'venv/bin/python'} -m kt_kernel.payload materialize\n"
    )
    run = subprocess.run(["unshare", "--net", "sh", "-c", script], capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    materialized = Path(run.stdout.strip().splitlines()[-1])
    assert (materialized / "sgl_kernel/sm90/common_ops.abi3.so").is_file()
    # a release missing a file is refused, naming it; nothing is left behind
    gone = min(dist.glob("accelerate_kt-*.whl")).name
    (small / gone).unlink()
    with pytest.raises(BundleError, match=rf"{gone}: listed in SHA256SUMS but unreadable"):
        build(small, "payload", "3.11", tmp_path / "bundle2")
    assert not (tmp_path / "bundle2").exists()
    assert not list(tmp_path.glob(".bundle2.part-*"))


@pytest.mark.network
def test_normal_resolution_from_an_index_serving_the_release_matches_the_install_file(
    release: tuple[Path, dict[str, Any]],
) -> None:
    """`pip install ktransformers[sft]==V` against pypiserver serving dist/ (PyPI behind it, by its
    fallback) installs the forks only, the release's own kt-kernel (PyPI has another 0.6.1), and exactly
    the versions of dist/install/sft-cp311.txt. The serve and lf-kt profiles and the other Pythons are
    checked by verify_install (minutes each)."""
    from base.interpreters import current
    from locks.read import directive
    from verify.resolution import check, index

    dist, _ = release
    roots = directive(ROOT / "lockfiles" / "sft.in", "carriers")
    with index(dist) as url:
        result = check(dist, "sft", "3.11", roots, url, current())  # pip run by this very interpreter
    assert result.problems == []
    assert result.installed["kt-kernel"] == "0.6.1"
    assert "transformers-kt" in result.installed
    assert "transformers" not in result.installed
