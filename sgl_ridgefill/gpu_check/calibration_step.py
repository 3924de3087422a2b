"""The kernels tier's tiny calibration: the statistics of a random-weight Llama of a few layers (built with
``transformers``, which a bare GPU machine with torch usually has), accumulated on the CPU in float64 and on
the check's device with the accumulation calibration picks there (``--accumulate auto``), fitted, and compared
by held-out R^2 and the maps' relative difference against the tolerances of
``sgl_ridgefill.calibration.precision``. The forward runs in float32 on both (TF32 off), so what differs is
the device and the accumulation. On the CPU smoke run the "device" side is the CPU running CUDA's
accumulation, the same arithmetic."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import torch

from .check import Context, Row, Skip

SPLIT, LAYERS = 2, 4


def _model(hidden: int, seed: int) -> Any:
    try:
        from transformers import LlamaConfig, LlamaForCausalLM
    except ImportError as exc:  # pragma: no cover - transformers is a dependency of the project
        raise Skip(f"transformers is not importable ({exc}): the tiny calibration needs it") from None
    config = LlamaConfig(vocab_size=512, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=LAYERS,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096)
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).float().eval()


def _statistics(model: Any, pieces: list[torch.Tensor], heldout: list[torch.Tensor], device: torch.device,
                accumulate: str) -> tuple[Any, Any, float]:
    from sgl_ridgefill.calibration.capture import capture_layer_inputs
    from sgl_ridgefill.calibration.stats import SplitStats, accumulation_dtype
    from sgl_ridgefill.calibration.targets import Accumulator, sink_rule

    d = model.config.hidden_size
    train, held = SplitStats.zeros(SPLIT, LAYERS, d), SplitStats.zeros(SPLIT, LAYERS, d)
    train.to(device)
    held.to(device)
    accumulator = Accumulator(("residual",), {}, sink_rule(), accumulation_dtype(accumulate))
    layers = list(range(SPLIT, LAYERS))
    start = time.perf_counter()
    for ids, stats in [(p, train) for p in pieces] + [(p, held) for p in heldout]:
        states = {l: x.to(device) for l, x in capture_layer_inputs(model, ids, layers).items()}
        accumulator.add(states, SPLIT, {"residual": stats})
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - start
    train.to("cpu")
    held.to("cpu")
    return train, held, seconds


def calibration(ctx: Context) -> Iterator[Row]:
    from sgl_ridgefill.calibration.precision import MAP_TOLERANCE, R2_TOLERANCE
    from sgl_ridgefill.calibration.solve import fit_split, kind_r2
    from sgl_ridgefill.calibration.statpass import float32_products
    from sgl_ridgefill.calibration.stats import choose_accumulation
    from sgl_ridgefill.maps.kinds import map_kind

    smoke = ctx.device.type != "cuda"
    hidden, rows, count = (32, 64, 6) if smoke else (256, 1024, 24)
    ctx.check_time(f"calibration d={hidden}")
    model = _model(hidden, seed=0)
    gen = torch.Generator().manual_seed(1)
    pieces = [torch.randint(0, 512, (rows,), generator=gen) for _ in range(count)]
    heldout = [torch.randint(0, 512, (rows,), generator=gen) for _ in range(2)]
    accumulate, why = choose_accumulation("auto", torch.device("cuda"))
    cpu_train, cpu_held, cpu_s = _statistics(model, pieces, heldout, torch.device("cpu"), "float64")
    device_model = model.to(ctx.device)
    with float32_products(ctx.device):  # as the calibration pass runs them
        dev_train, dev_held, dev_s = _statistics(device_model, pieces, heldout, ctx.device, accumulate)
    ref = fit_split(cpu_train, cpu_held, None)
    other = fit_split(dev_train, dev_held, ref.lam)
    true_r2 = kind_r2(cpu_held, other.A, other.b, map_kind("residual"))
    r2_diff = max(abs(p - q) for p, q in zip(true_r2, ref.r2))
    map_diff = float((other.A[1:] - ref.A[1:]).norm() / ref.A[1:].norm())
    yield {
        "hidden": hidden, "layers": LAYERS, "split": SPLIT, "train_rows": cpu_train.rows,
        "device": str(ctx.device), "accumulate": accumulate, "why": why, "lambda": ref.lam,
        "mean_r2_cpu": sum(ref.r2) / len(ref.r2), "mean_r2_device": sum(true_r2) / len(true_r2),
        "r2_max_diff": r2_diff, "map_rel_diff": map_diff, "cpu_s": cpu_s, "device_s": dev_s,
        "ok": r2_diff <= R2_TOLERANCE and map_diff <= MAP_TOLERANCE,
    }
