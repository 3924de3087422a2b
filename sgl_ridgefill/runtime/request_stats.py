"""What one request's prefill did: the record behind ``meta_info["ridgefill"]``, the debug log and the metrics.

Every figure a request can report is a field here (``None``: not measured for this request, left out of the
response); writing a name that is not one raises, so a misspelt figure fails where it is written instead of
vanishing from the response.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any


@dataclass(slots=True)
class RequestStats:
    # The prompt and what of it came from the radix cache.
    prompt: int | None = None  # tokens
    cached: int | None = None  # rows taken from the radix cache
    cached_exact: int | None = None  # of those, rows the cache holds as exact (namespace mode)
    tail_reused_filled: int | None = None  # tail rows taken filled from the cache (the slack, namespace mode)
    # The rows of the new prefix and the tail.
    filled: int | None = None
    exact: int | None = None  # prefix rows selected to run every layer (cached ones too, for a reselecting plan)
    upgraded: int | None = None  # of those, cached rows held filled that ran exactly over their slots (reselect)
    upgraded_stored: int | None = None  # of those, rows whose split state an earlier request kept (no lower layers)
    sinks: int | None = None  # prefix rows the maps were not fitted on (run exactly)
    tail: int | None = None
    saved_fraction: float | None = None  # estimated share of layer-passes skipped
    streamed: bool | None = None  # the tail ran chunk by chunk (a plan without selection)
    # How the upper pass ran.
    virtual_requests: int | None = None
    groups: int | None = None
    upper_steps: int | None = None
    slices: int | None = None  # forwards the second sweep ran in, when cut while others decoded (slicing.py)
    yields: int | None = None  # decode steps of other requests the scheduler ran between this prefill's forwards
    exact_upgrade: int | None = None  # rows the exact upgrade rewrites in the request's decode steps (upgrade.py)
    # Diagnostics.
    watched: int | None = None  # watch_rows in the new prefix (the whole prefix, for a reselecting plan)
    watched_exact: int | None = None  # of those, rows that ran exactly (or the cache held exact)
    watched_cached: int | None = None  # watch_rows that came from the cache
    watched_cached_exact: int | None = None  # of those, rows the cache holds as exact
    terminal_rho: float | None = None  # hybrids: the terminal-state correction's mean factor
    tp_ranks: int | None = None
    tp_rows_agree: bool | None = None  # every tensor-parallel rank chose the same exact rows
    # A failure part-way.
    filled_before_failure: int | None = None
    deferred_rows_lost: int | None = None

    def update(self, **values: Any) -> None:
        """Set the named figures (an unknown name raises ``AttributeError``)."""
        for name, value in values.items():
            if name not in _NAMES:
                raise AttributeError(f"RequestStats has no figure {name!r}; known: {', '.join(_NAMES)}")
            setattr(self, name, value)

    def add(self, **counts: int) -> None:
        """Add to the named counts (an unset one counts from 0)."""
        self.update(**{name: (self.get(name) or 0) + n for name, n in counts.items()})

    def get(self, name: str, default: Any = None) -> Any:
        """The figure ``name``, or ``default`` when it was not measured."""
        value = getattr(self, name)
        return default if value is None else value

    def as_dict(self) -> dict[str, Any]:
        """The measured figures, in declaration order (the response's and the log's)."""
        return {name: value for name in _NAMES if (value := getattr(self, name)) is not None}


_NAMES = tuple(f.name for f in dataclasses.fields(RequestStats))
