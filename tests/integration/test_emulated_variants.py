"""Every CPU variant's numerics on any x86-64 host: test-only builds of the six variants whose
intrinsics SIMDe provides in portable code (and amx_model.h the AMX tiles) run the numerics suite
against the same bounds as the real variants; on a host that has a variant's features the emulated
and native results are compared case by case; a deliberately broken VBMI permute is caught. The
shipped wheel never holds emulated code (test_kernel_wheel and the ISA audit check the real one)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

import pytest

from base import paths
from tests.conftest import ROOT
from tests.integration.conftest import SCRIPTS, Venv
from tests.integration.test_kernel_wheel import VARIANTS, missing_on_host, out_of_bounds
from tests.integration.test_sft import report, sft_problems

CACHE = ROOT / "build" / "cache" / "simde"


def _tool(name: str) -> str:
    beside = Path(sys.executable).with_name(name)
    found = str(beside) if beside.is_file() else shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is missing: lockfiles/test.txt (via toolchain.txt) pins it; run nox -s tests")
    return found


@pytest.fixture(scope="session")
def simde() -> Path:
    """SIMDe's headers from the simde-py sdist, fetched by the hash lockfiles/emulation.txt pins."""
    include = CACHE / "simde_py-0.8.2.post1" / "simde_py" / "simde"
    if not (include / "simde" / "x86" / "avx512.h").is_file():
        CACHE.mkdir(parents=True, exist_ok=True)
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--quiet",
                "--no-deps",
                "--no-binary",
                ":all:",
                "--require-hashes",
                "-r",
                str(ROOT / "lockfiles" / "emulation.txt"),
                "-d",
                str(CACHE),
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.returncode != 0:
            pytest.fail(f"fetching SIMDe (lockfiles/emulation.txt) failed:\n{proc.stderr[-2000:]}")
        (sdist,) = CACHE.glob("simde_py-*.tar.gz")
        with tarfile.open(sdist) as tar:
            tar.extractall(CACHE, filter="data")
    return include


