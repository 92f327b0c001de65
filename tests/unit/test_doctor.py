"""kt-doctor on site directories built here: a healthy KT environment, one where `pip install peft`
clobbered peft-kt, one where upstream replaced a fork the umbrella requires, and its exit codes."""

from __future__ import annotations

import json
import shlex
import types
from pathlib import Path

import pytest

from tests.conftest import KT_SRC, load_source_module


def _doctor() -> types.ModuleType:
    """kt_kernel/doctor.py by path: the package itself needs its compiled core."""
    return load_source_module("kt_doctor", KT_SRC / "doctor.py")


def _dist(
    site: Path, name: str, version: str, files: list[str], *, upstream: str = "", requires: tuple[str, ...] = ()
) -> None:
    di = f"{name.replace('-', '_')}-{version}.dist-info"
    (site / di).mkdir(parents=True)
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(
        f"Requires-Dist: {r}\n" for r in requires
    )
    (site / di / "METADATA").write_text(meta)
    if upstream:
        (site / di / "kt_upstream.json").write_text(json.dumps({"carrier": name, "name": upstream, "version": version}))
    lines = []
    for f in [*files, f"{di}/METADATA"]:
        path = site / f
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists():
            path.write_text(f"# {f}\n")
        lines.append(f"{f},{_hash(path)},{path.stat().st_size}\n")
    (site / di / "RECORD").write_text("".join(lines) + f"{di}/RECORD,,\n")


def _hash(path: Path) -> str:
    import base64
    import hashlib

    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(path.read_bytes()).digest()).rstrip(b"=").decode()


@pytest.fixture
def healthy(tmp_path: Path) -> Path:
    site = tmp_path / "site-packages"
    _dist(site, "kt-kernel", "0.6.1", ["kt_kernel/__init__.py"])
    _dist(
        site,
        "ktransformers",
        "0.6.1",
        ["ktransformers/__init__.py"],
        requires=('peft-kt==0.21.2; extra == "sft"', "kt-kernel==0.6.1"),
    )
    _dist(
        site,
        "transformers-kt",
        "5.19.0.post1",
        ["transformers/__init__.py", "_kt_dist_alias.py"],
        upstream="transformers",
    )
    _dist(site, "peft-kt", "0.21.2", ["peft/__init__.py", "peft/tuners/lora.py"], upstream="peft")
    return site


