"""kt-lora-convert: KT expert layout <-> PEFT layout on a synthetic adapter of 100,800 tensors
(built in the test with the safetensors library), sharded input, bit-exact round trip, inputs
unchanged, byte-identical outputs, --check, and every error case naming the tensor and file."""

from __future__ import annotations

import hashlib
import json
import resource
import subprocess
import time
from pathlib import Path

import pytest

from tests.integration.conftest import Venv
from tests.integration.test_sft import sft_venv  # noqa: F401  (the venv with safetensors)

LAYERS, EXPERTS, RANK, HIDDEN, INTER = 4, 4200, 2, 8, 4  # 4 x 3 x 2 x 4200 = 100,800 expert tensors

MAKE = """
import json, sys
from pathlib import Path
import numpy as np
from safetensors.numpy import save_file
out, layers, experts, rank, hidden, inter, shards = Path(sys.argv[1]), *map(int, sys.argv[2:8])
rng = np.random.default_rng(0)
tensors = {}
for layer in range(layers):
    base = f"base_model.model.model.layers.{layer}"
    tensors[f"{base}.self_attn.q_proj.lora_A.weight"] = rng.standard_normal((rank, hidden), dtype=np.float32)
    tensors[f"{base}.self_attn.q_proj.lora_B.weight"] = rng.standard_normal((hidden, rank), dtype=np.float32)
    for e in range(experts):
        shapes = (("gate_proj", (hidden, inter)), ("up_proj", (hidden, inter)), ("down_proj", (inter, hidden)))
        for proj, (i, o) in shapes:
            stem = f"{base}.mlp.experts.{e}.{proj}"
            tensors[f"{stem}.lora_A.weight"] = rng.standard_normal((rank, i), dtype=np.float32)
            tensors[f"{stem}.lora_B.weight"] = rng.standard_normal((o, rank), dtype=np.float32).astype(np.float16)
out.mkdir(parents=True)
names = sorted(tensors)
if shards == 1:
    save_file(tensors, str(out / "adapter_model.safetensors"))
else:
    weight_map = {}
    for s in range(shards):
        part = names[s::shards]
        fname = f"adapter_model-{s + 1:05d}-of-{shards:05d}.safetensors"
        save_file({n: tensors[n] for n in part}, str(out / fname))
        weight_map.update({n: fname for n in part})
    (out / "adapter_model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
print(json.dumps({"tensors": len(tensors)}))
"""

LOAD_EQUAL = """
import json, sys
from pathlib import Path
import numpy as np
from safetensors.numpy import load_file
def load(p):
    p = Path(p)
    files = [p] if p.is_file() else sorted(p.glob("*.safetensors"))
    out = {}
    for f in files:
        out.update(load_file(str(f)))
    return out
a, b = load(sys.argv[1]), load(sys.argv[2])
same = a.keys() == b.keys() and all(a[k].dtype == b[k].dtype and a[k].tobytes() == b[k].tobytes() for k in a)
kt = load(sys.argv[3])
stacked = kt["base_model.model.model.layers.1.mlp.experts.down_proj.lora_B.weight"]
print(json.dumps({"same": same, "n": len(a), "kt_n": len(kt), "stacked_shape": list(stacked.shape),
                  "expert_7": bool((stacked[7] == a[
                      "base_model.model.model.layers.1.mlp.experts.7.down_proj.lora_B.weight"]).all())}))
"""


