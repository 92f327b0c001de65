"""Install verification: hash refusal, the fork-not-upstream check, and the full sft-cpu profile (fresh
venv, forks, training/resume control) on a real dist/, then the published sft install file the same way."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from base import distdir
from base.interpreters import current
from carriers import load
from carriers.assemble import assemble
from carriers.model import ALIAS_DIR
from carriers.transform import ALIAS_FILES
from tests import distkit
from tests.conftest import ROOT
from tests.wheelkit import pure_wheel_members, write_wheel
from verify import owners, serve, sft
from verify import venv as vi


def _venv(path: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True)
    return path


def test_install_refuses_a_wheel_whose_hash_differs(tmp_path: Path) -> None:
    wheel = write_wheel(tmp_path / "demo_pkg-1.0-py3-none-any.whl", pure_wheel_members())
    req = tmp_path / "req.txt"
    req.write_text(f"demo-pkg @ {wheel.as_uri()} --hash=sha256:{'0' * 64}\n")
    with pytest.raises(vi.VerifyError, match="DO NOT MATCH THE HASHES"):
        vi.install(_venv(tmp_path / "venv"), req)


def test_dist_that_disagrees_with_its_sums_is_refused(tmp_path: Path) -> None:
    wheel = write_wheel(tmp_path / "demo_pkg-1.0-py3-none-any.whl", pure_wheel_members())
    distkit.make_release(tmp_path, {wheel.name: wheel.read_bytes()})
    wheel.write_bytes(wheel.read_bytes() + b"changed after the build")
    with pytest.raises(distdir.DistError, match="differs from SHA256SUMS"):
        vi.carrier_lines(tmp_path, ["demo-pkg"])


def test_fork_check_tells_fork_from_upstream(tmp_path: Path) -> None:
    """Also with the alias installed: version("foo") answers with foo-kt's record, but the fork
    check reads the listing and still sees foo-kt, not an upstream foo."""
    venv = _venv(tmp_path / "venv")
    fork = pure_wheel_members("foo_kt", "1.0")
    fork["foo/__init__.py"] = fork.pop("foo_kt/__init__.py")
    fork["foo_kt-1.0.dist-info/kt_upstream.json"] = b'{"carrier": "foo-kt", "name": "foo", "version": "0.9"}'
    for name in ALIAS_FILES:
        fork[name] = (ALIAS_DIR / name).read_bytes()
    upstream = pure_wheel_members("bar", "1.0")
    lines = []
    for name, members in (("foo_kt", fork), ("bar", upstream)):
        w = write_wheel(tmp_path / f"{name}-1.0-py3-none-any.whl", members)
        lines.append(
            f"{name.replace('_', '-')} @ {w.as_uri()} --hash=sha256:{hashlib.sha256(w.read_bytes()).hexdigest()}"
        )
    req = tmp_path / "req.txt"
    req.write_text("\n".join(lines) + "\n")
    vi.install(venv, req)
    assert owners.fork_status(venv, ("foo", "bar", "baz")) == {
        "foo": "foo-kt",
        "bar": "UPSTREAM INSTALLED",
        "baz": "MISSING",
    }
    assert (
        vi.venv_json(venv, "alias", "-c", "import json, importlib.metadata as m; print(json.dumps(m.version('foo')))")
        == "0.9"
    )


@pytest.mark.network
def test_sft_cpu_profile_end_to_end(tmp_path: Path, kt_wheel: Path) -> None:
    """The real thing: carriers assembled around the built kernel, installed by hash
    into a fresh venv; forks provide transformers/accelerate/peft/trl; adding
    peft-kt/trl-kt leaves the core untouched; 3+3 steps equal 6, bit for bit."""
    dist = tmp_path / "dist"
    assemble(load(), kt_wheel, dist)
    result = sft.verify_sft_cpu(dist, tmp_path / "work", current())
    assert result["forks"] == {
        "transformers": "transformers-kt",
        "accelerate": "accelerate-kt",
        "peft": "peft-kt",
        "trl": "trl-kt",
    }
    assert result["train_resume"]["adapter_bit_identical"] is True
    assert result["train_resume"]["optimizer_bit_identical"] is True
    assert result["train_resume"]["trained"] is True
    assert result["kt_sft"]["trajectory_rel_diff"] < 0.01
    owners = {p["package"]: [o["name"] for o in p["owners"]] for p in result["doctor"]["packages"]}
    assert result["doctor"]["conflicts"] == 0
    assert owners["peft"] == ["peft-kt"]
    assert owners["transformers"] == ["transformers-kt"]
    _doctor_finds_and_repairs_a_clobbered_peft(tmp_path / "work" / "sft-cpu", dist, tmp_path)
    # lookups by the upstream names answer as upstream (docs/dist-names.md)
    names = result["dist_names"]
    assert set(names["lookups"]) == {"transformers", "accelerate", "peft", "trl"}
    assert all(v["got"] == v["want"] for v in names["lookups"].values()), names
    assert names["sites"] == {
        "trl.__version__": names["lookups"]["trl"]["want"][1],
        "accelerate is_peft_available": True,
        "transformers is_peft_available": True,
        "require_version": "ok",
    }
    assert json.loads(json.dumps(result)) == result  # the result is JSON as the report writes it
    _the_published_sft_file_trains(dist, tmp_path / "work")


def _the_published_sft_file_trains(dist: Path, work: Path) -> None:
    """What users get: dist/install/sft-cp311.txt installed by hash exactly as published (its torch is the
    CUDA build, which runs on the CPU here), then every SFT check, the training and resume control included."""
    published = sft.verify_sft(dist, work)
    manifest = json.loads((dist / "manifest.json").read_text())
    (entry,) = [
        f for f in manifest["install"] if f["profile"] == "sft" and f["python"] == "3.11" and f["file"].endswith(".txt")
    ]
    assert published["install_file"] == {"file": entry["file"], "sha256": entry["sha256"]}
    pinned = (dist / entry["file"]).read_text().split("\ntorch==", 1)[1].split()[0]
    assert published["torch"] == pinned
    assert "+cpu" not in pinned  # the file users get, not the CPU lock sft-cpu trains on
    assert published["train_resume"]["adapter_bit_identical"] is True
    assert published["train_resume"]["trained"] is True
    assert published["kt_sft"]["trajectory_rel_diff"] < 0.01
    assert published["forks"]["transformers"] == "transformers-kt"


def _doctor_finds_and_repairs_a_clobbered_peft(venv: Path, dist: Path, tmp: Path) -> None:
    """`pip install peft` (upstream, hash-locked in lockfiles/sft-test.txt) on top of peft-kt: kt-doctor
    exits 1 naming both writers and the repair; the repair, run as printed (the fork from dist/), heals it."""
    lock = (ROOT / "lockfiles" / "sft-test.txt").read_text()
    block = lock[lock.index("\npeft==") + 1 :].split("\n")
    req = tmp / "upstream-peft.txt"
    req.write_text("\n".join(block[: next(i for i, ln in enumerate(block) if not ln.endswith("\\")) + 1]) + "\n")
    proc = vi.pip(venv, "install", "--require-hashes", "--no-deps", "-r", str(req))
    assert proc.returncode == 0, proc.stderr
    doctor = subprocess.run([str(venv / "bin" / "kt-doctor")], capture_output=True, text=True, check=False)
    assert doctor.returncode == 1, doctor.stdout
    assert "peft-kt 0.21.2 and peft 0.21.2 all write peft/" in doctor.stdout, doctor.stdout
    run = subprocess.run(
        [str(venv / "bin" / "kt-doctor"), "--run", "--json"], capture_output=True, text=True, check=False
    )
    assert run.returncode == 1, run.stdout  # --run keeps the ownership report: the fork and its upstream both here
    assert json.loads(run.stdout)["conflicts"] == 1
    repairs = [ln.strip() for ln in doctor.stdout.splitlines() if ln.startswith("    pip ")]
    assert repairs == ["pip uninstall -y peft", "pip install --force-reinstall --no-deps peft-kt==0.21.2"]
    for cmd in repairs:
        args = cmd.split()[1:]
        if args[0] == "install":  # the fork from this release's dist/, not an index
            args += ["--no-index", "--find-links", str(dist)]
        proc = vi.pip(venv, *args)
        assert proc.returncode == 0, (cmd, proc.stderr)
    healed = subprocess.run([str(venv / "bin" / "kt-doctor")], capture_output=True, text=True, check=False)
    assert healed.returncode == 0, healed.stdout


def test_extracted_libraries_resolve_beside_them_in_the_env_or_the_system(tmp_path: Path) -> None:
    """verify_serve's DT_NEEDED check on real ELF files: one found through $ORIGIN, one in the
    venv (torch/lib), one a system library, the driver always external, and one missing."""
    from tests.wheelkit import compile_so

    root = tmp_path / "payload"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "libdep.so").write_bytes(compile_so(tmp_path, "libdep.so", "int dep(void) { return 1; }"))
    venv = tmp_path / "venv"
    torch_lib = venv / "lib" / "python3.11" / "site-packages" / "torch" / "lib"
    torch_lib.mkdir(parents=True)
    (torch_lib / "libc10.so").write_bytes(compile_so(tmp_path, "libc10.so", "int c10(void) { return 2; }"))
    for name in ("libdep.so", "libc10.so", "libcuda.so.1", "libmissing.so"):  # link stubs for each
        (tmp_path / name).write_bytes(compile_so(tmp_path, name, "int stub(void) { return 0; }", f"-Wl,-soname,{name}"))
    ext = compile_so(
        tmp_path,
        "ext.so",
        "int ext(void) { return 0; }",
        "-Wl,--no-as-needed",
        f"-L{tmp_path}",
        "-l:libdep.so",
        "-l:libc10.so",
        "-l:libcuda.so.1",
        "-l:libmissing.so",
        "-lm",
        "-Wl,-rpath,$ORIGIN",
    )
    (root / "pkg" / "ext.so").write_bytes(ext)
    missing = serve.unresolved_needed(root, venv, {"libcuda.so.1"})
    assert missing == {"pkg/ext.so": ["libmissing.so"]}
