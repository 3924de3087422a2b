"""The corrections a policy may apply after the fill, and when each one applies to a model.

``value_rescale(c=N)``: in each upper attention layer the first ``c`` tail rows measure, per KV head,
the ratio of exact to predicted value norms; filled values are scaled by it (Qwen3.8-27B, c = 512).
``terminal_state(offsets="...")``: at the end of the prefix, ``rho_l * dM_l`` is added once to each
filled recurrent (Gated DeltaNet) layer's state (Qwen3.8-Flash-Next quality mode).
"""

from __future__ import annotations

import dataclasses
import posixpath
from collections.abc import Callable

from sgl_ridgefill.selectors.spec import Param

from . import ast
from .arguments import convert_args
from .errors import PolicyError, did_you_mean
from .targets import ModelInfo

DEFAULT_TERMINAL_OFFSETS = "terminal_state.safetensors"
FILLING_ARMS = ("ridgefill", "identity")


@dataclasses.dataclass(frozen=True)
class ValueRescale:
    """c: tail rows (from the first tail row on) that measure the per-head value scale."""

    c: int


@dataclasses.dataclass(frozen=True)
class TerminalState:
    """offsets: file of per-layer, per-value-head mean state offsets dM, relative to the maps folder."""

    offsets: str


PARAMS: dict[str, tuple[Param, ...]] = {
    "value_rescale": (
        Param("c", "int", "the number of tail rows that measure the scale", minimum=1, maximum=1 << 24),
    ),
    "terminal_state": (
        Param("offsets", "str", "state offsets file in the maps folder", default=DEFAULT_TERMINAL_OFFSETS),
    ),
}

Fail = Callable[..., PolicyError]


def compile_correction(
    call: ast.Call, *, arm: str, split: int | None, tail: int, model: ModelInfo | None, fail: Fail
) -> ValueRescale | TerminalState:
    """Check one ``correct`` call against the deployment; ``fail(message, span)`` builds the error.

    ``split`` is None when it is left to the maps folder: the checks against it are skipped.
    """
    if call.name not in PARAMS:
        hint = did_you_mean(call.name, PARAMS) or f"; known corrections: {', '.join(PARAMS)}"
        raise fail(f"unknown correction {call.name!r}{hint}", call.name_span)
    args = convert_args(call, PARAMS[call.name], fail)
    if arm not in FILLING_ARMS:
        raise fail(f"{call.name}() corrects filled rows, and arm {arm} fills none", call.span)
    if call.name == "value_rescale":
        if "c" not in args:
            raise fail(
                "value_rescale() needs c, the number of tail rows that measure the scale, e.g. value_rescale(c=512)",
                call.span,
            )
        if args["c"] > tail:
            raise fail(f"value_rescale(c={args['c']}) needs at least {args['c']} tail rows, but tail is {tail}", call.span)
        if model is not None and split is not None and not any(l >= split for l in model.attention_layers):
            raise fail(
                f"value_rescale() does not apply to this model: it has no attention layer at or above split {split}",
                call.span,
            )
        return ValueRescale(args["c"])
    offsets = args.get("offsets", DEFAULT_TERMINAL_OFFSETS)
    normal = posixpath.normpath(offsets) if offsets else ""
    if not offsets or offsets.startswith("/") or normal.startswith(".."):
        raise fail(f"terminal_state(offsets=...) must name a file inside the maps folder, got {offsets!r}", call.span)
    if model is not None:
        if not model.recurrent_layers:
            raise fail(
                "terminal_state() does not apply to this model: it has no recurrent (Gated DeltaNet) layers",
                call.span,
            )
        if split is not None and not any(l >= split for l in model.recurrent_layers):
            raise fail(
                f"terminal_state() does not apply to this model: no recurrent layer is at or above split {split}",
                call.span,
            )
    return TerminalState(offsets)
