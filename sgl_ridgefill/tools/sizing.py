"""How much work fits this CPU's time budget: the demo's prompt length and calibration tokens.

A prefill's time is estimated as its FLOP count (``tools/flops.py``: projections, MLP, attention, the
fill) over this CPU's matmul throughput, measured for about a second in the dtype the model runs in, on
the shape of the model's MLP (``[rows, d] @ [d, intermediate]``) with the threads a server would use. The
estimate ignores fixed costs per request and attention kernels that run below matmul speed, so the
budgets it is compared with leave room for them (the demo prints the estimate beside the measured TTFT).
Nothing here imports SGLang.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Sequence

from .flops import ModelDims, RidgeFillShape, exact_prefill_flops, ridgefill_prefill_flops

MEASURE_ROWS = 1024


@dataclasses.dataclass(frozen=True)
class Throughput:
    """A measured matmul rate: ``gflops`` (median over the runs) in ``dtype`` with ``threads`` threads."""

    gflops: float
    dtype: str
    threads: int
    runs: int

    def seconds(self, flops: float) -> float:
        return flops / (self.gflops * 1e9)


def measure_matmul(dims: ModelDims, dtype: str, *, threads: int, seconds: float = 1.0) -> Throughput:
    """Time ``[MEASURE_ROWS, d] @ [d, intermediate]`` in ``dtype`` for about ``seconds`` (after one warm-up
    run) with ``threads`` intra-op threads (restored afterwards)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        a = torch.randn(MEASURE_ROWS, dims.hidden_size).to(getattr(torch, dtype))
        b = torch.randn(dims.hidden_size, dims.intermediate_size).to(getattr(torch, dtype))
        flops = 2.0 * MEASURE_ROWS * dims.hidden_size * dims.intermediate_size
        torch.mm(a, b)
        rates: list[float] = []
        deadline = time.perf_counter() + seconds
        while not rates or (time.perf_counter() < deadline and len(rates) < 200):
            start = time.perf_counter()
            torch.mm(a, b)
            rates.append(flops / max(time.perf_counter() - start, 1e-9) / 1e9)
    finally:
        torch.set_num_threads(before)
    return Throughput(statistics.median(rates), dtype, threads, len(rates))


def pair_seconds(dims: ModelDims, tokens: int, split: int, tail: int, rate: Throughput) -> tuple[float, float]:
    """Estimated ``(exact, ridgefill)`` prefill seconds of a ``tokens``-token prompt."""
    shape = RidgeFillShape(num_tokens=tokens, split=split, tail=tail)
    return rate.seconds(exact_prefill_flops(dims, tokens).total), rate.seconds(ridgefill_prefill_flops(dims, shape).total)


def choose_prompt_length(
    dims: ModelDims, candidates: Sequence[int], split: int, tail: int, rate: Throughput, budget_s: float
) -> tuple[int, float]:
    """The longest of ``candidates`` whose estimated exact + RidgeFill prefill fits ``budget_s`` (else the
    shortest), and that estimate in seconds."""
    ordered = sorted(candidates, reverse=True)
    for tokens in ordered:
        exact, filled = pair_seconds(dims, tokens, split, tail, rate)
        if exact + filled <= budget_s:
            return tokens, exact + filled
    tokens = ordered[-1]
    return tokens, sum(pair_seconds(dims, tokens, split, tail, rate))


def calibration_tokens_per_s(dims: ModelDims, doc_tokens: int, rate: Throughput) -> float:
    """Estimated calibration pass speed: one forward over ``doc_tokens``-token pieces, per token."""
    return doc_tokens / rate.seconds(exact_prefill_flops(dims, doc_tokens).total)


def choose_calibration_tokens(
    dims: ModelDims, rate: Throughput, budget_s: float, *, doc_tokens: int = 2048, most: int = 200_000,
    least: int = 20_000, step: int = 10_000,
) -> int:
    """Training tokens the calibration pass reads in about ``budget_s``: between ``least`` and ``most``,
    rounded down to ``step``."""
    fits = calibration_tokens_per_s(dims, doc_tokens, rate) * budget_s
    return int(max(least, min(most, fits // step * step)))
