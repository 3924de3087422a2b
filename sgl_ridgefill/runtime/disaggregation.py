"""RidgeFill under prefill/decode (PD) disaggregation: RidgeFill on the prefill worker, a stock decode worker.

The prefill worker runs RidgeFill's two-sweep prefill and ships the prompt's KV to a decode worker, which
decodes over it exactly as a monolithic server decodes over its own filled cache. Three things make that
correct (``patches.py`` holds the hooks, this module what they do):

- **Hold the KV back until the prefill is complete.** SGLang sends each chunk's KV as soon as the chunk
  ran, but sweep 2 (in the prompt's last chunk) rewrites the upper-layer KV of earlier chunks' rows: the
  selected exact rows, the tail rows of earlier chunks and the value rescale. A RidgeFill request's
  intermediate sends are dropped (:func:`holds_back`); SGLang advances its send cursor only when it sends,
  so the final send ships the whole prompt.
- **Tell the decode worker what it received.** A descriptor rides in the spare slots 7-15 of SGLang's
  per-request ``cached_tokens`` metadata row (``(N, 16)`` int32, sent with the first output token): arm,
  whether the KV holds filled rows, split, tail, filled/exact/cached row counts and a 32-bit hash of the
  plan's cache namespace (:class:`Descriptor`). A decode worker with its radix cache on reads it when the
  transfer lands and never inserts filled KV into its exact tree (:func:`receive`).
- **Agree on what is exact.** A decode worker with its radix cache on keeps its own exact KV for the
  prefix it already holds (``decode_prefix_len``, known at bootstrap) and receives the rest. The prefill
  worker makes those rows exact too (:func:`note_decode_prefix`), so its tail attends to what the decode
  worker's steps will attend to; a monolithic server whose cache held that prefix would do the same.

The ``nofill`` arm runs exact under PD (its decode steps must hide the filled rows, which a stock decode
worker cannot), and the cache mode is ``no_insert`` (``admission.py``).
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from typing import Any

import torch

from ..vocabulary import ARM_WIRE_ORDER
from .state import state_of

logger = logging.getLogger("sgl_ridgefill")

FIRST_SLOT = 7  # cached_tokens slots 0-6 are SGLang's (cached-token counts, multimodal token counts)
MAGIC = 0x52464431  # "RFD1": slot 7 of a descriptor written by RidgeFill (0: none, e.g. a stock prefill)
ARMS = ARM_WIRE_ORDER  # the descriptor's arm index
FILLED, FAILED = 1, 2  # flag bits


@dataclass(frozen=True)
class Descriptor:
    """What a prefill worker ran for one request, as the decode worker reads it (9 int32 values)."""

    arm: str = "exact"
    filled: bool = False  # the KV holds filled rows: never insert it into an exact radix tree
    failed: bool = False  # the prefill failed part-way (the KV may hold filled rows)
    split: int = 0
    tail: int = 0
    filled_rows: int = 0
    exact_rows: int = 0
    cached_rows: int = 0
    namespace_hash: int = 0

    def encode(self) -> list[int]:
        flags = (FILLED if self.filled else 0) | (FAILED if self.failed else 0)
        return [MAGIC, ARMS.index(self.arm), flags, self.split, self.tail, self.filled_rows, self.exact_rows,
                self.cached_rows, self.namespace_hash]

    @classmethod
    def decode(cls, values) -> Descriptor | None:
        """The descriptor in ``values`` (slots 7-15), or ``None`` when RidgeFill wrote none."""
        v = [int(x) for x in values]
        if len(v) < 9 or v[0] != MAGIC or not 0 <= v[1] < len(ARMS):
            return None
        return cls(arm=ARMS[v[1]], filled=bool(v[2] & FILLED), failed=bool(v[2] & FAILED), split=v[3], tail=v[4],
                   filled_rows=v[5], exact_rows=v[6], cached_rows=v[7], namespace_hash=v[8])

    @property
    def may_insert(self) -> bool:
        """Whether the KV may enter an exact radix tree (every row exact)."""
        return not (self.filled or self.failed)


def namespace_hash(namespace: str) -> int:
    """A plan's cache namespace as a non-negative int32."""
    return int.from_bytes(hashlib.sha256(namespace.encode()).digest()[:4], "big") & 0x7FFFFFFF


def describe(req: Any) -> Descriptor:
    """The descriptor of a request whose prefill ran on this worker (exact when RidgeFill did not run)."""
    st = state_of(req)
    if st is None:
        return Descriptor()
    if st.exact_reason is not None and not st.failed:
        return Descriptor()  # decided exact before anything was written
    stats, plan = st.stats, st.plan
    filled_rows = int(stats.get("filled", 0))
    return Descriptor(
        arm=plan.arm, filled=st.failed or filled_rows > 0, failed=st.failed, split=plan.split, tail=plan.tail,
        filled_rows=filled_rows, exact_rows=int(stats.get("exact", 0)), cached_rows=max(st.start, 0),
        namespace_hash=namespace_hash(plan.namespace),
    )


# ----------------------------------------------------------------------------- prefill worker
def holds_back(req: Any) -> bool:
    """Whether an intermediate KV send of ``req`` must wait: RidgeFill still has work for it, so its
    upper-layer KV is not final until the last chunk ran."""
    st = state_of(req)
    return st is not None and st.runs


def write_descriptor(buffers: Any, req: Any) -> None:
    """Write ``req``'s descriptor into its metadata row (``MetadataBuffers.cached_tokens``), for every
    request, so a slot never carries a previous request's descriptor."""
    idx = getattr(req, "metadata_buffer_index", -1)
    if idx is None or idx < 0:
        return
    values = torch.tensor(describe(req).encode(), dtype=buffers.cached_tokens.dtype)
    buffers.cached_tokens[idx, FIRST_SLOT : FIRST_SLOT + len(values)] = values.to(buffers.cached_tokens.device)


def note_decode_prefix(req: Any) -> None:
    """At bootstrap: the decode worker already holds rows ``[0, decode_prefix_len)`` exactly and receives
    only the rest; those rows run exact here too, so the tail attends to what decode will."""
    st = state_of(req)
    prefix = int(getattr(req, "disagg_decode_prefix_len", 0) or 0)
    if st is None or prefix <= 0:
        return
    if st.prefill_done:
        logger.warning("request %s: the decode worker's prefix (%d rows) arrived after RidgeFill's selection; its "
                       "tail attended to filled rows the decode worker holds exactly", req.rid, prefix)
        return
    st.exact_context = prefix


# ----------------------------------------------------------------------------- decode worker
def receive(queue: Any, decode_req: Any) -> Descriptor | None:
    """When ``decode_req``'s KV has landed on the decode worker: read the prefill's descriptor and keep
    filled KV out of the radix cache (``skip_radix_cache_insert``)."""
    req = decode_req.req
    idx = getattr(decode_req, "metadata_buffer_index", -1)
    if idx is None or idx < 0:
        return None
    row = queue.metadata_buffers.cached_tokens[idx, FIRST_SLOT:].cpu()
    desc = Descriptor.decode(row.tolist())
    if desc is None:
        return None
    req.ridgefill_descriptor = desc
    if not desc.may_insert:
        req.skip_radix_cache_insert = True
    logger.debug("ridgefill rid=%s received %s", req.rid, desc)
    return desc
