"""Per-forward attention constraints that the runtime hands to a RidgeFill-aware attention backend.

Two things a stock extend cannot express, set for the duration of one sub-pass with a context manager
(never a global that an exception could leave stale):

- *row queries*: the query rows of an extend are arbitrary positions of one request (exact rows scattered
  through the prefix, plus the tail), not the last ``extend_seq_len`` rows; a backend that supports them
  masks causally by ``forward_batch.positions`` instead of by row order;
- *visible keys*: a boolean mask over the request's context ``[seq_len]``; keys outside it receive no
  attention (the ``nofill`` arm, where upper layers hold nothing for filled rows, and the probe, which runs
  before the rest of the tail exists in the upper layers).

A backend advertises support with the class attribute ``ridgefill_row_queries = True``.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class AttentionScope:
    """``visible_keys``: ``[seq_len]`` bool for the single request of the sub-pass, or ``None`` (all visible)."""

    visible_keys: torch.Tensor | None = None


_SCOPE: contextvars.ContextVar[AttentionScope | None] = contextvars.ContextVar("ridgefill_attention_scope", default=None)


@contextlib.contextmanager
def attention_scope(scope: AttentionScope) -> Iterator[None]:
    token = _SCOPE.set(scope)
    try:
        yield
    finally:
        _SCOPE.reset(token)


def current_scope() -> AttentionScope | None:
    return _SCOPE.get()


# Decode steps of nofill requests: rid -> (first upper layer, [rows] bool mask of keys that hold nothing).
# Written when such a request's prefill completes, removed when the request releases its KV.
_HIDDEN_ROWS: dict[str, tuple[int, torch.Tensor]] = {}


def hide_rows(rid: str, first_layer: int, hidden: torch.Tensor) -> None:
    _HIDDEN_ROWS[rid] = (first_layer, hidden)


def forget_rows(rid: str) -> None:
    _HIDDEN_ROWS.pop(rid, None)


def hidden_rows(rid: str | None, layer_id: int) -> torch.Tensor | None:
    """Keys (``[rows]`` bool, True = hidden) a decode step of ``rid`` must not see in layer ``layer_id``."""
    if not _HIDDEN_ROWS or rid is None:
        return None
    entry = _HIDDEN_ROWS.get(rid)
    if entry is None or layer_id < entry[0]:
        return None
    return entry[1]
