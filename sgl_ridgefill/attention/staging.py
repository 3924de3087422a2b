"""Host tensors to the device without a host sync: the one way RidgeFill's planning sends data to the GPU.

A blocking ``tensor.to("cuda")`` or ``torch.tensor(..., device="cuda")`` is a copy followed by a stream
synchronisation: the host waits for every kernel queued before it, and SGLang's overlap scheduler loses the
batch. :func:`to_device` packs the tensors of one dtype into one pinned host buffer and copies it with
``non_blocking=True``; PyTorch's caching host allocator keeps a pinned block alive until the copies queued on
it have run, so the host may drop its buffer at once. On a CPU engine the tensors are copied as well, so a
caller may reuse its host tensors afterwards on every device alike. Engine-free.
"""

from __future__ import annotations

import torch

from .. import ledger

_MASK_DTYPES = (torch.bool, torch.uint8)


def to_device(device: torch.device | str, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """``tensors`` (host, any shapes) as new tensors on ``device``, in order, dtypes and shapes kept.

    One host buffer and one copy per distinct dtype; each result is a view into its dtype's device copy."""
    device = torch.device(device)
    out: list[torch.Tensor | None] = [None] * len(tensors)
    by_dtype: dict[torch.dtype, list[int]] = {}
    for i, t in enumerate(tensors):
        if t.device.type != "cpu":
            raise ValueError(f"to_device takes host tensors; argument {i} is on {t.device}")
        by_dtype.setdefault(t.dtype, []).append(i)
    pinned = device.type == "cuda"
    for dtype, idx in by_dtype.items():
        sizes = [tensors[i].numel() for i in idx]
        host = torch.empty(sum(sizes), dtype=dtype, pin_memory=pinned)
        if len(idx) == 1:
            host.copy_(tensors[idx[0]].reshape(-1))
        else:
            torch.cat([tensors[i].reshape(-1) for i in idx], out=host)
        moved = host if device.type == "cpu" else host.to(device, non_blocking=True)
        nbytes = host.numel() * host.element_size()
        ledger.count(ledger.H2D_COPIES)
        ledger.count(ledger.H2D_BYTES, nbytes)
        if dtype in _MASK_DTYPES:
            ledger.count(ledger.HOST_MASK_BYTES, nbytes)
        for i, part in zip(idx, moved.split(sizes)):
            out[i] = part.view(tensors[i].shape)
    ledger.on_device(*out)
    return tuple(out)  # type: ignore[arg-type]
