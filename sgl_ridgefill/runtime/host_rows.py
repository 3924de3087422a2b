"""Split states kept in host memory between the two sweeps, copied there and back without the host waiting.

The new prefix rows' split states wait for the selection at the prompt's last chunk. On a GPU they wait in
pinned host memory across chunks: they are the size of one layer's activations for the whole prompt,
outside SGLang's memory accounting. Each chunk's rows go there with a non-blocking device-to-host copy, and
an event is recorded after it. At the last chunk the whole buffer goes back with one non-blocking
host-to-device copy, ordered after those events on the device (the stream waits, not the host), and the
exact rows are gathered from it on the device: the request's own prefill never reads the buffer on the host,
so it neither waits for the copies nor spends time copying rows. (A buffer handed to the split state store is
read on the host by a later request, after its last copy's event, which has long completed by then. Reading
the buffer on the host without waiting on the events would see whatever it held before the copies ran: the
exact rows would start from stale split states, silently.)
The copy back is transient device memory of the prefix's size for the one forward that runs sweep 2, the
order of one chunk's MLP activations.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from ..attention.staging import to_device


class CopyStream(Protocol):
    """How rows go to host memory and back: asynchronous copies ordered by markers."""

    def copy(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        """``dst`` (host) from ``src`` (device), without the host waiting."""

    def marker(self) -> Any:
        """A marker after every copy issued so far (``None`` where copies are synchronous)."""

    def to_device(self, host: torch.Tensor, device: torch.device, after: Any) -> torch.Tensor:
        """``host`` on ``device``, copied once the copies before the marker ``after`` have landed, without
        the host waiting for them."""


class CudaCopies:
    """Non-blocking copies on the current CUDA stream; markers are CUDA events the stream waits on."""

    def copy(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        dst.copy_(src, non_blocking=True)

    def marker(self) -> Any:
        event = torch.cuda.Event()
        event.record()
        return event

    def to_device(self, host: torch.Tensor, device: torch.device, after: Any) -> torch.Tensor:
        if after is not None:
            torch.cuda.current_stream(device).wait_event(after)  # a device-side wait: the host goes on
        return host.to(device, non_blocking=True)


class HostCopies:
    """A CPU engine's copies: done when they return; the buffer is already where the rows are used."""

    def copy(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        dst.copy_(src, non_blocking=True)  # the same call as on CUDA, synchronous here

    def marker(self) -> None:
        return None

    def to_device(self, host: torch.Tensor, device: torch.device, after: Any) -> torch.Tensor:
        return host


class HostRows:
    """``rows`` split states ``[rows, hidden]`` in host memory (pinned for a CUDA ``device``).

    :meth:`write` copies device rows in; :meth:`gather` and :meth:`read` return rows on ``device`` from one
    copy of the whole buffer back, made when first needed. Neither waits on the host."""

    def __init__(self, rows: int, hidden: int, dtype: torch.dtype, device: torch.device, *,
                 copies: CopyStream | None = None):
        self.device = torch.device(device)
        if copies is None:
            copies = CudaCopies() if self.device.type == "cuda" else HostCopies()
        self.copies = copies
        self.buffer = torch.empty((rows, hidden), dtype=dtype, pin_memory=self.device.type == "cuda")
        self._marker = None  # after the last write
        self._back: torch.Tensor | None = None  # the buffer on the device, once copied back

    def __len__(self) -> int:
        return self.buffer.shape[0]

    def write(self, start: int, x: torch.Tensor) -> None:
        """Rows ``[start, start + len(x))`` from the device rows ``x`` (``[m, hidden]``), without waiting."""
        self.copies.copy(self.buffer[start : start + x.shape[0]], x)
        self._marker = self.copies.marker()
        self._back = None

    def on_device(self) -> torch.Tensor:
        """``[rows, hidden]`` on the device: every row written so far (one copy back, reused until a write)."""
        if self._back is None:
            self._back = self.copies.to_device(self.buffer, self.device, self._marker)
        return self._back

    def gather(self, index: torch.Tensor) -> torch.Tensor:
        """Rows ``index`` (``[e]`` int64 host, into the buffer) on the device."""
        (where,) = to_device(self.device, index)
        return self.on_device()[where]

    def read(self, lo: int = 0, hi: int | None = None) -> torch.Tensor:
        """Rows ``[lo, hi)`` on the device."""
        return self.on_device()[lo:hi]

    def slice_on_device(self, lo: int, hi: int) -> torch.Tensor:
        """Rows ``[lo, hi)`` on the device, copied alone (not the whole buffer), after the last write."""
        return self.copies.to_device(self.buffer[lo:hi], self.device, self._marker)

    def hand_over(self) -> tuple[torch.Tensor, Any]:
        """The host buffer and the marker after its last write, for a keeper that reads it on the host later
        (the split state store); the copy back on the device is dropped, so no device memory stays held."""
        self._back = None
        return self.buffer, self._marker
