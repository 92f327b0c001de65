"""The repaired kt-kernel wheel, installed by hash into a fresh venv."""

from __future__ import annotations

import json
import shutil
import zipfile
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import KT_SRC, ROOT
from tests.integration.conftest import SCRIPTS, Venv

# The ladder's feature names (iced-x86) as the Linux kernel spells them in /proc/cpuinfo: the independent
# source that decides which variants this host must run (never kt_kernel's own detection, which is under
# test); the glibc proof runs the variants by the same map.
from verify.glibc_proof import CPUINFO_FLAG

LADDER = json.loads((KT_SRC / "cpu_variants.json").read_text())["variants"]
VARIANTS = [v["name"] for v in LADDER]
# Numerics bounds, relative L2 (scripts/numerics.py, fixed seeds), each measured on the avx2 variant
# with the margin stated. The kernel quantizes activations per token, so its own error is ~2% on
# every path (measured max 2.1%); the ceiling leaves 1.4x for the other variants' arithmetic.
REL_TOL = 3e-2
# The largest element error, relative to the largest output (measured max 2.7%, margin ~1.8x).
MAX_TOL = 5e-2
# The quantizer's own error (decoded weights vs the fp32 originals; deterministic for the seed):
# measured int8 0.70%, rawint4 g32 9.7%, g64 10.8%, g128 11.7%; margin ~1.1-1.4x.
QUANT_TOL = {("int8", 0): 0.01, ("rawint4", 32): 0.11, ("rawint4", 64): 0.12, ("rawint4", 128): 0.13}
# What a user sees (kernel vs fp32 on the original weights; the SiLU-gated product amplifies
# int4's weight error): measured int8 2.4%, g32 19.6%, g64 22.6%, g128 24.0%; margin ~1.15x.
E2E_TOL = {("int8", 0): 0.035, ("rawint4", 32): 0.225, ("rawint4", 64): 0.26, ("rawint4", 128): 0.275}


