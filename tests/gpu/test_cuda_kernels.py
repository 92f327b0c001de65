"""CUDA kernels against torch references. Needs an NVIDIA GPU, torch with CUDA
and kt_kernel installed (maint/gpu_check.sh sets that up); skipped otherwise."""

from __future__ import annotations

import os
from typing import Any

import pytest

# nox -s tests_gpu and maint/gpu_check.sh set KT_REQUIRE_GPU=1: there a missing torch or device is a
# failure, never a skip. Elsewhere (nox -s tests on a CPU machine) these tests skip, saying why.
REQUIRED = os.environ.get("KT_REQUIRE_GPU") == "1"
if REQUIRED:
    import torch

    if not torch.cuda.is_available():
        pytest.fail("KT_REQUIRE_GPU=1 but torch sees no CUDA device", pytrace=False)
else:
    torch = pytest.importorskip("torch", reason="torch is not installed")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device visible to torch"),
]


@pytest.fixture(scope="module")
def kt() -> Any:
    # On a machine with a GPU a missing or broken kt_kernel is a failure, never a skip.
    import kt_kernel
    from kt_kernel import cuda

    cuda.load()
    return kt_kernel


@pytest.mark.parametrize(("tokens", "experts", "topk"), [(1, 8, 2), (17, 64, 8), (256, 128, 8)])
def test_router_matches_softmax_topk(kt: Any, tokens: int, experts: int, topk: int) -> None:
    from kt_kernel import cuda

    logits = torch.randn(tokens, experts, device="cuda")
    ids, weights = cuda.router_topk(logits, topk)
    probs = torch.softmax(logits, dim=-1)
    ref_w, ref_ids = probs.topk(topk, dim=-1)
    ref_w = ref_w / ref_w.sum(-1, keepdim=True)
    torch.cuda.synchronize()
    assert torch.equal(ids.sort(-1).values, ref_ids.sort(-1).values)
    torch.testing.assert_close(
        weights.gather(-1, ids.argsort(-1)), ref_w.gather(-1, ref_ids.argsort(-1)), rtol=1e-4, atol=1e-5
    )


def torch_dequantize(q: Any, scale: Any, fmt: str, cols: int, group: int) -> Any:
    """The formats decoded from their definition with torch ops (an independent reference, not
    kt_kernel's own decoder): int8 q * row scale; rawint4 two signed nibbles per byte, byte j of a
    32-column block holding column j (low nibble) and column 16 + j (high), times the group scale."""
    if fmt == "int8":
        return (q.float() * scale[..., None]).reshape(-1, cols).bfloat16()
    b = q.to(torch.int16).reshape(*q.shape[:-1], cols // 32, 16)
    lo, hi = ((b & 0xF) ^ 8) - 8, ((b >> 4) ^ 8) - 8  # sign-extend 4 bits
    vals = torch.cat([lo, hi], dim=-1).reshape(*q.shape[:-1], cols // group, group).float()
    return (vals * scale[..., None]).reshape(-1, cols).bfloat16()


@pytest.mark.parametrize(("fmt", "group"), [("int8", 0), ("rawint4", 32), ("rawint4", 128)])
def test_dequant_matches_the_format_definition(kt: Any, fmt: str, group: int) -> None:
    from kt_kernel import cuda

    w = torch.randn(3, 96, 256)
    qw = kt.quantize(w.numpy(), fmt, group or 64)
    q, scale = torch.from_numpy(qw.q), torch.from_numpy(qw.scale)
    ref = torch_dequantize(q, scale, fmt, 256, group)
    # the CPU decoder agrees with the definition too, so the two decoders cannot share a mistake
    assert torch.equal(torch.from_numpy(kt.dequantize(qw)).reshape(-1, 256).bfloat16(), ref)
    out = cuda.dequantize(q.cuda(), scale.cuda(), fmt, 256, group)
    assert torch.equal(out.cpu(), ref)


def test_grouped_gemm_matches_torch(kt: Any) -> None:
    from kt_kernel import cuda

    experts, n, k = 5, 96, 160
    counts = torch.tensor([0, 7, 33, 1, 16])
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), counts.cumsum(0)]).cuda()
    x = torch.randn(int(counts.sum()), k, device="cuda").bfloat16()
    w = torch.randn(experts, n, k, device="cuda").bfloat16()
    y = cuda.grouped_gemm(x, offsets, w)
    ref = torch.cat([x[offsets[e] : offsets[e + 1]].float() @ w[e].float().T for e in range(experts)])
    torch.testing.assert_close(y, ref, rtol=1e-3, atol=1e-3)


def test_hopper_library_only_on_compute_9_0(kt: Any) -> None:
    from kt_kernel import cuda

    lib = cuda.load()
    major, minor = torch.cuda.get_device_capability()
    assert (lib.hopper is not None) == ((major, minor) == (9, 0))
    assert lib.arch == f"sm_{major}{minor}"