def tree_digest(path: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(path.rglob("*")) if path.is_dir() else [path]:
        if f.is_file():
            h.update(f.relative_to(path).as_posix().encode() if path.is_dir() else b"")
            h.update(f.read_bytes())
    return h.hexdigest()


def convert(venv: Venv, *args: str, check: bool = True) -> tuple[int, str, str]:
    proc = venv.run("-m", "kt_kernel.lora_convert", *args, check=False)
    if check and proc.returncode != 0:
        pytest.fail(f"kt-lora-convert {' '.join(args)} failed:\n{proc.stderr}")
    return proc.returncode, proc.stdout, proc.stderr


@pytest.fixture(scope="module")
def adapter(sft_venv: Venv, tmp_path_factory: pytest.TempPathFactory) -> Path:  # noqa: F811
    out = tmp_path_factory.mktemp("adapter") / "peft"
    sft_venv.run("-c", MAKE, str(out), str(LAYERS), str(EXPERTS), str(RANK), str(HIDDEN), str(INTER), "3")
    return out


def test_round_trip_is_bit_exact_streamed_and_deterministic(adapter: Path, sft_venv: Venv, tmp_path: Path) -> None:  # noqa: F811
    before = tree_digest(adapter)
    t0 = time.perf_counter()
    convert(sft_venv, "to-kt", str(adapter), str(tmp_path / "kt.safetensors"))
    to_kt_s = time.perf_counter() - t0
    rss_mib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    t0 = time.perf_counter()
    convert(sft_venv, "to-peft", str(tmp_path / "kt.safetensors"), str(tmp_path / "back"), "--max-shard-mib", "1")
    to_peft_s = time.perf_counter() - t0
    assert tree_digest(adapter) == before, "the input changed"
    result = sft_venv.json("-c", LOAD_EQUAL, str(adapter), str(tmp_path / "back"), str(tmp_path / "kt.safetensors"))
    n = LAYERS * (2 + 6 * EXPERTS)
    assert result == {
        "same": True,
        "n": n,
        "kt_n": LAYERS * 8,
        "stacked_shape": [EXPERTS, HIDDEN, RANK],
        "expert_7": True,
    }
    index = json.loads((tmp_path / "back" / "adapter_model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1  # sharded output
    size = (tmp_path / "kt.safetensors").stat().st_size
    print(
        f"{n} tensors ({size / 2**20:.1f} MiB): to-kt {to_kt_s:.2f}s ({n / to_kt_s:.0f} tensors/s, "
        f"{size / 2**20 / to_kt_s:.1f} MiB/s), to-peft {to_peft_s:.2f}s ({n / to_peft_s:.0f} tensors/s); "
        f"peak RSS of the converter processes {rss_mib:.0f} MiB"
    )
    # the same input gives the same bytes; --check sees no difference, and finds a changed element
    convert(sft_venv, "to-kt", str(tmp_path / "back"), str(tmp_path / "kt2.safetensors"))
    assert (tmp_path / "kt.safetensors").read_bytes() == (tmp_path / "kt2.safetensors").read_bytes()
    rc, out, _ = convert(sft_venv, "--check", str(adapter), str(tmp_path / "kt.safetensors"))
    assert rc == 0, out
    assert out.startswith("identical"), out
    data = bytearray((tmp_path / "kt2.safetensors").read_bytes())
    data[-3] ^= 0x40  # inside the last tensor's last element
    (tmp_path / "kt2.safetensors").write_bytes(bytes(data))
    rc, out, _ = convert(
        sft_venv, "--check", str(tmp_path / "kt.safetensors"), str(tmp_path / "kt2.safetensors"), check=False
    )
    assert rc == 1, out
    assert "element" in out, out
    assert "differs" in out, out


BAD = """
import sys
from pathlib import Path
import numpy as np
from safetensors.numpy import save_file
out, case = Path(sys.argv[1]), sys.argv[2]
e = "base_model.model.model.layers.0.mlp.experts"
t = {f"{e}.{i}.gate_proj.lora_A.weight": np.zeros((2, 8), np.float32) for i in range(4)}
t.update({f"{e}.{i}.up_proj.lora_A.weight": np.zeros((2, 8), np.float32) for i in range(4)})
if case == "missing":
    del t[f"{e}.2.gate_proj.lora_A.weight"]; del t[f"{e}.2.up_proj.lora_A.weight"]
if case == "extra":
    t[f"{e}.4.up_proj.lora_A.weight"] = np.zeros((2, 8), np.float32)
if case == "rank":
    t[f"{e}.3.gate_proj.lora_A.weight"] = np.zeros((4, 8), np.float32)
if case == "dtype":
    t[f"{e}.1.gate_proj.lora_A.weight"] = np.zeros((2, 8), np.float16)
if case == "unknown":
    t["base_model.model.lm_head.weight"] = np.zeros((2, 8), np.float32)
save_file(t, str(out))
"""


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("missing", "experts [2] are missing"),
        ("extra", "expert counts differ between its tensors"),
        ("rank", "experts.3.gate_proj.lora_A.weight' is F32 [4, 8], expert 0 is F32 [2, 8] (rank or dtype mismatch)"),
        ("dtype", "experts.1.gate_proj.lora_A.weight' is F16 [2, 8], expert 0 is F32 [2, 8]"),
        ("unknown", "tensor 'base_model.model.lm_head.weight' is not a LoRA tensor name"),
    ],
)
def test_bad_adapters_are_clear_errors(case: str, message: str, sft_venv: Venv, tmp_path: Path) -> None:  # noqa: F811
    src = tmp_path / f"{case}.safetensors"
    sft_venv.run("-c", BAD, str(src), case)
    before = src.read_bytes()
    rc, _, err = convert(sft_venv, "to-kt", str(src), str(tmp_path / "out.safetensors"), check=False)
    assert rc == 2, err
    assert message in err, err
    assert str(src) in err, err
    assert "Traceback" not in err
    assert src.read_bytes() == before
    assert not (tmp_path / "out.safetensors").exists(), "half-written output"
    assert not list(tmp_path.glob(".out*")), "temporary files left"


def test_not_an_adapter_and_existing_output(sft_venv: Venv, tmp_path: Path) -> None:  # noqa: F811
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"\x05\x00")
    rc, _, err = convert(sft_venv, "to-peft", str(junk), str(tmp_path / "o.safetensors"), check=False)
    assert rc == 2, err
    assert "not a safetensors file" in err, err
    assert str(junk) in err, err
    sft_venv.run("-c", BAD, str(tmp_path / "ok.safetensors"), "none")
    (tmp_path / "exists.safetensors").write_bytes(b"keep")
    rc, _, err = convert(
        sft_venv, "to-peft", str(tmp_path / "ok.safetensors"), str(tmp_path / "exists.safetensors"), check=False
    )
    assert rc == 2, err
    assert "exists; remove it" in err, err
    assert (tmp_path / "exists.safetensors").read_bytes() == b"keep"


def test_the_commands_of_the_fine_tuning_doc_run(sft_venv: Venv, tmp_path: Path) -> None:  # noqa: F811
    """docs/fine-tuning.md's console block, run as written (kt-lora-convert from the venv's bin)."""
    from tests.unit.test_docs import commands

    (tmp_path / "out").mkdir()
    sft_venv.run("-c", BAD, str(tmp_path / "peft.safetensors"), "none")
    convert(
        sft_venv, "to-kt", str(tmp_path / "peft.safetensors"), str(tmp_path / "out" / "kt_expert_adapter.safetensors")
    )
    script = sft_venv.python.parent / "kt-lora-convert"
    for argv in commands():
        proc = subprocess.run([str(script), *argv[1:]], cwd=tmp_path, capture_output=True, text=True, check=False)
        assert proc.returncode == 0, (argv, proc.stderr)
    assert proc.stdout.startswith("identical"), proc.stdout
