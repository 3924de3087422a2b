"""Maps streamed from host memory: one split's per-layer maps kept in (pinned) host memory, a ring of a few
layers at a time on the device.

``--ridgefill-map-residence host`` keeps the maps out of the GPU's memory (a 70B model at half depth holds
about 5 GB of bf16 maps per rank), at the price of copying each upper layer's map to the device once per
fill. The copies run on a side stream, in layer order (cyclically within the split's upper layers, so the
next chunk's first layers follow the last): the ring's ``slots`` (``--ridgefill-map-slots``, default 2) hold
the next layers' maps, and when the fill of a layer is issued (:meth:`StreamedMaps.done`) its slot starts
copying the layer ``slots`` ahead, ordered after that fill. With two slots a copy overlaps one layer's fill;
with more, the first layers of the next chunk copy while its lower layers run, so a copy slower than a
fill can still hide (``gpu_check/map_stream.py`` estimates how many slots it takes). A layer asked for out
of order (the value rescale, a hybrid's recurrent fill) is copied on demand and the ring restarts after it.
On a CPU the same code runs with host and device both ``cpu`` and copies that complete when issued.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

DEFAULT_SLOTS = 2


class StreamedMaps:
    """Per upper layer ``j`` the tensors ``parts[i][j]`` (each ``parts[i]`` ``[layers, ...]`` in host memory),
    handed out on ``device`` by :meth:`take`; call :meth:`done` after the last op that reads them. ``slots``:
    layers held on the device at once (at least 2, at most the number of layers)."""

    def __init__(self, parts: Sequence[torch.Tensor], device: torch.device | str, slots: int = DEFAULT_SLOTS):
        if isinstance(slots, bool) or not isinstance(slots, int) or slots < 2:
            raise ValueError(f"streamed maps need at least 2 slots, got {slots!r}")
        self.device = torch.device(device)
        cuda = self.device.type == "cuda"
        self.host = tuple(p.pin_memory() if cuda and not p.is_pinned() else p for p in parts)
        self.layers = int(self.host[0].shape[0])
        n = min(slots, self.layers)
        self.slots = [tuple(torch.empty(p.shape[1:], dtype=p.dtype, device=self.device) for p in self.host) for _ in range(n)]
        self.holds: list[int | None] = [None] * n  # the layer each slot holds (or is being filled with)
        self.ready: list[Any] = [None] * n  # CUDA events: the slot's copy has landed
        self.free: list[Any] = [None] * n  # CUDA events: the last op reading the slot has run
        self.stream = torch.cuda.Stream(self.device) if cuda else None
        self._taken: int | None = None  # the slot taken last, until done()
        self._next = 0  # the layer the ring copies next
        self.copies = 0  # layers copied to the device (a measurement, and the tests' check)
        for slot in range(n):
            self._fill(slot, self._advance())

    @property
    def device_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for slot in self.slots for t in slot)

    @property
    def host_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.host)

    def take(self, j: int) -> tuple[torch.Tensor, ...]:
        """Layer ``j``'s tensors on the device, ready for ops on the current stream."""
        if not 0 <= j < self.layers:
            raise IndexError(f"layer {j} of {self.layers} streamed maps")
        if j in self.holds:
            slot = self.holds.index(j)
        else:  # out of order: copy it now into the slot the ring would refill last, and go on after it
            ahead = [((h - j) % self.layers, s) for s, h in enumerate(self.holds) if s != self._taken]
            slot = max(ahead)[1]
            self._next = (j + 1) % self.layers
            self._fill(slot, j)
        if self.ready[slot] is not None:
            torch.cuda.current_stream(self.device).wait_event(self.ready[slot])  # the device waits, not the host
        self._taken = slot
        return self.slots[slot]

    def done(self) -> None:
        """The ops reading the slot :meth:`take` returned last are issued: the slot starts copying the ring's
        next layer, ordered after them."""
        slot, self._taken = self._taken, None
        if slot is None:
            return
        if self.stream is not None:
            event = torch.cuda.Event()
            event.record(torch.cuda.current_stream(self.device))
            self.free[slot] = event
        if self.layers > len(self.slots):
            while self._next in self.holds:  # after an out-of-order take the ring may hold it already
                self._advance()
            self._fill(slot, self._advance())

    def _advance(self) -> int:
        j, self._next = self._next, (self._next + 1) % self.layers
        return j

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