def build_emulated(
    src: Path, out: Path, simde: Path, base: Path, targets: tuple[str, ...] = ("kt_emulated_variants",)
) -> Path:
    """The emulated variants of the kernel source tree `src`, built with its own CMakeLists into `out`.

    `base` holds `src` as kernel/, `out` as build/emulated/ and SIMDe under build/cache/simde/, the
    layout of this repository: ccache (the CMakeLists' compiler launcher) then sees every path relative
    to `base` (CCACHE_BASEDIR), so a translation unit whose preprocessed text is the same hits the
    cache from any checkout or temporary copy, and one a mutation changes is compiled again."""
    assert src == base / "kernel", src
    assert out == base / "build" / "emulated", out
    assert simde.is_relative_to(base / "build" / "cache" / "simde"), simde
    env = {
        **os.environ,
        "CMAKE_BUILD_PARALLEL_LEVEL": str(os.cpu_count() or 2),
        "CCACHE_BASEDIR": str(base),
        "CCACHE_NOHASHDIR": "1",  # no -g here: the working directory is in no object
    }
    configure = [
        _tool("cmake"),
        "-S",
        str(src),
        "-B",
        str(out),
        "-G",
        "Ninja",
        f"-DCMAKE_MAKE_PROGRAM={_tool('ninja')}",
        "-DCMAKE_BUILD_TYPE=Release",
        "-DKT_EMULATED_VARIANTS=ON",
        f"-DKT_SIMDE_INCLUDE={simde}",
        f"-DPython_EXECUTABLE={sys.executable}",
    ]
    for cmd in (configure, [_tool("cmake"), "--build", str(out), "--target", *targets]):
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env)
        if proc.returncode != 0:
            pytest.fail(f"{' '.join(cmd[:4])} ... failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return out / "emulated"


@pytest.fixture(scope="session")
def emulated(simde: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    t0 = time.perf_counter()
    libs = build_emulated(ROOT / "kernel", paths.EMULATED, simde, ROOT)
    print(f"emulated variants built in {time.perf_counter() - t0:.1f}s: {sorted(p.name for p in libs.glob('*.so'))}")
    return libs


def _numerics(venv: Venv, lib: Path, *args: str) -> dict[str, Any]:
    result: dict[str, Any] = venv.json(
        str(SCRIPTS / "emulated_numerics.py"), *args, env={"KT_TEST_VARIANT_LIBRARY": str(lib)}
    )
    return result


@pytest.mark.parametrize("variant", VARIANTS)
def test_emulated_variant_matches_the_reference(variant: str, emulated: Path, fresh_venv: Venv) -> None:
    lib = emulated / f"libkt_cpu_{variant}.so"
    assert lib.is_file(), f"{lib} was not built"
    t0 = time.perf_counter()
    result = _numerics(fresh_venv, lib)
    took = time.perf_counter() - t0
    assert result["variant"] == f"{variant}-emulated"
    cases = result["cases"]
    # formats x expert counts x token counts x fp32/bf16, and the tail shape for three formats
    assert len(cases) == 4 * 5 * 4 * 2 + 3 * 4 * 2
    worst = {k: max(c[k] for c in cases) for k in ("rel_err", "max_err", "e2e_err")}
    print(
        f"{variant} (emulated): {len(cases)} cases in {took:.1f}s; worst "
        + ", ".join(f"{k} {v:.4f}" for k, v in worst.items())
    )
    bad = out_of_bounds(cases)
    assert not bad, f"{len(bad)} cases out of bounds; first: {bad[:3]}"
    if missing_on_host(variant):
        return  # nothing native to compare with here
    native: dict[str, Any] = fresh_venv.json(str(SCRIPTS / "numerics.py"), env={"KT_KERNEL_CPU_VARIANT": variant})
    assert native["variant"] == variant
    for e, n in zip(cases, native["cases"], strict=True):
        key = tuple(e[k] for k in ("fmt", "group", "experts", "hidden", "inter", "tokens", "dtype"))
        assert key == tuple(n[k] for k in ("fmt", "group", "experts", "hidden", "inter", "tokens", "dtype"))
        # same algorithm, rounding may differ (FMA contraction, reduction order): far below the bounds
        assert abs(e["rel_err"] - n["rel_err"]) < 2e-3, (key, e["rel_err"], n["rel_err"])


def _mutant(simde: Path, tmp: Path, source: str, good: str, bad: str, variant: str) -> Path:
    """The emulated `variant` built from a copy of kernel/ whose `source` has `good` replaced by `bad`."""
    src = tmp / "kernel"
    shutil.copytree(ROOT / "kernel", src, ignore=shutil.ignore_patterns("build", "__pycache__", "python"))
    (src / "python").mkdir()
    shutil.copytree(
        ROOT / "kernel" / "python" / "kt_kernel",
        src / "python" / "kt_kernel",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    path = src / source
    text = path.read_text()
    assert text.count(good) == 1, f"{good!r} moved in kernel/{source}; update this mutation"
    path.write_text(text.replace(good, bad))
    # SIMDe where this repository keeps it, so that the copy's paths are the checkout's (build_emulated)
    (tmp / "build" / "cache").mkdir(parents=True)
    (tmp / "build" / "cache" / "simde").symlink_to(CACHE, target_is_directory=True)
    mirrored = tmp / "build" / "cache" / "simde" / simde.relative_to(CACHE)
    out = build_emulated(src, tmp / "build" / "emulated", mirrored, tmp, (f"kt_cpu_{variant}_emulated",))
    return out / f"libkt_cpu_{variant}.so"


def test_a_wrong_vbmi_permute_is_caught(simde: Path, tmp_path: Path, fresh_venv: Venv) -> None:
    """The nibble-unpacking permute of avx512_vbmi with two table entries swapped: the numerics
    of every RAWINT4 case leave their bounds (that path has no other coverage on most hosts)."""
    good = "_mm512_set_epi8(7, 6, 5, 4, 3, 2, 1, 0, 15, 14, 13, 12, 11, 10, 9, 8,"
    bad = "_mm512_set_epi8(6, 7, 5, 4, 3, 2, 1, 0, 15, 14, 13, 12, 11, 10, 9, 8,"
    lib = _mutant(simde, tmp_path, "src/cpu/dot.h", good, bad, "avx512_vbmi")
    cases = _numerics(fresh_venv, lib, "--quick")["cases"]
    broken = out_of_bounds(cases)
    assert broken, "a wrong permute went unnoticed"
    assert {c["fmt"] for c in broken} == {"rawint4"}


def test_a_wrong_amx_bf16_tile_is_caught(simde: Path, tmp_path: Path, fresh_venv: Venv) -> None:
    """The backward's AMX-BF16 product (amx variant, >= 16 pairs per expert) reading its second
    column block's weights one column off: the gradients of the 48-token cases (the ones with that
    many pairs) leave their bounds, the others stay within them, so the tile path is the one tested."""
    good = "_tile_loadd(5, b + 16, 256);"
    lib = _mutant(simde, tmp_path, "src/cpu/amx.cpp", good, good.replace("16", "17", 1), "amx")
    result = fresh_venv.json(str(SCRIPTS / "sft_grads.py"), "--quick", env={"KT_TEST_VARIANT_LIBRARY": str(lib)})
    broken = {c["tokens"] for c in result["cases"] if max(c["err"][k] for k in ("x", "w", "gate_a", "up_b")) > 0.1}
    assert broken == {48}, [(c["tokens"], c["err"]) for c in result["cases"]]


def test_a_wrong_amx_int8_tile_is_caught(simde: Path, tmp_path: Path, fresh_venv: Venv) -> None:
    """The forward's AMX-INT8 product (amx variant, INT8 experts with >= 6 pairs) taking the first
    token tile where the second belongs for the up (or second down) rows: INT8 cases with more than 16
    pairs an expert leave their bounds; RAWINT4 and the few-token cases, which never reach a second
    tile, stay within."""
    good = "_tile_dpbssd(3, 5, 7);"
    lib = _mutant(simde, tmp_path, "src/cpu/amx.cpp", good, "_tile_dpbssd(3, 5, 6);", "amx")
    broken = out_of_bounds(_numerics(fresh_venv, lib, "--quick")["cases"])
    assert broken, "a wrong AMX token tile went unnoticed"
    assert {c["fmt"] for c in broken} == {"int8"}
    assert not [c for c in broken if c["tokens"] < 16], broken


@pytest.mark.parametrize("variant", VARIANTS)
def test_emulated_variant_propagates_nan(variant: str, emulated: Path, fresh_venv: Venv) -> None:
    results = fresh_venv.json(
        str(SCRIPTS / "nan_propagation.py"), env={"KT_TEST_VARIANT_LIBRARY": str(emulated / f"libkt_cpu_{variant}.so")}
    )
    for result in results:
        assert result["variant"] == f"{variant}-emulated"
        assert (result["nan_rows"], result["finite_rows"]) == ([1, 3], [0, 2, 4, 5]), result
        assert result["others_unchanged"], result


@pytest.mark.parametrize("variant", VARIANTS)
def test_emulated_variant_is_batch_invariant(variant: str, emulated: Path, fresh_venv: Venv) -> None:
    """Each variant's blocked paths (pairs per pass, AMX tiles) give a token the output it gets alone."""
    lib = emulated / f"libkt_cpu_{variant}.so"
    result = fresh_venv.json(str(SCRIPTS / "batch_invariance.py"), env={"KT_TEST_VARIANT_LIBRARY": str(lib)})
    assert result.pop("variant") == f"{variant}-emulated"
    assert all(result.values()), result


@pytest.mark.parametrize("variant", VARIANTS)
def test_emulated_variant_sft_gradients(variant: str, emulated: Path, fresh_venv: Venv) -> None:
    """kt_kernel.sft's forward (the variant's emulated ISA code) and backward against torch autograd."""
    result = fresh_venv.json(
        str(SCRIPTS / "sft_grads.py"),
        "--quick",
        env={"KT_TEST_VARIANT_LIBRARY": str(emulated / f"libkt_cpu_{variant}.so")},
    )
    assert result["variant"] == f"{variant}-emulated"
    print(report(result))
    bad = sft_problems(result, quick=True)
    assert not bad, "\n".join(bad)


def test_every_variant_computes_the_same_outputs(emulated: Path, fresh_venv: Venv) -> None:
    """silu is the same operations on every variant (moe_grad.h) and INT8's integer sums are exact, so
    INT8 outputs agree bit for bit across variants, AMX tiles included. With an expert LoRA the outputs
    depend on every bit of silu (the down projection's A reads h in fp32): every emulated build agrees,
    amx's vector LoRA epilogue (lora_b_tile) with the other paths' element-by-element fma (a build whose
    avx2 silu used std::exp again did not), and so do the native AVX-512 ones; natively avx2's fp32 dots
    of the LoRA A terms sum 8 lanes to a vector, not 16. RAWINT4 sums floats 16 lanes to a vector on the
    AVX-512 variants (the same outputs) and 8 on avx2. Emulated and native builds are not compared with
    each other (no FMA contraction in the emulated builds' scalar code)."""
    emu = {v: str(emulated / f"libkt_cpu_{v}.so") for v in VARIANTS}
    native_libs: dict[str, str] = fresh_venv.json(
        "-c",
        "import json, pathlib, kt_kernel as k; root = pathlib.Path(k.__file__).resolve().parent.parent; "
        "print(json.dumps({n: str(root / e['file']) for n, e in k.build_manifest()['variants'].items()}))",
    )
    native = {v: native_libs[v] for v in VARIANTS if v in native_libs and not missing_on_host(v)}
    digests = fresh_venv.json(str(SCRIPTS / "variant_agreement.py"), *emu.values(), *native.values())
    for kind, group in (("emulated", emu), ("native", native)):
        by = {v: digests[lib] for v, lib in group.items()}
        agree = {
            "int8/64": list(by),
            "rawint4/32": [v for v in by if v != "avx2"],
            "rawint4/128": [v for v in by if v != "avx2"],
            "int8/64+lora": [v for v in by if kind == "emulated" or v != "avx2"],
        }
        for name, variants in agree.items():
            values = {v: by[v][name] for v in variants}
            assert len(set(values.values())) <= 1, (kind, name, values)
    print(f"compared: emulated {sorted(emu)}, native {sorted(native)}")


def test_a_variant_with_its_own_silu_is_caught(simde: Path, tmp_path: Path, emulated: Path, fresh_venv: Venv) -> None:
    """avx2's silu through std::exp again (as every variant but amx had it): INT8 without LoRA still
    agrees (an ulp of h rarely moves its int8 rounding), the LoRA case does not, so that case is what
    holds every variant to one silu."""
    good = "  for (; i + kLanes <= n; i += kLanes) vf_store(h + i, mul_v(silu_v(vf_load(g + i)), vf_load(u + i)));\n"
    good += "  for (; i < n; ++i) h[i] = silu(g[i]) * u[i];"
    bad = "  for (; i < n; ++i) h[i] = g[i] / (1.f + std::exp(-g[i])) * u[i];"
    lib = _mutant(simde, tmp_path, "src/cpu/moe_grad.h", good, bad, "avx2")
    ref = str(emulated / "libkt_cpu_avx512_base.so")
    digests = fresh_venv.json(str(SCRIPTS / "variant_agreement.py"), ref, str(lib))
    assert digests[ref]["int8/64+lora"] != digests[str(lib)]["int8/64+lora"], "a second silu went unnoticed"


def test_an_amx_lora_epilogue_that_rounds_twice_is_caught(
    simde: Path, tmp_path: Path, emulated: Path, fresh_venv: Venv
) -> None:
    """amx's vector LoRA epilogue (lora_b_tile) summing B's terms with a multiply, then an add, where every
    other path fuses the two (std::fma): the LoRA case of the agreement check tells it from the rest. (It
    could not before the emulated builds fused their multiply-adds: SIMDe rounded them twice everywhere.)"""
    good = "_mm512_fmadd_ps(_mm512_set1_ps(B[n * rank + k]), lk, _mm512_load_ps(sum[n]))"
    bad = "_mm512_add_ps(_mm512_mul_ps(_mm512_set1_ps(B[n * rank + k]), lk), _mm512_load_ps(sum[n]))"
    lib = _mutant(simde, tmp_path, "src/cpu/moe.cpp", good, bad, "amx")
    ref = str(emulated / "libkt_cpu_amx.so")
    digests = fresh_venv.json(str(SCRIPTS / "variant_agreement.py"), ref, str(lib))
    assert digests[ref]["int8/64"] == digests[str(lib)]["int8/64"]  # the mutation is LoRA's alone
    assert digests[ref]["int8/64+lora"] != digests[str(lib)]["int8/64+lora"], "a twice-rounded epilogue went unnoticed"
