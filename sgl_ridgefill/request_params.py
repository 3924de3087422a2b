"""Per-request RidgeFill parameters: ``custom_params={"ridgefill": {...}}``.

They arrive through SGLang's ``SamplingParams.custom_params`` from the native ``/generate``, the
OpenAI-compatible API (``extra_body={"custom_params": {...}}``) and ``Engine.generate``. The server checks
them in the tokenizer process (a bad value is an HTTP 400 for that request alone) and again in the
scheduler, where they become a :class:`~sgl_ridgefill.runtime.plan.RequestPlan`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .config import ARMS

KEY = "ridgefill"
CONTROLS = ("none", "random")
SPLICES = ("keys", "values", "both", "key_norm")


class RequestParamError(ValueError):
    """A request's ``custom_params["ridgefill"]`` is malformed; the message names the offending key."""


def _expect_int(name: str, value: Any, lo: int, hi: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise RequestParamError(f'custom_params["ridgefill"]["{name}"] must be an integer, got {value!r}')
    if value < lo or (hi is not None and value > hi):
        bound = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
        raise RequestParamError(f'custom_params["ridgefill"]["{name}"] must be {bound}, got {value}')
    return value


@dataclass(frozen=True)
class RequestParams:
    """What one request asked for; ``None`` fields fall back to the server's policy."""

    enabled: bool = True
    arm: str | None = None
    policy: str | None = None
    split: int | None = None
    tail: int | None = None
    exact_every: int | None = None  # every k-th new prefix row exact (a simple selection for tests/controls)
    control: str = "none"  # "random": replace the selected rows by as many random rows
    value_rescale: int | None = None  # c; 0 turns the policy's correction off
    seed: int = 0
    splice: str | None = None  # diagnostic (sgl-ridgefill eval): exact keys/values/both/key magnitude on filled rows

    @property
    def wants_exact(self) -> bool:
        return not self.enabled or self.arm == "exact"


_FIELDS = {"enabled", "arm", "policy", "split", "tail", "exact_every", "control", "value_rescale", "seed", "splice"}


def parse_request_params(custom_params: Mapping[str, Any] | None) -> RequestParams | None:
    """``None`` when the request carries no ``ridgefill`` key; raises :class:`RequestParamError` otherwise bad."""
    if not custom_params or KEY not in custom_params:
        return None
    raw = custom_params[KEY]
    if raw is None:
        return None
    if isinstance(raw, bool):
        return RequestParams(enabled=raw)
    if isinstance(raw, str):
        raw = {"arm": raw} if raw in ARMS else {"policy": raw}
    if not isinstance(raw, Mapping):
        raise RequestParamError(f'custom_params["ridgefill"] must be an object, a boolean or an arm name, got {raw!r}')
    unknown = sorted(set(raw) - _FIELDS)
    if unknown:
        raise RequestParamError(
            f'custom_params["ridgefill"] has unknown key(s) {", ".join(map(repr, unknown))}; '
            f"known keys: {', '.join(sorted(_FIELDS))}"
        )
    kw: dict[str, Any] = {}
    if "enabled" in raw:
        if not isinstance(raw["enabled"], bool):
            raise RequestParamError(f'custom_params["ridgefill"]["enabled"] must be true or false, got {raw["enabled"]!r}')
        kw["enabled"] = raw["enabled"]
    if raw.get("arm") is not None:
        if raw["arm"] not in ARMS:
            raise RequestParamError(f'custom_params["ridgefill"]["arm"] must be one of {", ".join(ARMS)}, got {raw["arm"]!r}')
        kw["arm"] = raw["arm"]
    if raw.get("policy") is not None:
        if not isinstance(raw["policy"], str) or not raw["policy"]:
            raise RequestParamError(f'custom_params["ridgefill"]["policy"] must be a policy name, got {raw["policy"]!r}')
        kw["policy"] = raw["policy"]
    for name, lo in (("split", 1), ("tail", 1), ("exact_every", 1), ("value_rescale", 0), ("seed", 0)):
        if raw.get(name) is not None:
            kw[name] = _expect_int(name, raw[name], lo)
    if raw.get("control") is not None:
        if raw["control"] not in CONTROLS:
            raise RequestParamError(
                f'custom_params["ridgefill"]["control"] must be one of {", ".join(CONTROLS)}, got {raw["control"]!r}'
            )
        kw["control"] = raw["control"]
    if raw.get("splice") is not None:
        if raw["splice"] not in SPLICES:
            raise RequestParamError(
                f'custom_params["ridgefill"]["splice"] must be one of {", ".join(SPLICES)}, got {raw["splice"]!r}'
            )
        kw["splice"] = raw["splice"]
    return RequestParams(**kw)
