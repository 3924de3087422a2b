"""What a RidgeFill sub-pass asks of attention, and what a backend declares it can do.

A stock extend attends the last ``extend_seq_len`` rows of each request over everything before them. A
RidgeFill sub-pass instead runs *row queries*: rows of one request at arbitrary sorted positions (exact
rows scattered through the prefix, plus the tail), each attending causally **by position**, optionally
only to *visible keys* (a bool mask over the request's context: the ``nofill`` arm, whose upper layers
hold nothing for filled rows, and the probe, which runs before the rest of the tail exists there). The
runtime plans the rows in steps (``steps.Step``: groups of scattered rows, then runs), and per step asks
the backend once to prepare its metadata (:meth:`RowQueryBackend.ridgefill_prepare`); for every upper
layer it activates that metadata (:meth:`RowQueryBackend.ridgefill_activate`, host-only) inside a
:class:`RowQueries` scope around the layer call.

Capabilities, class attributes of an attention backend:

- ``ridgefill_row_queries``: runs :class:`RowQueries` steps, groups and runs (:class:`RowQueryBackend`);
- ``ridgefill_visible_keys``: plans visible-key masks (the nofill arm, the probe);
- ``ridgefill_hidden_keys``: decode steps skip the keys a finished nofill request hides (:func:`hidden_keys`,
  answered by the live requests the runtime hands over with :func:`serve_requests`);
- ``ridgefill_hidden_keys_in_extend``: so do the rows of such a request that run inside an extend batch
  (``--enable-mixed-chunk``).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import torch

if TYPE_CHECKING:
    from .steps import Step

ROW_QUERIES = "ridgefill_row_queries"
VISIBLE_KEYS = "ridgefill_visible_keys"
HIDDEN_KEYS = "ridgefill_hidden_keys"
HIDDEN_KEYS_IN_EXTEND = "ridgefill_hidden_keys_in_extend"


@dataclass(frozen=True)
class RowQueries:
    """The rows of one step of a sub-pass over one request.

    ``step``: how the rows split into groups and runs (their query positions ascending);
    ``slots``: ``[seq_len]`` pool index of every position of the request's context (device);
    ``visible``: ``[seq_len]`` bool (device) or ``None`` (every key visible); ``visible_host``: the same on
    the host (the plans read it there).
    """

    step: Step
    slots: torch.Tensor
    visible: torch.Tensor | None = None
    visible_host: torch.Tensor | None = None


class RowQueryBackend(Protocol):
    """What a backend with ``ridgefill_row_queries`` implements besides SGLang's interface."""

    def ridgefill_prepare(self, scope: RowQueries, sub_batch: Any) -> Any:
        """Build the attention metadata of one step (``sub_batch``: its virtual requests as a ForwardBatch),
        once; the result is handed back to :meth:`ridgefill_activate` for every layer of the step."""

    def ridgefill_activate(self, prepared: Any) -> None:
        """Make ``prepared`` the metadata of the next attention calls (host only: no device work)."""


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


class LiveRequests(Protocol):
    """What the backends ask about the requests in flight, by request id (the runtime's registry answers)."""

    def hidden_keys(self, rid: str | None, layer_id: int) -> torch.Tensor | None:
        """``[B]`` bool (True = hidden): the keys a nofill request's queries must not see in ``layer_id``."""

    def req(self, rid: str | None) -> Any:
        """SGLang's ``Req`` of a RidgeFill request, else ``None``."""


class _NoRequests:
    def hidden_keys(self, rid: str | None, layer_id: int) -> None:
        return None

    def req(self, rid: str | None) -> None:
        return None


_LIVE: LiveRequests = _NoRequests()


def serve_requests(live: LiveRequests) -> None:
    """Make ``live`` what :func:`hidden_keys` and :func:`request` answer from (the runtime, once per process)."""
    global _LIVE
    _LIVE = live


def hidden_keys(rid: str | None, layer_id: int) -> torch.Tensor | None:
    """The keys request ``rid`` hides in ``layer_id`` (``None``: it hides none, or it is no RidgeFill request)."""
    return _LIVE.hidden_keys(rid, layer_id)


def request(rid: str | None) -> Any:
    """SGLang's ``Req`` of RidgeFill request ``rid`` (``None`` for any other)."""
    return _LIVE.req(rid)


def _part(backend: Any, name: str) -> Any:
    """``backend.<name>`` when it is a backend of its own (SGLang's FlashInfer backend keeps a kernel name,
    ``"fa2"``, in ``prefill_backend``), else ``backend``."""
    part = getattr(backend, name, None)
    return part if part is not None and hasattr(part, "init_forward_metadata") else backend


def row_query_backend(backend: Any) -> Any:
    """The backend that runs a sub-pass's softmax attention: for SGLang's linear-attention hybrid backend its
    ``full_attn_backend``, for a split prefill/decode backend its ``prefill_backend``."""
    return _part(_part(backend, "full_attn_backend"), "prefill_backend")


def capability(backend: Any, name: str) -> bool:
    """Whether ``backend`` (or, for SGLang's hybrid backend, the part that runs the phase) declares ``name``.

    SGLang's linear-attention hybrid backend (Gated DeltaNet models) sends softmax-attention layers to its
    ``full_attn_backend``, which is the one that answers."""
    if name == HIDDEN_KEYS:
        backend = _part(_part(backend, "full_attn_backend"), "decode_backend")
    else:
        backend = row_query_backend(backend)
    return bool(getattr(backend, name, False))
