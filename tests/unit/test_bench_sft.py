"""bench/sft.py's printed rows: a TP2 row is set against the TP1 row of its own variant."""

from __future__ import annotations

from bench.sft import line


def row(variant: str, tp: int, seconds: float) -> dict[str, object]:
    return {"variant": variant, "fmt": "int8", "tokens": 256, "tp": tp, "kt_s": seconds}


def test_tp2_row_is_against_its_own_variants_tp1() -> None:
    # The first TP1 row of the run (another variant) must not be the one compared.
    rows = [row("avx2", 1, 0.4), row("avx512_bf16", 1, 0.2), row("avx512_bf16", 2, 0.1)]
    printed = line("avx512_bf16", rows[2], rows)
    assert "TP1/TP2 x2.00" in printed, printed
