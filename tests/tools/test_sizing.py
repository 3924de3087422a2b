"""The demo's prompt length and calibration budget from a measured matmul rate."""

from __future__ import annotations

import pytest

from sgl_ridgefill.tools.flops import ModelDims
from sgl_ridgefill.tools.sizing import (
    Throughput,
    calibration_tokens_per_s,
    choose_calibration_tokens,
    choose_prompt_length,
    measure_matmul,
    pair_seconds,
)

QWEN_05B = ModelDims(num_layers=24, hidden_size=896, num_heads=14, num_kv_heads=2, head_dim=64,
                     intermediate_size=4864, vocab_size=151936)
LENGTHS = (8192, 4096, 2048)


def _rate(gflops: float) -> Throughput:
    return Throughput(gflops, "float32", 2, 10)


def test_estimates_follow_the_flop_count():
    exact, filled = pair_seconds(QWEN_05B, 8192, 12, 1024, _rate(100.0))
    assert 80 < exact < 95  # 8.7 TFLOP at 100 GFLOP/s
    assert 1.6 < exact / filled < 1.75  # the FLOP-counted bound at 8K
    assert pair_seconds(QWEN_05B, 8192, 12, 1024, _rate(200.0))[0] == pytest.approx(exact / 2)


@pytest.mark.parametrize(("gflops", "tokens"), [
    (28.5, 2048),   # a 2-core AVX2 CPU in float32 (the measurement)
    (70.0, 4096),
    (200.0, 8192),  # a 2-core CPU with AMX in bfloat16
    (5.0, 2048),    # nothing fits: the shortest
])
def test_prompt_length_is_the_longest_that_fits(gflops, tokens):
    chosen, estimate = choose_prompt_length(QWEN_05B, LENGTHS, 12, 1024, _rate(gflops), 150.0)
    assert chosen == tokens
    assert estimate == pytest.approx(sum(pair_seconds(QWEN_05B, tokens, 12, 1024, _rate(gflops))))
    if gflops > 5.0:
        assert estimate <= 150.0


def test_calibration_tokens_fit_the_budget():
    speed = calibration_tokens_per_s(QWEN_05B, 2048, _rate(28.5))
    assert 30 < speed < 45  # the issue measured 55-65 tokens/s in float32 there: a conservative estimate
    assert choose_calibration_tokens(QWEN_05B, _rate(28.5), 600.0) == 20_000
    assert choose_calibration_tokens(QWEN_05B, _rate(100.0), 600.0) == 70_000
    assert choose_calibration_tokens(QWEN_05B, _rate(400.0), 600.0) == 200_000


def test_measure_matmul_is_short_and_positive():
    small = ModelDims(num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=2, head_dim=16,
                      intermediate_size=128, vocab_size=100)
    rate = measure_matmul(small, "float32", threads=1, seconds=0.05)
    assert rate.gflops > 0 and rate.runs >= 1 and (rate.dtype, rate.threads) == ("float32", 1)
