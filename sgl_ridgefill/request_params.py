"""Per-request RidgeFill parameters: ``custom_params={"ridgefill": {...}}``.

They arrive through SGLang's ``SamplingParams.custom_params`` from the native ``/generate``, the
OpenAI-compatible API (``extra_body={"custom_params": {...}}``) and ``Engine.generate``. The server checks
them in the tokenizer process (a bad value is an HTTP 400 for that request alone) and again in the
scheduler, where they become a :class:`~sgl_ridgefill.runtime.plan.RequestPlan`. The keys, their values and
their errors are declared in ``request_schema.py``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .request_schema import KEY, REQUEST_KEYS, WHERE, RequestParamError, diagnostic_keys_used, parse_fields
from .settings import SETTINGS_BY_NAME

__all__ = ["KEY", "RequestParamError", "RequestParams", "parse_request_params", "refuse_diagnostics"]


@dataclass(frozen=True)
class RequestParams:
    """What one request asked for (one field per key of ``REQUEST_KEYS``, same order and defaults);
    ``None`` fields fall back to the server's policy."""

    enabled: bool = True
    arm: str | None = None
    policy: str | None = None
    split: int | None = None
    tail: int | None = None
    exact_every: int | None = None
    control: str = "none"
    value_rescale: int | None = None
    seed: int = 0
    splice: str | None = None
    exact_rows: tuple[int, ...] | None = None
    watch_rows: tuple[int, ...] | None = None

    @property
    def wants_exact(self) -> bool:
        return not self.enabled or self.arm == "exact"


# A key declared without its field (or the other way round) would be dropped silently: fail at import.
assert [(f.name, f.default) for f in dataclasses.fields(RequestParams)] == [
    (k.name, k.default) for k in REQUEST_KEYS
], "RequestParams and request_schema.REQUEST_KEYS differ"


def parse_request_params(custom_params: Mapping[str, Any] | None) -> RequestParams | None:
    """``None`` when the request carries no ``ridgefill`` key; raises :class:`RequestParamError` otherwise bad."""
    if not custom_params or KEY not in custom_params:
        return None
    raw = custom_params[KEY]
    if raw is None:
        return None
    return RequestParams(**parse_fields(raw))


def refuse_diagnostics(params: RequestParams | None) -> None:
    """Raise :class:`RequestParamError` when ``params`` uses a diagnostic key or value (for a server started
    without ``--ridgefill-diagnostics``); one message names them all."""
    used = diagnostic_keys_used(params)
    if used:
        raise RequestParamError(
            f"{WHERE} uses diagnostic setting(s) {', '.join(used)}; "
            f"this server accepts them only when started with {SETTINGS_BY_NAME['diagnostics'].flag}"
        )