def out_of_bounds(cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The numerics cases (scripts/numerics.py) outside any of their bounds."""
    return [
        c
        for c in cases
        if not (
            c["rel_err"] < REL_TOL
            and c["max_err"] < MAX_TOL
            and c["quant_err"] < QUANT_TOL[(c["fmt"], c["group"])]
            and c["e2e_err"] < E2E_TOL[(c["fmt"], c["group"])]
        )
    ]


def cpuinfo_flags() -> set[str]:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    pytest.fail("/proc/cpuinfo has no flags line")


def missing_on_host(variant: str) -> list[str]:
    features = next(v["features"] for v in LADDER if v["name"] == variant)
    flags = cpuinfo_flags()
    return [f for f in features if CPUINFO_FLAG[f] not in flags]


def skip_unless_host_runs(variant: str, elsewhere: str = "") -> None:
    """Skip, saying which CPU features this host lacks for `variant` (and where else it is covered)."""
    missing = missing_on_host(variant)
    if missing:
        pytest.skip(
            f"this host cannot run {variant}: /proc/cpuinfo lacks {', '.join(CPUINFO_FLAG[f] for f in missing)}"
            + (f" ({elsewhere})" if elsewhere else "")
        )


def test_every_ladder_feature_has_a_cpuinfo_name() -> None:
    assert {f for v in LADDER for f in v["features"]} <= set(CPUINFO_FLAG)


@pytest.mark.parametrize("variant", VARIANTS)
def test_detection_agrees_with_proc_cpuinfo(variant: str, host_report: dict[str, Any]) -> None:
    """kt_kernel's CPUID/XGETBV detection against the kernel's own view: under-reporting would
    silently skip variants (and ship slower code); over-reporting would SIGILL."""
    expected = not missing_on_host(variant)
    assert host_report["variants"][variant]["usable"] == expected, host_report["variants"][variant]["why"]


def test_wheel_is_repaired_and_carries_the_manifest(kt_wheel: Path) -> None:
    assert "manylinux_" in kt_wheel.name
    with zipfile.ZipFile(kt_wheel) as zf:
        manifest = json.loads(zf.read("kt_kernel/_build.json"))
        names = set(zf.namelist())
    import jsonschema

    schema = json.loads((ROOT / "audits" / "schemas" / "build-manifest.schema.json").read_text())
    jsonschema.validate(manifest, schema)
    assert manifest["schema_version"] == 1
    assert sorted(manifest["variants"]) == sorted(VARIANTS)
    for name, entry in manifest["variants"].items():
        assert entry["file"] in names, name
        assert entry["features"] == next(v["features"] for v in LADDER if v["name"] == name)


def test_the_glibc_floor_gives_manylinux_2_24_on_any_build_host_as_auditwheel_shows_it(kt_wheel: Path) -> None:
    """Linked against glibc 2.28's stubs (kernel/tools/glibc_floor.py), not the build host's glibc: no ELF needs a
    GLIBC_ version above 2.28 (today 2.16, and GLIBCXX_3.4.22, which makes it manylinux_2_24), and the tag the
    build chose is the one `auditwheel show` and the audit's own verdict give."""
    import subprocess
    import sys

    from audits import manylinux
    from audits.readers import read_wheel

    assert kt_wheel.name.endswith("-manylinux_2_24_x86_64.whl"), kt_wheel.name
    w = read_wheel(kt_wheel)
    needs = [(m, v) for m, e in w.elfs.items() for lib, vs in e.version_needs for v in vs if v.startswith("GLIBC_")]
    too_new = [(m, v) for m, v in needs if manylinux.version_key(v) > (2, 28)]
    assert needs
    assert too_new == []
    assert manylinux.honest_platform(list(w.elfs.values()))[0] == "manylinux_2_24_x86_64"
    shown = subprocess.run(
        [sys.executable, "-m", "auditwheel", "show", str(kt_wheel)], capture_output=True, text=True, check=False
    )
    assert '"manylinux_2_24_x86_64"' in " ".join(shown.stdout.split()), shown.stdout


def test_import_reports_a_variant(fresh_venv: Venv, host_report: dict[str, Any]) -> None:
    assert host_report["selected"] in VARIANTS
    assert host_report["variants"][host_report["selected"]]["usable"]
    text = fresh_venv.run("-c", "import kt_kernel; print(kt_kernel.cpu_report())").stdout
    assert f"selected: {host_report['selected']} (best usable)" in text


def test_override_to_unknown_variant_is_a_clear_import_error(fresh_venv: Venv) -> None:
    proc = fresh_venv.run("-c", "import kt_kernel", env={"KT_KERNEL_CPU_VARIANT": "avx3"}, check=False)
    assert proc.returncode == 1
    assert "KT_KERNEL_CPU_VARIANT='avx3' is not a CPU variant" in proc.stderr
    assert "avx512_vnni" in proc.stderr


@pytest.mark.parametrize("variant", VARIANTS)
def test_variant_matches_torch_fp32_reference(variant: str, fresh_venv: Venv) -> None:
    skip_unless_host_runs(variant)
    result = fresh_venv.json(str(SCRIPTS / "numerics.py"), env={"KT_KERNEL_CPU_VARIANT": variant})
    assert result["variant"] == variant
    cases = result["cases"]
    # 4 formats x 5 expert counts x 4 token counts x 2 dtypes, and the tail shape for the 3 formats
    # whose group divides 192 (scripts/numerics.py)
    assert len(cases) == 4 * 5 * 4 * 2 + 3 * 4 * 2
    assert {(c["hidden"], c["inter"]) for c in cases} == {(256, 128), (320, 192)}
    measured: dict[tuple[str, int, str], dict[str, float]] = {}
    for c in cases:
        row = measured.setdefault((c["fmt"], c["group"], c["dtype"]), {})
        for k in ("rel_err", "max_err", "quant_err", "e2e_err"):
            row[k] = max(row.get(k, 0.0), c[k])
    table = "\n".join(
        f"  {variant} {f} g{g} {d}: " + ", ".join(f"{k} {v:.4f}" for k, v in row.items())
        for (f, g, d), row in sorted(measured.items())
    )
    print(f"measured numeric error (max over experts x tokens):\n{table}")
    bad = out_of_bounds(cases)
    assert not bad, f"{len(bad)} cases above their bounds:\n{table}\nfirst: {bad[:3]}"


def test_refused_override_names_missing_features(fresh_venv: Venv, host_report: dict[str, Any]) -> None:
    """A forced variant the CPU lacks features for fails the import, naming them. A host that runs every
    variant (AMX included) refuses nothing, so there the same import runs on an emulated Haswell
    (qemu-user, no AVX-512), which must refuse the top variant."""
    refused = [n for n in VARIANTS if not host_report["variants"][n]["usable"]]
    prefix: tuple[str, ...] = ()
    if not refused:
        qemu = shutil.which("qemu-x86_64")
        if qemu is None:
            pytest.skip("this host runs every variant and qemu-x86_64 (Debian qemu-user) is not installed")
        prefix, refused = (qemu, "-cpu", "Haswell"), [VARIANTS[-1]]
    proc = fresh_venv.run(
        "-c", "import kt_kernel", env={"KT_KERNEL_CPU_VARIANT": refused[-1]}, check=False, prefix=prefix
    )
    assert proc.returncode == 1
    assert f"KT_KERNEL_CPU_VARIANT={refused[-1]} cannot run on this CPU" in proc.stderr
    assert "missing" in proc.stderr


THREADS_SCRIPT = """
import os, threading, numpy as np, kt_kernel as kk
rng = np.random.default_rng(0)
q = [kk.quantize(rng.standard_normal((5, 128, 128), dtype=np.float32), "rawint4", 32) for _ in range(3)]
m = kk.MoE(*q)
x = rng.standard_normal((17, 128), dtype=np.float32)
ids = np.stack([rng.permutation(5)[:3] for _ in range(17)])
w = rng.random((17, 3), dtype=np.float32)
ref = m(x, ids, w, num_threads=1)
assert all(np.array_equal(m(x, ids, w, num_threads=t), ref) for t in (2, 3, 8)), "thread count changed the result"
pid = os.fork()
if pid == 0:  # the worker pool must not be inherited half-alive
    os._exit(0 if np.array_equal(m(x, ids, w, num_threads=2), ref) else 3)
assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0, "forked child failed"
out = []
ts = [threading.Thread(target=lambda: out.append(np.array_equal(m(x, ids, w, num_threads=2), ref))) for _ in range(8)]
[t.start() for t in ts]
[t.join() for t in ts]
assert out == [True] * 8, out
print("ok")
"""


def test_threads_fork_and_concurrent_callers(fresh_venv: Venv) -> None:
    """Results do not depend on the thread count; a forked child and 8 concurrent Python threads work."""
    assert fresh_venv.run("-c", THREADS_SCRIPT, timeout=300).stdout.strip() == "ok"


NUM_THREADS_SCRIPT = """
import json, numpy as np, kt_kernel as kk
rng = np.random.default_rng(0)
q = [kk.quantize(rng.standard_normal((3, 64, 64), dtype=np.float32), "int8") for _ in range(3)]
m = kk.MoE(*q)
x = rng.standard_normal((4, 64), dtype=np.float32)
ids = np.array([[0, 2]] * 4)
w = np.ones((4, 2), np.float32)
try:
    print(json.dumps({"same": bool(np.array_equal(m(x, ids, w), m(x, ids, w, num_threads=1)))}))
except kk.KTKernelError as exc:
    print(json.dumps({"error": str(exc)}))
"""


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("3", {"same": True}),
        ("abc", {"error": "KT_KERNEL_NUM_THREADS='abc' is not an integer"}),
        ("0", {"error": "KT_KERNEL_NUM_THREADS='0' must be >= 1"}),
    ],
)
def test_num_threads_variable(fresh_venv: Venv, value: str, expected: dict[str, Any]) -> None:
    assert fresh_venv.json("-c", NUM_THREADS_SCRIPT, env={"KT_KERNEL_NUM_THREADS": value}) == expected