def test_a_healthy_environment_has_one_kt_owner_per_package(healthy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doctor = _doctor()
    assert doctor.main(["--site", str(healthy)]) == 0
    out = capsys.readouterr().out
    assert "no conflicts" in out
    report = {p.package: p for p in doctor.diagnose(site=healthy)}
    assert [(o.name, o.kt) for o in report["peft"].owners] == [("peft-kt", True)]
    assert report["transformers"].state == "ok"
    assert report["sglang"].state == "absent"


def test_pip_install_peft_on_top_is_a_conflict_with_its_repair(
    healthy: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _dist(healthy, "peft", "0.21.2", ["peft/__init__.py"])
    doctor = _doctor()
    assert doctor.main(["--site", str(healthy), "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    (peft,) = [p for p in data["packages"] if p["package"] == "peft"]
    assert peft["state"] == "conflict"
    assert "peft-kt 0.21.2 and peft 0.21.2 all write peft/" in peft["problem"]
    assert peft["repair"] == ["pip uninstall -y peft", "pip install --force-reinstall --no-deps peft-kt==0.21.2"]
    assert data["conflicts"] == 1


def test_upstream_where_the_umbrella_requires_the_fork(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    site = tmp_path / "site-packages"
    _dist(site, "ktransformers", "0.6.1", ["ktransformers/__init__.py"], requires=('peft-kt==0.21.2; extra == "sft"',))
    _dist(site, "peft", "0.17.0", ["peft/__init__.py"])
    doctor = _doctor()
    assert doctor.main(["--site", str(site), "peft"]) == 1
    out = capsys.readouterr().out
    assert "upstream peft provides peft, where the KT release requires peft-kt==0.21.2" in out
    assert "pip uninstall -y peft" in out
    assert "pip install --no-deps 'peft-kt==0.21.2'" in out


def test_a_missing_site_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _doctor().main(["--site", str(tmp_path / "nope")]) == 2
    assert "no such directory" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("option", "expect"),
    [
        ("--find-links", "pip install --force-reinstall --no-deps --no-index --find-links {wheels} peft-kt==0.21.2"),
        ("--index-url", "pip install --force-reinstall --no-deps --index-url {wheels} peft-kt==0.21.2"),
    ],
)
def test_the_repair_names_where_the_release_wheels_are(
    healthy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], option: str, expect: str
) -> None:
    """The forks are not on PyPI: the repair installs them from the release's wheels or index."""
    _dist(healthy, "peft", "0.21.2", ["peft/__init__.py"])
    wheels = tmp_path / "release wheels"  # a space: the printed command quotes it
    wheels.mkdir()
    where = str(wheels) if option == "--find-links" else "https://example.invalid/simple"
    assert _doctor().main(["--site", str(healthy), "--json", option, where]) == 1
    (peft,) = [p for p in json.loads(capsys.readouterr().out)["packages"] if p["package"] == "peft"]
    assert peft["repair"] == ["pip uninstall -y peft", expect.format(wheels=shlex.quote(where))]


def test_find_links_must_be_a_directory(healthy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _doctor().main(["--site", str(healthy), "--find-links", str(tmp_path / "nope")]) == 2
    assert "--find-links" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "says"),
    [(["--deep"], "--deep goes with --run"), (["--run", "--site", "."], "it cannot run another's (--site)")],
)
def test_run_options_that_cannot_work_are_usage_errors(
    args: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _doctor().main(args) == 2
    assert says in capsys.readouterr().err


def _run_module() -> types.ModuleType:
    return load_source_module("kt_doctor_run", KT_SRC / "_doctor_run.py")


def test_the_loader_names_what_a_library_needs_and_cannot_find(tmp_path: Path) -> None:
    """`ldd`'s own answer, with the environment's library folders on its path: a library needing a
    libcudart.so.12 the environment lacks is named; the driver's libcuda.so.1 never is."""
    import subprocess

    run = _run_module()
    gcc = ["gcc", "-shared", "-fPIC"]
    (tmp_path / "stub.c").write_text("int stub(void) { return 0; }\n")
    (tmp_path / "user.c").write_text("int stub(void);\nint f(void) { return stub(); }\n")
    for soname in ("libcudart.so.12", "libcuda.so.1"):
        subprocess.run(
            [*gcc, f"-Wl,-soname,{soname}", "-o", str(tmp_path / soname), str(tmp_path / "stub.c")], check=True
        )
    lib = tmp_path / "lib" / "libuser.so"
    lib.parent.mkdir()
    link = [f"-L{tmp_path}", "-l:libcudart.so.12", "-l:libcuda.so.1"]
    subprocess.run([*gcc, "-Wl,--no-as-needed", "-o", str(lib), str(tmp_path / "user.c"), *link], check=True)
    env_dir = tmp_path / "env"
    env_dir.mkdir()
    assert run.unresolved([lib], {}) == {str(lib): ["libcudart.so.12"]}  # libcuda.so.1: the driver's
    (tmp_path / "libcudart.so.12").rename(env_dir / "libcudart.so.12")
    assert run.unresolved([lib], {"libcudart.so.12": env_dir / "libcudart.so.12"}) == {}  # found in the environment
    assert run._major("libcudart.so.12") == ("libcudart.so", "12")
    assert run._major("libnvrtc.so.13.0.48") == ("libnvrtc.so", "13")
    assert run._major("libkt_cuda.so") is None


def test_the_loader_names_the_symbols_an_installed_torch_lacks(tmp_path: Path) -> None:
    """`ldd -r` with the environment's libraries: an extension built against a libtorch that had a c10 symbol,
    beside one that lacks it, has that symbol named (demangled); Python's own symbols and the driver API on a
    machine without the driver are not; with the symbol back, nothing is."""
    import subprocess

    run = _run_module()
    gcc = ["gcc", "-shared", "-fPIC"]
    check = 'void check(void) __asm__("_ZN3c106detail14torchCheckFailEPKcS2_jS2_");\n'
    (tmp_path / "old.c").write_text(check + "void check(void) {}\n")
    (tmp_path / "new.c").write_text("int other;\n")
    (tmp_path / "ext.c").write_text(
        check + "extern void *PyLong_FromLong(long);\nextern int cuInit(unsigned);\n"
        "void *use(void) { check(); cuInit(0); return PyLong_FromLong(1); }\n"
    )
    built, env = tmp_path / "built", tmp_path / "env"
    built.mkdir()
    env.mkdir()
    for folder, src in ((built, "old.c"), (env, "new.c")):
        subprocess.run(
            [*gcc, "-Wl,-soname,libtorch.so", "-o", str(folder / "libtorch.so"), str(tmp_path / src)], check=True
        )
    (tmp_path / "driver.c").write_text("int cuInit(unsigned f) { return (int)f; }\n")
    driver = [*gcc, "-Wl,-soname,libcuda.so.1", "-o", str(built / "libcuda.so.1"), str(tmp_path / "driver.c")]
    subprocess.run(driver, check=True)
    ext = tmp_path / "ops.so"
    link = [f"-L{built}", "-Wl,--no-as-needed", "-ltorch", "-l:libcuda.so.1"]
    subprocess.run([*gcc, "-o", str(ext), str(tmp_path / "ext.c"), *link], check=True)
    got = run.undefined_symbols([ext], {"libtorch.so": env / "libtorch.so"})
    assert got == {str(ext): ["_ZN3c106detail14torchCheckFailEPKcS2_jS2_"]}
    assert run._demangled(got[str(ext)]) in (
        ["c10::detail::torchCheckFail(char const*, char const*, unsigned int, char const*)"],
        got[str(ext)],  # no c++filt on this machine: the name as it is
    )
    assert run.undefined_symbols([ext], {"libtorch.so": built / "libtorch.so"}) == {}


def test_files_another_install_deleted_or_changed_are_named_with_their_repair(
    healthy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """pip uninstalled the previous kt-kernel after installing sgl-deep-gemm and deleted the deep_gemm/ files
    both listed (pypa/pip#8509): the doctor names the distribution, the files and the command that restores
    them, and exits 1. A KT distribution's file changed in place (same size) is found by its sha256; bytecode
    Python rewrote is not a change."""
    doctor = _doctor()
    _dist(healthy, "sgl-deep-gemm", "0.2.3.post2", [f"deep_gemm/m{i}.py" for i in range(5)])
    for i in range(4):
        (healthy / f"deep_gemm/m{i}.py").unlink()
    lora = healthy / "peft/tuners/lora.py"
    lora.write_text(lora.read_text().replace("#", "!"))  # same size, other bytes
    pyc = healthy / "peft/__pycache__/x.cpython-311.pyc"
    pyc.parent.mkdir()
    pyc.write_bytes(b"old")
    record = next(healthy.glob("peft_kt-*.dist-info")) / "RECORD"
    record.write_text(record.read_text() + "peft/__pycache__/x.cpython-311.pyc,sha256=AAAA,3\n")
    pyc.write_bytes(b"recompiled")
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    assert doctor.main(["--site", str(healthy), "--find-links", str(wheels)]) == 1
    out = capsys.readouterr().out
    assert "files: 2 installed distribution(s) differ from their RECORD" in out
    assert "sgl-deep-gemm 0.2.3.post2: 4 missing: deep_gemm/m0.py, deep_gemm/m1.py, deep_gemm/m2.py and 1 more" in out
    assert "peft-kt 0.21.2: 1 changed: peft/tuners/lora.py" in out
    assert (
        f"repair: pip install --force-reinstall --no-deps --no-index --find-links {wheels} sgl-deep-gemm==0.2.3.post2"
        in out
    )
    assert doctor.main(["--site", str(healthy), "--json"]) == 1
    files = json.loads(capsys.readouterr().out)["files"]
    assert [(d["distribution"], len(d["missing"]), d["changed"]) for d in files["damaged"]] == [
        ("peft-kt", 0, ["peft/tuners/lora.py"]),
        ("sgl-deep-gemm", 4, []),
    ]
    assert files["checked"] >= 12


def test_a_file_two_distributions_list_is_a_collision_not_damage(
    healthy: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """flashinfer-python and torch-c-dlpack-ext both ship a top-level build_backend.py: whichever installed
    last holds it, which is no damage of the other (a fresh install has it too); a missing one still is."""
    doctor = _doctor()
    _dist(healthy, "torch-c-dlpack-ext", "0.1.5", ["build_backend.py"])
    (healthy / "build_backend.py").write_text("# flashinfer's, longer than the other\n")
    _dist(healthy, "flashinfer-python", "0.7.2", ["build_backend.py", "flashinfer/__init__.py"])
    assert doctor.main(["--site", str(healthy)]) == 0
    capsys.readouterr()
    (healthy / "build_backend.py").unlink()
    assert doctor.main(["--site", str(healthy)]) == 1
    assert "1 missing: build_backend.py" in capsys.readouterr().out


def test_a_healthy_environment_says_every_file_is_there(healthy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _doctor().main(["--site", str(healthy)]) == 0
    assert "files: every installed distribution has the" in capsys.readouterr().out
