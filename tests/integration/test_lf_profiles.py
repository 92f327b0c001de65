"""The LLaMA-Factory install profiles, for real: lf-standard (upstream LlamaFactory), lf-kt (serving and
fine-tuning with llamafactory-kt) and the upgrade of the first into the second, each in a fresh venv
by hash, trained in with LlamaFactory itself (verify/probes/lf_control.py). The CUDA torch build they pin
(several GB) comes through uv's cache."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from base.interpreters import current
from carriers import load
from carriers.assemble import assemble
from verify import lf as verify_lf
from verify import serve
from verify.venv import fresh_venv, install_published, venv_json

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.network


@pytest.fixture(scope="module")
def lf_dist(tmp_path_factory: pytest.TempPathFactory, kt_wheel: Path) -> Path:
    dist = tmp_path_factory.mktemp("lf") / "dist"
    assemble(load(), kt_wheel, dist)
    return dist


def test_standard_profile_is_upstream_and_refuses_use_kt(lf_dist: Path, tmp_path: Path) -> None:
    r = verify_lf.verify_standard(lf_dist, tmp_path, current())
    assert {k: [o["name"] for o in v] for k, v in r["owners"].items()} == {p: [p] for p in verify_lf.STANDARD_PACKAGES}
    assert r["control"]["kt_blocks"] == 0
    assert r["control"]["resume_diffs"] == []
    assert "pip install kt-kernel" in r["refused"]["use_kt"]  # upstream's message: what to install


def test_kt_profile_owns_every_package_and_dispatches_only_when_configured(lf_dist: Path, tmp_path: Path) -> None:
    r = verify_lf.verify_kt(lf_dist, tmp_path, current())
    assert {k: len(v) for k, v in r["owners"].items()} == dict.fromkeys(verify_lf.KT_PACKAGES, 1)
    assert r["owners"]["llamafactory"] == ["llamafactory-kt 0.9.5.post1"]
    assert r["control_kt"]["kt_blocks"] == r["control_kt"]["blocks"] > 0  # use_kt: every MoE block
    assert r["control_plain"]["kt_blocks"] == 0  # not configured: none
    assert r["control_kt"]["resume_diffs"] == []
    assert r["control_kt"]["expert_adapter_saved"]
    assert r["llamafactory"]["check_dependencies"] == "ok"
    assert r["llamafactory"]["xgrammar"] == "xgrammar"  # its library found through the renamed xgrammar-kt
    assert r["llamafactory"]["is_transformers_version_greater_than('5.0.0')"] is True
    assert "packing: false" in r["refused"]["packing_with_kt"]
    assert "on meta. Set `use_cpu: true`" in r["refused"]["model_off_cpu"]


def test_standard_environment_upgrades_to_kt_through_kt_doctor(lf_dist: Path, tmp_path: Path) -> None:
    r = verify_lf.verify_upgrade(lf_dist, tmp_path, current())
    assert r["conflicts_reported"] == sorted(verify_lf.STANDARD_PACKAGES)
    assert r["torch"]["before"] == r["torch"]["after"]
    assert all(len(v) == 1 and "-kt " in v[0] for k, v in r["owners"].items() if k != "sgl_kernel")
    assert r["control_kt"]["kt_blocks"] == r["control_kt"]["blocks"]


# --- serving on CPU and kt-doctor --run, in one serve + fine-tuning environment of this release ----------


@pytest.fixture(scope="module")
def kt_venv(lf_dist: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """ktransformers[serve,sft] and llamafactory-kt from lf_dist, by hash: its published lf-kt install file."""
    work = tmp_path_factory.mktemp("kt-venv")
    venv = fresh_venv(work / "venv")
    install_published(venv, lf_dist, "lf-kt")
    return venv


def _site(venv: Path) -> Path:
    return next(venv.glob("lib/python3*/site-packages"))


def test_sglang_serves_a_kimi_tokenizer_and_json_schema_grammars_on_cpu(kt_venv: Path, tmp_path: Path) -> None:
    found = serve.serving_checks(kt_venv, tmp_path)  # VerifyError naming the first difference otherwise
    tok, grammar = found["tokenizer"], found["json_schema"]
    assert tok["native_equal"] is True
    assert tok["class"] == "TikTokenTokenizer"  # the remote code's slow tokenizer, not a fast conversion
    assert tok["special_tokens"] == 256
    assert tok["corpus_texts"] >= 15
    assert tok["ids_compared"] > 500
    assert grammar == {"accepted": 1, "rejected": 3, "strict_thinking": "ok"}


def test_without_the_sglang_kt_patch_strict_thinking_fails_on_cpu(kt_venv: Path, tmp_path: Path) -> None:
    """The fault the patch fixes, shown on the unpatched file: reversed in this venv, then put back."""
    (patch,) = (ROOT / "carriers" / "patches" / "sglang-kt").glob("*xgrammar*.patch")
    args = ["patch", "-p1", "--batch", "--no-backup-if-mismatch", "-d", str(_site(kt_venv)), "-i", str(patch)]
    subprocess.run([*args, "--reverse"], check=True, capture_output=True)
    try:
        found = venv_json(kt_venv, "serving probe", str(ROOT / "verify" / "probes" / "serving.py"), str(tmp_path))
    finally:
        subprocess.run(args, check=True, capture_output=True)
    assert found["json_schema"]["strict_thinking"] == "RuntimeError: Unsupported device: cpu"
    assert found["json_schema"]["accepted"] == 1  # the grammar object's own CPU branch was always there


def _doctor(venv: Path, cache: Path, *args: str, **env: str) -> tuple[int, dict[str, Any]]:
    run_env = {k: v for k, v in os.environ.items() if k != "KT_KERNEL_CPU_VARIANT"}
    run_env.update(KT_KERNEL_CACHE_DIR=str(cache), **env)
    proc = subprocess.run(
        [str(venv / "bin" / "kt-doctor"), "--run", "--json", *args],
        capture_output=True,
        text=True,
        check=False,
        env=run_env,
    )
    assert proc.returncode in (0, 1), proc.stderr
    return proc.returncode, {c["name"]: c for c in json.loads(proc.stdout)["checks"]}


@pytest.fixture(scope="module")
def payload_cache(kt_venv: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    cache = tmp_path_factory.mktemp("payload-cache")
    env = {**os.environ, "KT_KERNEL_CACHE_DIR": str(cache)}
    proc = subprocess.run(
        [str(kt_venv / "bin" / "python"), "-m", "kt_kernel.payload", "materialize"],
        capture_output=True,
        text=True,
        check=False,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    return Path(proc.stdout.strip())


def test_kt_doctor_run_is_clean_in_a_fresh_environment(kt_venv: Path, payload_cache: Path) -> None:
    code, checks = _doctor(kt_venv, payload_cache.parent)
    assert code == 0, checks
    assert checks["cpu"]["state"] == "ok"
    assert checks["cpu"]["data"]["moe_max_rel_error"] < 0.03
    assert checks["payload"]["state"] == "ok"
    assert checks["payload"]["data"]["materialized"] is True
    assert checks["needed"]["state"] == "ok"
    assert checks["gpu"]["state"] == "skipped" or checks["gpu"]["state"] == "ok"
    if checks["gpu"]["state"] == "skipped":
        assert "no CUDA device" in checks["gpu"]["detail"]  # it says why
    deep_code, deep = _doctor(kt_venv, payload_cache.parent, "--deep")
    assert deep_code == 0
    assert "sha256" in deep["payload"]["detail"]


def test_kt_doctor_run_names_a_forced_variant(kt_venv: Path, payload_cache: Path) -> None:
    _, checks = _doctor(kt_venv, payload_cache.parent)
    best = checks["cpu"]["data"]["best"]
    ladder = json.loads((ROOT / "kernel" / "python" / "kt_kernel" / "cpu_variants.json").read_text())["variants"]
    # another variant than the one this host gets: a slower one it runs, or (on the lowest) one it may not
    other = ladder[0]["name"] if best != ladder[0]["name"] else ladder[-1]["name"]
    code, checks = _doctor(kt_venv, payload_cache.parent, KT_KERNEL_CPU_VARIANT=other)
    assert code == 1
    assert checks["cpu"]["state"] == "problem"
    assert checks["cpu"]["fix"] == "unset KT_KERNEL_CPU_VARIANT"
    code, checks = _doctor(kt_venv, payload_cache.parent, KT_KERNEL_CPU_VARIANT="avx3")
    assert code == 1
    assert "is not a CPU variant" in checks["cpu"]["detail"]


def test_kt_doctor_run_finds_a_truncated_payload_file(kt_venv: Path, payload_cache: Path) -> None:
    lib = payload_cache / "kt_kernel" / "cuda" / "lib" / "libkt_cuda.so"
    data = lib.read_bytes()
    lib.write_bytes(data[:1000])
    try:
        code, checks = _doctor(kt_venv, payload_cache.parent)
    finally:
        lib.write_bytes(data)
    assert code == 1
    assert checks["payload"]["state"] == "problem"
    assert (
        f"kt_kernel/cuda/lib/libkt_cuda.so is 1000 bytes, the manifest says {len(data)}" in checks["payload"]["detail"]
    )
    assert checks["payload"]["fix"].startswith("python -m kt_kernel.payload materialize")


def test_kt_doctor_run_names_a_library_built_for_another_cuda_major(
    kt_venv: Path, payload_cache: Path, tmp_path: Path
) -> None:
    have = sorted(p.name for p in _site(kt_venv).glob("nvidia/*/lib/libcudart.so.*"))
    assert have, "the serve closure's torch brings its CUDA runtime"
    other = "12" if not any(n.endswith(".so.12") for n in have) else "11"
    (tmp_path / "stub.c").write_text("int cudart_stub(void) { return 0; }\n")
    (tmp_path / "user.c").write_text("int cudart_stub(void);\nint f(void) { return cudart_stub(); }\n")
    gcc = ["gcc", "-shared", "-fPIC"]
    subprocess.run(
        [
            *gcc,
            f"-Wl,-soname,libcudart.so.{other}",
            "-o",
            str(tmp_path / f"libcudart.so.{other}"),
            str(tmp_path / "stub.c"),
        ],
        check=True,
    )
    planted = payload_cache / "kt_kernel" / "cuda" / "lib" / "libneeds_other_cuda.so"
    subprocess.run(
        [*gcc, "-o", str(planted), str(tmp_path / "user.c"), f"-L{tmp_path}", f"-l:libcudart.so.{other}"], check=True
    )
    try:
        code, checks = _doctor(kt_venv, payload_cache.parent)
    finally:
        planted.unlink()
    assert code == 1
    assert checks["needed"]["state"] == "problem"
    detail = checks["needed"]["detail"]
    assert (
        f"libneeds_other_cuda.so needs libcudart.so.{other}; this environment has {have[0]} (another CUDA major)"
        in detail
    )
