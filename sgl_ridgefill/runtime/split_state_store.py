"""Split states of filled prefix rows, kept in host memory for the later requests that upgrade them.

A plan that chooses exact rows chooses them again over a reused cache (``RequestPlan.reselects``) and runs the
cached rows it chooses that the cache holds filled exactly over their own slots (``prefill.py``). Running a row
from layer S needs its split state ``x_S``. Every prompt row runs layers ``0..S-1`` exactly, so a row's split
state depends only on the tokens up to it: the request that filled the document had every new prefix row's
split state in host memory already (``HostRows``, waiting there for its selection). The store keeps those
buffers once that request's prefill is done, instead of freeing them, keyed like the row-exact record
(``exact_rows.prefix_keys``: the namespace and the tokens up to the row), so a later request gathers the split
states of the rows it upgrades instead of running layers ``0..S-1`` for them again over the cache. A row the
store does not hold is recomputed that way, as before. A split state from the store and a recomputed one differ
only by the kernels' rounding (the first was computed in the filling request's chunks).

The store holds whole buffers, one per filling request, up to ``capacity`` bytes; the least recently used
buffer leaves first. A key names the same tokens whichever request wrote it, so a newer buffer simply takes the
key over; a buffer left with no key of its own leaves at once. Host memory only, outside SGLang's accounting;
``--ridgefill-split-state-cache-mib`` bounds it (0 turns the store off).
"""

from __future__ import annotations

import itertools
from collections import Counter, OrderedDict
from typing import Any

import numpy as np
import torch


class SplitStateStore:
    """Split states ``[rows, hidden]`` of earlier requests' prefix rows, found by row key."""

    def __init__(self, capacity: int):
        if capacity < 0:
            raise ValueError(f"split state store capacity must be >= 0 bytes, got {capacity}")
        self.capacity = capacity
        self.bytes = 0
        self._ids = itertools.count()
        # id -> (host buffer [rows, hidden], the marker after its last write, keys [rows])
        self._buffers: OrderedDict[int, tuple[torch.Tensor, Any, np.ndarray]] = OrderedDict()
        self._where: dict[int, tuple[int, int]] = {}  # key -> (buffer id, row)
        self._live: dict[int, int] = {}  # buffer id -> how many keys still name one of its rows

    def __len__(self) -> int:
        return len(self._where)

    def keep(self, keys: np.ndarray, rows: Any) -> None:
        """Keep ``rows`` (a ``HostRows`` of ``len(keys)`` split states, handed over: no device copy of it stays)
        under ``keys`` (``[n]`` int64, row ``i``'s key at ``keys[i]``). Not kept when it alone is larger than
        the capacity."""
        assert len(keys) == len(rows), (len(keys), len(rows))
        buffer, marker = rows.hand_over()
        size = buffer.numel() * buffer.element_size()
        if size > self.capacity:
            return
        buffer_id = next(self._ids)
        key_list = keys.tolist()
        taken = Counter(place[0] for place in map(self._where.get, key_list) if place is not None)
        self._buffers[buffer_id] = (buffer, marker, np.asarray(keys, dtype=np.int64))
        self.bytes += size
        self._where.update(zip(key_list, zip(itertools.repeat(buffer_id), range(len(keys)))))
        self._live[buffer_id] = len(set(key_list))
        for old_id, count in taken.items():
            self._live[old_id] -= count
            if not self._live[old_id]:
                self._drop(old_id)
        while self.bytes > self.capacity:
            self._drop(next(iter(self._buffers)))

    def gather(self, keys: np.ndarray, device: torch.device) -> tuple[np.ndarray, torch.Tensor | None]:
        """The split states of the rows named by ``keys`` (``[u]`` int64) that the store holds: ``(found, x)``
        with ``found`` ``[u]`` bool and ``x`` ``[found.sum(), hidden]`` on ``device`` in ``keys``' order (None
        when none is found). The buffers read count as used."""
        places = [self._where.get(key) for key in keys.tolist()]
        found = np.fromiter((p is not None for p in places), dtype=bool, count=len(places))
        if not found.any():
            return found, None
        parts = []
        for buffer_id, group in itertools.groupby((p for p in places if p is not None), key=lambda p: p[0]):
            buffer, marker, _ = self._buffers[buffer_id]
            self._buffers.move_to_end(buffer_id)
            if marker is not None:  # its copies ran in an earlier forward: landed, so the host does not wait
                marker.synchronize()
            index = torch.tensor([row for _, row in group], dtype=torch.long)
            parts.append(buffer.index_select(0, index))
        x = torch.cat(parts)
        if device.type == "cuda":  # from pinned memory the copy is queued, and the host does not wait for it
            return found, x.pin_memory().to(device, non_blocking=True)
        return found, x.to(device)

    def _drop(self, buffer_id: int) -> None:
        buffer, _, keys = self._buffers.pop(buffer_id)
        del self._live[buffer_id]
        self.bytes -= buffer.numel() * buffer.element_size()
        for key in keys.tolist():
            if self._where.get(key, (None,))[0] == buffer_id:
                del self._where[key]