def test_nan_and_inf_activations_propagate(fresh_venv: Venv) -> None:
    """A token with a NaN or an infinity gets a NaN output row (quantizing it used to give finite,
    wrong numbers: silent corruption in a training loop); every other token is bit-for-bit unchanged."""
    for result in fresh_venv.json(str(SCRIPTS / "nan_propagation.py")):
        where = f"{result['variant']} {result['fmt']} {result['dtype']}"
        assert result["nan_rows"] == [1, 3], where
        assert result["finite_rows"] == [0, 2, 4, 5], where
        assert result["others_unchanged"], where


QUANTIZE_ERRORS_SCRIPT = """
import json, numpy as np, kt_kernel as kk
cases = {
    "cols": (np.zeros((1, 4, 96), np.float32), "int8", 64),
    "group_divides": (np.zeros((1, 4, 64), np.float32), "rawint4", 128),
    "group_size": (np.zeros((1, 4, 64), np.float32), "rawint4", 48),
    "ndim": (np.zeros((4, 64), np.float32), "int8", 64),
    "format": (np.zeros((1, 4, 64), np.float32), "fp8", 64),
}
out = {}
for name, (w, fmt, g) in cases.items():
    try:
        kk.quantize(w, fmt, g)
        out[name] = None
    except kk.KTKernelError as exc:
        out[name] = str(exc)
print(json.dumps(out))
"""


