"""What the kernels tier runs on, how big, and how its steps are run, time-boxed and recorded.

A step is a generator of result rows (plain dicts). The runner times it, stops it when the time budget is
spent (the rows so far are kept), turns an exception into an ``error`` status without stopping the other
steps, and marks the step ``failed`` when a row's ``ok`` is False (a correctness check). After every step
the whole report is written again, so a run cut short by its wall-clock limit still leaves its results.
"""

from __future__ import annotations

import dataclasses
import time
import traceback
from collections.abc import Callable, Iterator
from typing import Any

import torch

Row = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class ModelShape:
    """The sizes of one decoder the check borrows its shapes from."""

    name: str
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int

    @property
    def kv_size(self) -> int:
        return self.kv_heads * self.head_dim


QWEN2_5_0_5B = ModelShape("qwen2.5-0.5b", 896, 14, 2, 64, 4864)
QWEN2_5_7B = ModelShape("qwen2.5-7b", 3584, 28, 4, 128, 18944)
LLAMA_3_1_8B = ModelShape("llama-3.1-8b", 4096, 32, 8, 128, 14336)
TINY = ModelShape("tiny", 48, 4, 2, 16, 96)


@dataclasses.dataclass(frozen=True)
class KernelSizes:
    """Every size of the kernels tier. :data:`GPU` is sized to finish in under 8 minutes on an H200,
    :data:`SMOKE` to run the same code on CPU under the Triton interpreter in well under a minute."""

    map_models: tuple[ModelShape, ...]  # their hidden sizes are the maps' d
    map_rows: tuple[int, ...]
    int8_group: int
    attention_models: tuple[ModelShape, ...]  # head shapes of the attention statistics and row queries
    stats_keys: tuple[int, ...]
    stats_queries: int
    fill_models: tuple[ModelShape, ...]
    fill_rows: int
    contexts: tuple[int, ...]  # N of the row-query attention cases; the planner uses the largest
    tail: int
    every: int  # exact prefix rows: every ``every``-th row (10 %)
    group_sizes: tuple[int, ...]
    window: int
    check_rows: int  # query rows whose attention is checked against the float32 reference, per case
    warmup: int
    repeats: int


GPU = KernelSizes(
    map_models=(QWEN2_5_0_5B, QWEN2_5_7B, LLAMA_3_1_8B), map_rows=(4096, 8192, 16384, 32768), int8_group=128,
    attention_models=(QWEN2_5_0_5B, LLAMA_3_1_8B), stats_keys=(8192, 32768), stats_queries=64,
    fill_models=(QWEN2_5_0_5B, QWEN2_5_7B, LLAMA_3_1_8B), fill_rows=8192,
    contexts=(8192, 32768), tail=1024, every=10, group_sizes=(64, 128), window=64,
    check_rows=512, warmup=2, repeats=5,
)
SMOKE = KernelSizes(
    map_models=(TINY,), map_rows=(40,), int8_group=16,
    attention_models=(TINY,), stats_keys=(96,), stats_queries=4,
    fill_models=(TINY,), fill_rows=24,
    contexts=(96,), tail=16, every=10, group_sizes=(4,), window=4,
    check_rows=24, warmup=0, repeats=1,
)


class OutOfTime(Exception):
    """The check's time budget is spent."""


@dataclasses.dataclass
class Context:
    """What every step reads: where it runs, in which dtype, how big, until when."""

    device: torch.device
    dtype: torch.dtype
    sizes: KernelSizes
    deadline: float  # time.monotonic()
    peak_tflops: float | None = None
    sgl_files: str | None = None
    say: Callable[[str], None] = print

    def check_time(self, what: str) -> None:
        """Raise :class:`OutOfTime` naming ``what`` when the budget is spent (steps call it before each case)."""
        if time.monotonic() >= self.deadline:
            raise OutOfTime(f"time budget spent before {what}")

    def generator(self, seed: int) -> torch.Generator:
        return torch.Generator(device=self.device).manual_seed(seed)

    def randn(self, *shape: int, seed: int, scale: float = 1.0) -> torch.Tensor:
        """Gaussian values in the check's dtype on its device, from a private generator."""
        x = torch.randn(*shape, generator=self.generator(seed), device=self.device, dtype=torch.float32)
        return (x * scale).to(self.dtype)

    def time_ms(self, fn: Callable[[], object], *, wall: bool = False) -> float:
        from sgl_ridgefill.kernels.timing import median_ms

        return median_ms(fn, device=self.device, warmup=self.sizes.warmup, repeats=self.sizes.repeats, wall=wall)

    def tflops(self, flops: float, ms: float) -> dict[str, float]:
        """``tflops`` and, on CUDA in a half dtype with a known peak, ``peak_fraction``."""
        out = {"tflops": flops / ms / 1e9}
        if self.peak_tflops and self.device.type == "cuda" and self.dtype != torch.float32:
            out["peak_fraction"] = out["tflops"] / self.peak_tflops
        return out


@dataclasses.dataclass
class StepResult:
    name: str
    status: str  # ok | failed | error | partial | skipped
    seconds: float
    rows: list[Row]
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


Step = Callable[[Context], Iterator[Row]]


class Skip(Exception):
    """Raised by a step that cannot run here; its message says why and what to do."""


def run_step(name: str, step: Step, ctx: Context) -> StepResult:
    """Run one step, collecting its rows; never raises (except KeyboardInterrupt)."""
    rows: list[Row] = []
    start = time.monotonic()
    status, note = "ok", ""
    try:
        for row in step(ctx):
            rows.append(row)
            ctx.say(f"  {name}: " + ", ".join(f"{k}={_short(v)}" for k, v in row.items()))
    except Skip as why:
        status, note = "skipped", str(why)
    except OutOfTime as why:
        status, note = "partial", str(why)
    except Exception as error:  # one broken step must not hide the others' results
        status = "error"
        note = f"{type(error).__name__}: {error}\n" + "".join(traceback.format_exc(limit=6))[-3000:]
    if status in ("ok", "partial") and any(row.get("ok") is False for row in rows):
        status = "failed" if status == "ok" else status
        note = note or "a correctness check failed (rows with ok=False)"
    if ctx.device.type == "cuda":
        torch.cuda.empty_cache()
    return StepResult(name, status, round(time.monotonic() - start, 2), rows, note)


def _short(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)
