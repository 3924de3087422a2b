"""A request's RidgeFill plan (fixed when the request is admitted) and its state across chunks."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

import torch

from ..request_schema import namespace_fields


@dataclass(frozen=True)
class RequestPlan:
    """What the forward does for one request; built by ``RidgeFillRuntime.plan_request``.

    ``policy`` is a compiled ``.rfpolicy`` (``sgl_ridgefill.policy.CompiledPolicy``) or ``None``;
    ``exact_every`` is the simple selection (every k-th new prefix row) used by tests and controls.
    """

    arm: str  # "ridgefill" | "identity" | "nofill"
    split: int
    tail: int
    cache_mode: str = "no_insert"
    exact_every: int | None = None
    control: str = "none"
    value_rescale: int | None = None
    seed: int = 0
    policy: Any = None
    policy_name: str = ""
    maps_id: str = ""
    logprob_start: int | None = None  # first prompt row whose logprob the request wants (tail rows only)
    splice: str | None = None  # diagnostic: "keys" | "values" | "both" | "key_norm" (eval splice tests)

    def __post_init__(self) -> None:
        assert self.arm in ("ridgefill", "identity", "nofill"), self.arm
        assert self.split >= 1 and self.tail >= 1

    @property
    def has_selection(self) -> bool:
        return self.exact_every is not None or (self.policy is not None and self.policy.has_selection())

    @property
    def namespace(self) -> str:
        """Cache namespace for ``cache_mode = namespace``: everything that changes the filled KV, i.e. the
        maps, the policy's identity and the plan fields of the request keys declared ``in_namespace``."""
        parts = [f"maps={self.maps_id}", f"policy={getattr(self.policy, 'identity', '')}"]
        parts += [f"{name}={getattr(self, name)}" for name in namespace_fields()]
        return "rf:" + hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]


@dataclass
class RequestState:
    """Per-request bookkeeping between the chunks of one prefill (scheduler process only)."""

    plan: RequestPlan
    prompt_ids: torch.Tensor  # [N] int64, the whole prompt
    start: int = -1  # rows already in KV when the prefill began (radix-cache hit); -1 until the first chunk
    exact: bool = False  # decided at the first chunk: nothing to fill, run the request exactly
    prefill_done: bool = False
    # Split states kept for the second sweep: the tail's, and the new prefix rows' when rows get selected.
    tail_x: torch.Tensor | None = None  # [T, d]
    prefix_x: torch.Tensor | None = None  # [B - start, d]
    # Query rows captured in the lower layers for attention statistics: requirement -> layer -> [q, heads, d]
    queries: dict = field(default_factory=dict)
    stats: dict = field(default_factory=dict)  # filled, exact, tail rows etc. for logging and metrics

    @property
    def num_tokens(self) -> int:
        return int(self.prompt_ids.numel())

    @property
    def boundary(self) -> int:
        """First tail row ``B = N - T``."""
        return max(0, self.num_tokens - self.plan.tail)
