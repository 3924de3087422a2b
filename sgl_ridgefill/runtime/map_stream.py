"""Maps streamed from host memory: one split's per-layer maps kept in (pinned) host memory, two layers at a
time on the device.

``--ridgefill-map-residence host`` keeps the maps out of the GPU's memory (a 70B model at half depth holds
about 5 GB of bf16 maps per rank), at the price of copying each upper layer's map to the device once per
fill. The copies run on a side stream: when layer ``l``'s map is taken, layer ``l + 1``'s (cyclically within
the split's upper layers, so the next chunk's first layer follows the last) starts copying into the other
slot, ordered after the last use of that slot; the fill of layer ``l`` overlaps it. A layer asked for out of
order (the value rescale, a hybrid's recurrent fill) is copied on demand. On a CPU the same code runs with
host and device both ``cpu`` and copies that complete when issued.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch


class StreamedMaps:
    """Per upper layer ``j`` the tensors ``parts[i][j]`` (each ``parts[i]`` ``[layers, ...]`` in host memory),
    handed out on ``device`` by :meth:`take`; call :meth:`done` after the last op that reads them."""

    def __init__(self, parts: Sequence[torch.Tensor], device: torch.device | str):
        self.device = torch.device(device)
        cuda = self.device.type == "cuda"
        self.host = tuple(p.pin_memory() if cuda and not p.is_pinned() else p for p in parts)
        self.layers = int(self.host[0].shape[0])
        self.slots = [tuple(torch.empty(p.shape[1:], dtype=p.dtype, device=self.device) for p in self.host) for _ in range(2)]
        self.holds: list[int | None] = [None, None]  # the layer each slot holds (or is being filled with)
        self.ready: list[Any] = [None, None]  # CUDA events: the slot's copy has landed
        self.free: list[Any] = [None, None]  # CUDA events: the last op reading the slot has run
        self.stream = torch.cuda.Stream(self.device) if cuda else None
        self._last = 1  # the slot taken last
        self.copies = 0  # layers copied to the device (a measurement, and the tests' check)

    @property
    def device_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for slot in self.slots for t in slot)

    @property
    def host_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.host)

    def take(self, j: int) -> tuple[torch.Tensor, ...]:
        """Layer ``j``'s tensors on the device, ready for ops on the current stream; the next layer starts
        copying into the other slot."""
        if not 0 <= j < self.layers:
            raise IndexError(f"layer {j} of {self.layers} streamed maps")
        slot = self.holds.index(j) if j in self.holds else self._fill(1 - self._last, j)
        if self.ready[slot] is not None:
            torch.cuda.current_stream(self.device).wait_event(self.ready[slot])  # the device waits, not the host
        self._last = slot
        following = (j + 1) % self.layers
        if self.layers > 1 and following not in self.holds:
            self._fill(1 - slot, following)
        return self.slots[slot]

    def done(self) -> None:
        """The ops reading the slot :meth:`take` returned last are issued: its next copy waits for them."""
        if self.stream is not None:
            event = torch.cuda.Event()
            event.record(torch.cuda.current_stream(self.device))
            self.free[self._last] = event

    def _fill(self, slot: int, j: int) -> int:
        self.holds[slot] = j
        self.copies += 1
        if self.stream is None:
            for dst, src in zip(self.slots[slot], self.host):
                dst.copy_(src[j])
            return slot
        with torch.cuda.stream(self.stream):
            if self.free[slot] is not None:
                self.stream.wait_event(self.free[slot])
            for dst, src in zip(self.slots[slot], self.host):
                dst.copy_(src[j], non_blocking=True)
            event = torch.cuda.Event()
            event.record(self.stream)
            self.ready[slot] = event
        return slot
