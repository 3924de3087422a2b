"""A request's RidgeFill plan, fixed when the request is admitted (its state across chunks: ``state.py``)."""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass
from typing import Any

from ..request_schema import REQUEST_KEYS, namespace_fields
from ..vocabulary import PLAN_CACHE_MODES


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
    cache_mode: str = "no_insert"  # one of PLAN_CACHE_MODES (admission resolves ``auto``)
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
        assert self.cache_mode in PLAN_CACHE_MODES, self.cache_mode

    @property
    def has_selection(self) -> bool:
        return (
            self.exact_every is not None
            or self.exact_rows is not None
            or (self.policy is not None and self.policy.has_selection())
        )

    @property
    def reselects(self) -> bool:
        """A namespace plan that chooses exact rows chooses them again over a reused cache: among every prefix
        row, the cached ones included, which it makes exact where the cache holds them filled."""
        return (
            self.cache_mode == "namespace" and self.arm != "nofill" and self.has_selection
            and reselection_blocker(policy=self.policy if self.exact_every is None and self.exact_rows is None else None,
                                    value_rescale=self.value_rescale, splice=self.splice, context=self.context) is None
        )

    def streams_tail(self, *, recurrent: bool, sinks: bool) -> bool:
        """Whether the tail's rows can run every layer in their own chunk (``prefill._stream_tail``): no row of
        the prefix runs exactly (no selection, no sink rows of the maps' sink rule, no splice), no value
        rescale, every key visible (not nofill), and no upper recurrent state to carry (``recurrent``: the model
        has recurrent layers; ``sinks``: the maps have a sink rule)."""
        return (
            not recurrent and self.arm != "nofill" and not self.has_selection and self.splice is None
            and not self.value_rescale and not (sinks and self.arm == "ridgefill")
        )

    @property
    def namespace(self) -> str:
        """Cache namespace for ``cache_mode = namespace``: everything that changes the filled KV, i.e. the
        maps, the policy's identity and the plan fields of the request keys declared ``in_namespace``."""
        parts = [f"maps={self.maps_id}", f"policy={getattr(self.policy, 'identity', '')}"]
        parts += [f"{name}={getattr(self, name)}" for name in namespace_fields()]
        return "rf:" + hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]


def reselection_blocker(*, policy: Any = None, value_rescale: int | None = None, splice: str | None = None,
                        context: bool = False) -> str | None:
    """Why a selecting plan could not choose its rows again over a reused cache (``None``: it can). A probe
    runs the tail's last rows over the filled cache before the tail exists there, the value rescale needs
    every exact row's split state from this request's own pass, a splice rewrites the whole prefix, and a
    kv+context fill reuses no cached prefix at all."""
    from ..selectors.base import ProbeRequirement

    if context:
        return "a kv+context fill reuses no cached prefix"
    if value_rescale:
        return "the value rescale"
    if splice is not None:
        return "a splice"
    if policy is not None and any(isinstance(r, ProbeRequirement) for r in getattr(policy, "requirements", ())):
        return "a probe selection"
    return None


_NOT_CARRIED = ("enabled", "policy")  # decides whether a plan exists; compiled into ``RequestPlan.policy``


def check_carried_keys(keys=REQUEST_KEYS, plan: type = RequestPlan) -> None:
    """Every request key but :data:`_NOT_CARRIED` is a field of ``plan`` with the key's default (where both
    have one), and every namespace key is among them: run at import, since a key added to the schema without
    its plan field would otherwise be dropped from plans and namespaces silently."""
    fields = {f.name: f for f in dataclasses.fields(plan)}
    for key in keys:
        if key.name in _NOT_CARRIED:
            continue
        if key.name not in fields:
            raise AssertionError(f"request key {key.name!r} has no {plan.__name__} field")
        default = fields[key.name].default
        if key.default is not None and default is not dataclasses.MISSING and default != key.default:
            raise AssertionError(f"request key {key.name!r} defaults to {key.default!r}, its {plan.__name__} "
                                 f"field to {default!r}")
    missing = set(namespace_fields()) - set(fields)
    if missing:
        raise AssertionError(f"namespace key(s) {', '.join(sorted(missing))} are not {plan.__name__} fields")


check_carried_keys()
