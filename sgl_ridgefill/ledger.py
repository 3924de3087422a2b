"""What the host side of one forward costs, counted only while a census records it.

The planner, the host-to-device staging and the attention backends report here what a GPU would wait on or
pay for on the host (plans, metadata initialisations, bytes copied, masks built); a census
(``sgl_ridgefill.gpu_check.census``) installs a recorder for the span it measures and also tells which
tensors live on the device. Without a recorder every call is one context-variable read. Engine-free.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterable, Iterator
from typing import Protocol

import torch

PLANNER_CALLS = "planner_calls"  # sub-pass plans (plan_virtual_requests, plan_groups)
METADATA_INITS = "metadata_inits"  # attention metadata built for a (sub-)batch: RidgeFill's and SGLang's
H2D_COPIES = "h2d_copies"  # host-to-device copies issued by the staging (non-blocking on CUDA)
H2D_BYTES = "h2d_bytes"
HOST_MASK_BYTES = "host_mask_bytes"  # bool/uint8 masks built on the host and copied to the device
DEVICE_MASK_BYTES = "device_mask_bytes"  # custom masks built on the device (groups)
COUNTERS = (PLANNER_CALLS, METADATA_INITS, H2D_COPIES, H2D_BYTES, HOST_MASK_BYTES, DEVICE_MASK_BYTES)


class Recorder(Protocol):
    """What a census implements to receive the counts."""

    def count(self, name: str, n: int = 1) -> None: ...

    def on_device(self, tensors: Iterable[torch.Tensor]) -> None: ...


class Counts:
    """A recorder that only counts (``values``: counter -> total); device tensors are not tracked."""

    def __init__(self) -> None:
        self.values = dict.fromkeys(COUNTERS, 0)

    def count(self, name: str, n: int = 1) -> None:
        self.values[name] = self.values.get(name, 0) + n

    def on_device(self, tensors: Iterable[torch.Tensor]) -> None:
        pass


_RECORDER: contextvars.ContextVar[Recorder | None] = contextvars.ContextVar("ridgefill_ledger", default=None)


def count(name: str, n: int = 1) -> None:
    """Add ``n`` to the counter ``name`` (one of :data:`COUNTERS`) of the census recording, if any."""
    recorder = _RECORDER.get()
    if recorder is not None:
        recorder.count(name, n)


def on_device(*tensors: torch.Tensor) -> None:
    """Tell the census that ``tensors`` are device tensors (on a CPU engine host and device look alike)."""
    recorder = _RECORDER.get()
    if recorder is not None:
        recorder.on_device(tensors)


def recording() -> bool:
    return _RECORDER.get() is not None


@contextlib.contextmanager
def record(recorder: Recorder) -> Iterator[Recorder]:
    """Send the counts of the enclosed code to ``recorder`` (never left installed after an exception)."""
    token = _RECORDER.set(recorder)
    try:
        yield recorder
    finally:
        _RECORDER.reset(token)
