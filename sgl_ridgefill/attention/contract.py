"""What a RidgeFill sub-pass asks of attention, and what a backend declares it can do.

A stock extend attends the last ``extend_seq_len`` rows of each request over everything before them. A
RidgeFill sub-pass instead runs *row queries*: rows of one request at arbitrary sorted positions (exact
rows scattered through the prefix, plus the tail), each attending causally **by position**, optionally
only to *visible keys* (a bool mask over the request's context: the ``nofill`` arm, whose upper layers
hold nothing for filled rows, and the probe, which runs before the rest of the tail exists there). The
runtime describes the rows as virtual extend requests (``planner.VirtualRequests``) and sets a
:class:`RowQueries` scope around ``init_forward_metadata`` and the layer calls of the sub-pass; a backend
that supports row queries plans its metadata from the scope (``ridgefill_row_queries = True``).

Capabilities, class attributes of an attention backend:

- ``ridgefill_row_queries``: plans extends from a :class:`RowQueries` scope (runs and visible keys);
- ``ridgefill_groups``: also plans *groups* (several scattered rows in one virtual request, custom mask);
- ``ridgefill_visible_keys``: plans visible-key masks (the nofill arm, the probe);
- ``ridgefill_hidden_keys``: decode steps skip the keys a finished nofill request hides
  (``sgl_ridgefill.runtime.state.LIVE.hidden_keys``);
- ``ridgefill_hidden_keys_in_extend``: so do the rows of such a request that run inside an extend batch
  (``--enable-mixed-chunk``).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from .planner import VirtualRequests

ROW_QUERIES = "ridgefill_row_queries"
GROUPS = "ridgefill_groups"
VISIBLE_KEYS = "ridgefill_visible_keys"
HIDDEN_KEYS = "ridgefill_hidden_keys"
HIDDEN_KEYS_IN_EXTEND = "ridgefill_hidden_keys_in_extend"


@dataclass(frozen=True)
class RowQueries:
    """The rows of one sub-pass over one request.

    ``plan``: how the rows split into virtual requests (their query positions ascending);
    ``slots``: ``[seq_len]`` pool index of every position of the request's context (device);
    ``visible``: ``[seq_len]`` bool (device) or ``None`` (every key visible).
    """

    plan: VirtualRequests
    slots: torch.Tensor
    visible: torch.Tensor | None = None


_SCOPE: contextvars.ContextVar[RowQueries | None] = contextvars.ContextVar("ridgefill_row_queries", default=None)


@contextlib.contextmanager
def row_queries(scope: RowQueries) -> Iterator[None]:
    """Set ``scope`` for the planning and the attention calls of one sub-pass (never left stale)."""
    token = _SCOPE.set(scope)
    try:
        yield
    finally:
        _SCOPE.reset(token)


def current_row_queries() -> RowQueries | None:
    return _SCOPE.get()


def capability(backend: Any, name: str) -> bool:
    """Whether ``backend`` (or, for SGLang's hybrid backend, the part that runs the phase) declares ``name``.

    SGLang's linear-attention hybrid backend (Gated DeltaNet models) sends softmax-attention layers to its
    ``full_attn_backend``, which is the one that answers."""
    backend = getattr(backend, "full_attn_backend", backend)
    if name == HIDDEN_KEYS:
        backend = getattr(backend, "decode_backend", backend)
    else:
        backend = getattr(backend, "prefill_backend", backend)
    return bool(getattr(backend, name, False))
