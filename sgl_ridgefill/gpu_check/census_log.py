"""The host census inside a serving process: each RidgeFill forward under a :class:`~.census.Census`, one JSON
line per finished request (``RIDGEFILL_CENSUS=FILE``; ``sgl-ridgefill gpu-check --tier host`` sets it).

Before a forward the log tells the census which tensors live on the device: the batch's tensor fields (not
its ``*_cpu`` copies), the model's weights and buffers, the KV pool, the request-to-token table, the
attention backend's own buffers and the maps. A forward's counts go to the RidgeFill requests it carried;
a request's line is written when its prefill is decided, with what ``meta_info["ridgefill"]`` reports.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections.abc import Iterator
from typing import Any

from .census import Census, CensusRecord, module_tensors, object_tensors, on_device


class CensusLog:
    """Appends one JSON line per RidgeFill request to ``path``."""

    def __init__(self, path: str):
        self.path = path
        self._records: dict[str, CensusRecord] = {}
        self._shared: dict[str, list[str]] = {}
        self._done: dict[str, dict] = {}
        self._marked: set[int] = set()
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def forward(self, runtime: Any, fb: Any) -> Iterator[None]:
        self._mark_device(runtime, fb)
        rids = [rid for rid in fb.rids or () if runtime.live.state(rid) is not None]
        census = Census()
        try:
            with census:
                yield
        finally:
            for rid in rids:
                self._records.setdefault(rid, CensusRecord()).add(census.record)
                if len(rids) > 1:
                    self._shared[rid] = [r for r in rids if r != rid]
            self._flush()

    def finish(self, rid: str, summary: dict) -> None:
        """``rid``'s prefill is decided (its line is written when the forward deciding it ends)."""
        self._done[rid] = summary

    def _flush(self) -> None:
        lines = []
        for rid in [r for r in self._done if r in self._records]:
            line = {"rid": rid, "ridgefill": self._done.pop(rid), "census": self._records.pop(rid).summary()}
            if rid in self._shared:
                line["shared_forwards_with"] = self._shared.pop(rid)
            lines.append(json.dumps(line))
        if lines:
            with self._lock, open(self.path, "a") as f:
                f.write("\n".join(lines) + "\n")

    def _mark_device(self, runtime: Any, fb: Any) -> None:
        on_device(t for name, t in vars(fb).items() if not name.endswith("_cpu"))
        backend = runtime.attn_backend()
        for obj in (runtime.adapter.model, backend, getattr(backend, "token_to_kv_pool", None),
                    getattr(backend, "req_to_token_pool", None), runtime.maps):
            if obj is None or id(obj) in self._marked:
                continue  # the tags stay on these long-lived tensors
            self._marked.add(id(obj))
            tensors = module_tensors(obj) if hasattr(obj, "parameters") else object_tensors(obj)
            if obj is runtime.maps:
                tensors += [t for parts in vars(obj).get("_maps", {}).values() for t in parts if hasattr(t, "dim")]
            on_device(tensors)


def from_environment() -> CensusLog | None:
    """The census log ``RIDGEFILL_CENSUS`` names, or ``None`` (the normal case: no census, no cost)."""
    from .. import envs

    path = envs.get(envs.CENSUS)
    return CensusLog(os.path.abspath(path)) if path else None