def test_quantize_refuses_bad_shapes_with_a_clear_error(fresh_venv: Venv) -> None:
    """Each shape or option quantize cannot take is a KTKernelError naming it (a group size that
    does not divide the columns was a numpy reshape traceback)."""
    got = fresh_venv.json("-c", QUANTIZE_ERRORS_SCRIPT)
    assert got == {
        "cols": "cols must be a multiple of 64 (got 96); pad the weights",
        "group_divides": "cols (64) must be a multiple of group_size (128); choose a group size that divides it",
        "group_size": "group_size must be one of (32, 64, 128), got 48",
        "ndim": "weights must be 3-D [experts, rows, cols], got shape (4, 64)",
        "format": "unknown weight format 'fp8'; use one of ('int8', 'rawint4')",
    }


def test_a_tokens_output_does_not_depend_on_its_batch(fresh_venv: Venv) -> None:
    """A token alone and the same token among 22 others (so its expert runs the blocked paths: 4 pairs
    per pass over the weights, then a rest of 3, 2 or 1; AMX tiles) give the same output bit for bit, in
    every format."""
    result = fresh_venv.json(str(SCRIPTS / "batch_invariance.py"))
    assert result.pop("variant")
    assert result == {"int8/64": True, "rawint4/32": True, "rawint4/64": True, "rawint4/128": True}


def test_wheel_states_its_license_and_ships_the_cuda_runtimes(kt_wheel: Path) -> None:
    """kt-kernel's license text, and (a CUDA build links the runtime statically) NVIDIA's, listed in METADATA."""
    from packaging.metadata import Metadata

    with zipfile.ZipFile(kt_wheel) as zf:
        di = next(n.split("/")[0] for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        meta = Metadata.from_email(zf.read(f"{di}/METADATA").decode(), validate=True)
        names = set(zf.namelist())
        cuda = json.loads(zf.read("kt_kernel/_build.json")).get("cuda")
    assert meta.license_files is not None
    assert "LICENSE" in meta.license_files
    if cuda:  # the tests session builds with CUDA
        assert str(meta.license_expression) == "Apache-2.0 AND LicenseRef-NVIDIA-Proprietary"
        assert "third_party/nvidia-cuda-runtime/License.txt" in meta.license_files
    else:
        assert str(meta.license_expression) == "Apache-2.0"
    assert all(f"{di}/licenses/{f}" in names for f in meta.license_files)
