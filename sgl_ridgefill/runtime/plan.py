"""A request's RidgeFill plan, fixed when the request is admitted (its state across chunks: ``state.py``)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from ..request_schema import namespace_fields
from ..vocabulary import DEFAULT_CACHE_MODE


@dataclass(frozen=True)
class RequestPlan:
    """What the forward does for one request; built by ``admission.Admitter.admit``.

    ``policy`` is a compiled ``.rfpolicy`` (``sgl_ridgefill.policy.CompiledPolicy``) or ``None``;
    ``exact_every`` (every k-th new prefix row) and ``exact_rows`` (given positions) replace the policy's
    selection, for tests, controls and oracles.
    """

    arm: str  # "ridgefill" | "identity" | "nofill"
    split: int
    tail: int
    cache_mode: str = DEFAULT_CACHE_MODE
    exact_every: int | None = None
    control: str = "none"
    value_rescale: int | None = None
    seed: int = 0
    policy: Any = None
    policy_name: str = ""
    maps_id: str = ""
    splice: str | None = None  # diagnostic: "keys" | "values" | "both" | "key_norm", optionally "@first-last"
    exact_rows: tuple[int, ...] | None = None  # diagnostic: these positions exact instead of a selection
    watch_rows: tuple[int, ...] | None = None  # diagnostic: report how many of these ran exactly
    context: bool = False  # a kv+context fill: needs the split states of every row before it (no cache hit)
    terminal_state: str | None = None  # hybrid models: offsets file of the terminal-state correction (None: off)

    def __post_init__(self) -> None:
        assert self.arm in ("ridgefill", "identity", "nofill"), self.arm
        assert self.split >= 1 and self.tail >= 1

    @property
    def has_selection(self) -> bool:
        return (
            self.exact_every is not None
            or self.exact_rows is not None
            or (self.policy is not None and self.policy.has_selection())
        )

    @property
    def namespace(self) -> str:
        """Cache namespace for ``cache_mode = namespace``: everything that changes the filled KV, i.e. the
        maps, the policy's identity and the plan fields of the request keys declared ``in_namespace``."""
        parts = [f"maps={self.maps_id}", f"policy={getattr(self.policy, 'identity', '')}"]
        parts += [f"{name}={getattr(self, name)}" for name in namespace_fields()]
        return "rf:" + hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]
