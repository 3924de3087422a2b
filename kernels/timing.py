"""Time of a piece of device work: the median of a few timed calls after untimed warm-up calls.

On CUDA each call is bracketed by CUDA events on the current stream, so the time is the device's (launch
gaps included) and no host synchronisation sits between calls; elsewhere, or with ``wall=True``, it is
``time.perf_counter``.
Shared by the startup choice of :mod:`sgl_ridgefill.kernels.choose`, the micro-benchmark and
``sgl_ridgefill.gpu_check``.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch


def median_ms(
    fn: Callable[[], object], *, device: torch.device | str, warmup: int = 2, repeats: int = 5, wall: bool = False
) -> float:
    """Median milliseconds of ``repeats`` calls of ``fn()`` after ``warmup`` untimed calls (the first of which
    also compiles any Triton kernel ``fn`` launches).

    ``wall=True`` times each call on the host clock between two device synchronisations instead: for work
    that is mostly on the host (planning metadata) or that synchronises itself.
    """
    if repeats < 1 or warmup < 0:
        raise ValueError(f"median_ms needs repeats >= 1 and warmup >= 0, got repeats={repeats}, warmup={warmup}")
    device = torch.device(device)
    for _ in range(warmup):
        fn()
    if device.type != "cuda" or wall:
        sync = torch.cuda.synchronize if device.type == "cuda" else (lambda device=None: None)
        times = []
        for _ in range(repeats):
            sync(device)
            start = time.perf_counter()
            fn()
            sync(device)
            times.append((time.perf_counter() - start) * 1e3)
        return statistics.median(times)
    with torch.cuda.device(device):
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(repeats)]
        torch.cuda.synchronize()
        for start, end in events:
            start.record()
            fn()
            end.record()
        torch.cuda.synchronize()
        return statistics.median(start.elapsed_time(end) for start, end in events)
