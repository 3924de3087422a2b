"""Per-request RidgeFill parameters, ``custom_params={"ridgefill": {...}}``: every key declared once, parsed.

They arrive through SGLang's ``SamplingParams.custom_params`` from the native ``/generate``, the
OpenAI-compatible API (``extra_body={"custom_params": {...}}``) and ``Engine.generate``. The server checks
them in the tokenizer process (a bad value is an HTTP 400 for that request alone) and again in the
scheduler, where they become a :class:`~sgl_ridgefill.runtime.plan.RequestPlan`.

:data:`REQUEST_KEYS` is the one list. The parser (:func:`parse_request_params`), the fields of
:class:`RequestParams`, the unknown-key error, which keys a server must opt into
(``--ridgefill-diagnostics``), which plan fields make up a radix-cache namespace (``RequestPlan.namespace``,
checked against the plan's fields in ``runtime/plan.py``) and the README's table of keys are all derived
from it::

    python -m sgl_ridgefill.request_schema --markdown     # the README's "Per request" table

Engine-free: imports neither SGLang nor torch.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from .vocabulary import ARMS, SPLICES, setting_flag  # noqa: F401 - re-exported

KEY = "ridgefill"
WHERE = 'custom_params["ridgefill"]'

CONTROLS = ("none", "random")
MAX_POLICY_NAME = 200
MAX_EXACT_ROWS = 1 << 16
INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
_SHOWN_CHARS = 80  # characters of a bad value echoed back in an error


class RequestParamError(ValueError):
    """A request's ``custom_params["ridgefill"]`` is malformed; the message names the offending key."""


def _shown(value: Any) -> str:
    """``repr(value)``, cut short: errors echo what a client sent, and a client can send a megabyte."""
    try:
        text = repr(value)
    except ValueError:  # an integer beyond Python's 4300-digit limit for str()
        return "an integer too long to print"
    return text if len(text) <= _SHOWN_CHARS else text[: _SHOWN_CHARS - 1] + "…"


@dataclass(frozen=True, kw_only=True)
class RequestKey:
    """One key. ``default`` is the value when the request leaves the key out (``None``: the server's)."""

    name: str
    doc: str  # one line, for the README table
    default: Any = None
    default_doc: str = "the server's"  # the README's default column when ``default`` is None
    diagnostic: bool = False  # a measurement knob: any value but the default needs --ridgefill-diagnostics
    # Changes the filled KV, so it is part of a plan's radix-cache namespace. Which rows run exactly does not
    # (a filled row's KV depends on its own tokens only, and the cache records which of its rows are exact), so
    # the keys that choose rows are not.
    in_namespace: bool = False
    VALUE: ClassVar[str] = "Any"  # the type of a parsed value, for RequestParams' field

    @property
    def where(self) -> str:
        return f'{WHERE}["{self.name}"]'

    def parse(self, value: Any) -> Any:
        """``value`` checked (never ``None``: an absent key); raises :class:`RequestParamError`."""
        raise NotImplementedError

    def is_diagnostic(self, value: Any) -> bool:
        """Whether a request that sent ``value`` uses a diagnostic."""
        return self.diagnostic and value != self.default

    def values_text(self) -> str:
        raise NotImplementedError

    def diagnostic_text(self) -> str:
        return "yes" if self.diagnostic else ""

    def params_field(self) -> tuple[str, str, Any]:
        """This key's field of :class:`RequestParams`: name, type, default."""
        annotation = self.VALUE if self.default is not None else f"{self.VALUE} | None"
        return self.name, annotation, field(default=self.default)


@dataclass(frozen=True, kw_only=True)
class BoolKey(RequestKey):
    VALUE: ClassVar[str] = "bool"

    def parse(self, value: Any) -> bool:
        if not isinstance(value, bool):
            raise RequestParamError(f"{self.where} must be true or false, got {_shown(value)}")
        return value

    def values_text(self) -> str:
        return "`true`, `false`"


@dataclass(frozen=True, kw_only=True)
class IntKey(RequestKey):
    VALUE: ClassVar[str] = "int"
    lo: int
    hi: int  # every integer is bounded: SGLang's msgspec send raises OverflowError (HTTP 500) at 2**64

    def parse(self, value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise RequestParamError(f"{self.where} must be an integer, got {_shown(value)}")
        if not self.lo <= value <= self.hi:
            raise RequestParamError(f"{self.where} must be in [{self.lo}, {self.hi}], got {_shown(value)}")
        return value

    def values_text(self) -> str:
        return f"integer in [{self.lo}, {self.hi}]"


@dataclass(frozen=True, kw_only=True)
class EnumKey(RequestKey):
    VALUE: ClassVar[str] = "str"
    choices: tuple[str, ...]
    diagnostic_choices: frozenset[str] = field(default_factory=frozenset)  # values that need diagnostics

    def __post_init__(self) -> None:
        assert self.diagnostic_choices <= set(self.choices), (self.name, self.diagnostic_choices)

    def parse(self, value: Any) -> str:
        if not isinstance(value, str) or value not in self.choices:
            raise RequestParamError(f"{self.where} must be one of {', '.join(self.choices)}, got {_shown(value)}")
        return value

    def is_diagnostic(self, value: Any) -> bool:
        return value in self.diagnostic_choices or super().is_diagnostic(value)

    def values_text(self) -> str:
        return ", ".join(f"`{c}`" for c in self.choices)

    def diagnostic_text(self) -> str:
        if self.diagnostic_choices and not self.diagnostic:
            return ", ".join(f"`{c}`" for c in self.choices if c in self.diagnostic_choices)
        return super().diagnostic_text()


@dataclass(frozen=True, kw_only=True)
class PolicyKey(RequestKey):
    VALUE: ClassVar[str] = "str"
    max_length: int = MAX_POLICY_NAME

    def parse(self, value: Any) -> str:
        if not isinstance(value, str) or not value:
            raise RequestParamError(f"{self.where} must be a policy name, got {_shown(value)}")
        if len(value) > self.max_length:
            raise RequestParamError(
                f"{self.where} must be a policy name of at most {self.max_length} characters, got {len(value)}"
            )
        return value

    def values_text(self) -> str:
        return f"policy name (at most {self.max_length} characters)"


@dataclass(frozen=True, kw_only=True)
class SpliceKey(RequestKey):
    """``kind`` or ``kind@lo-hi``: the splice of ``SPLICES`` on every upper layer, or on layers ``lo..hi``."""

    VALUE: ClassVar[str] = "str"

    def parse(self, value: Any) -> str:
        if isinstance(value, str):
            kind, at, layers = value.partition("@")
            if kind in SPLICES and (not at or _layer_range(layers) is not None):
                return value
        raise RequestParamError(
            f"{self.where} must be one of {', '.join(SPLICES)}, optionally followed by @FIRST-LAST upper layers "
            f"(e.g. keys@13-17), got {_shown(value)}"
        )

    def values_text(self) -> str:
        return ", ".join(f"`{c}`" for c in SPLICES) + ", each optionally `@FIRST-LAST` (layers)"


def _layer_range(text: str) -> tuple[int, int] | None:
    first, sep, last = text.partition("-")
    if not (first.isdigit() and (not sep or last.isdigit())):
        return None
    lo, hi = int(first), int(last or first)
    return (lo, hi) if lo <= hi <= 1024 else None


def parse_splice(value: str) -> tuple[str, tuple[int, int] | None]:
    """A checked ``splice`` value as ``(kind, (first, last) layers or None for every upper layer)``."""
    kind, _, layers = value.partition("@")
    return kind, (_layer_range(layers) if layers else None)


@dataclass(frozen=True, kw_only=True)
class RowsKey(RequestKey):
    """A list of prompt positions (integers), at most ``max_rows`` of them."""

    VALUE: ClassVar[str] = "tuple[int, ...]"
    max_rows: int = MAX_EXACT_ROWS

    def parse(self, value: Any) -> tuple[int, ...]:
        if (
            not isinstance(value, list)
            or len(value) > self.max_rows
            or any(isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= INT32_MAX for v in value)
        ):
            raise RequestParamError(
                f"{self.where} must be a list of at most {self.max_rows} prompt positions in [0, {INT32_MAX}], "
                f"got {_shown(value)}"
            )
        return tuple(sorted(set(value)))

    def values_text(self) -> str:
        return f"list of at most {self.max_rows} positions"


REQUEST_KEYS: tuple[RequestKey, ...] = (
    BoolKey(name="enabled", default=True, doc="false runs this request exactly"),
    EnumKey(
        name="arm", choices=ARMS, diagnostic_choices=frozenset({"identity", "nofill"}), in_namespace=True,
        doc="`ridgefill`, `exact`, or a control arm: `identity` (the split state copied to the upper layers) or "
            "`nofill` (the upper layers hold nothing for the prefix)",
    ),
    PolicyKey(
        name="policy",  # the compiled policy's identity goes into the namespace, not its name
        doc="a policy by name: the server's own, or one `--ridgefill-request-policies` allows",
    ),
    IntKey(name="split", lo=1, hi=1024, in_namespace=True, doc="split layer S (overrides the policy, its splits by prompt length too)"),
    IntKey(name="tail", lo=1, hi=INT32_MAX, in_namespace=True,
           doc="tail length T in tokens (overrides the policy; at most `--ridgefill-max-tail`)"),
    IntKey(name="exact_every", lo=1, hi=INT32_MAX, diagnostic=True, default_doc="off",
           doc="every k-th new prefix row runs exactly (a simple selection for tests and controls)"),
    EnumKey(name="control", choices=CONTROLS, default="none", diagnostic=True,
            doc="`random`: as many random prefix rows run exactly as the selection chose"),
    IntKey(name="value_rescale", lo=0, hi=INT32_MAX, in_namespace=True,
           doc="the value rescale `c`; 0 turns the policy's correction off"),
    IntKey(name="seed", lo=0, hi=INT64_MAX, default=0, diagnostic=True,
           doc="seed of the random control's rows"),
    SpliceKey(name="splice", diagnostic=True, in_namespace=True, default_doc="off",
              doc="the filled rows get the exact model's keys, values, both, or key magnitude, in every upper layer "
                  "or in layers FIRST..LAST (costs a full exact prefill; for `sgl-ridgefill eval`)"),
    RowsKey(name="exact_rows", diagnostic=True, default_doc="off",
            doc="these prompt positions run exactly, instead of the policy's selection (an oracle for "
                "`sgl-ridgefill eval`: the needle's own rows)"),
    RowsKey(name="watch_rows", diagnostic=True, default_doc="off",
            doc="changes nothing that runs: the response says how many of these prompt positions were in the "
                "filled prefix (`watched`) and how many of those ran exactly (`watched_exact`; for a plan that "
                "chooses its rows again over a reused cache, the whole prefix and the rows exact once it ran), and in namespace "
                "mode how many came from the cache (`watched_cached`) and how many of those were exact there "
                "(`watched_cached_exact`); `sgl-ridgefill eval` watches the needle's rows to see whether a selection "
                "found them"),
)
KEYS_BY_NAME: dict[str, RequestKey] = {k.name: k for k in REQUEST_KEYS}
assert len(KEYS_BY_NAME) == len(REQUEST_KEYS), "duplicate request key"


def key_names() -> tuple[str, ...]:
    return tuple(KEYS_BY_NAME)


def namespace_fields() -> tuple[str, ...]:
    """The keys that change the filled KV: with the maps and the policy's identity, a plan's namespace."""
    return tuple(k.name for k in REQUEST_KEYS if k.in_namespace)


def expand_shorthand(raw: Any) -> Any:
    """The object form of the shorthands ``true``/``false``, an arm name and a policy name; else ``raw``."""
    if isinstance(raw, bool):
        return {"enabled": raw}
    if isinstance(raw, str):
        return {"arm": raw} if raw in ARMS else {"policy": raw}
    return raw


def parse_fields(raw: Any) -> dict[str, Any]:
    """The keys ``raw`` (the value of ``custom_params["ridgefill"]``, shorthands included) gives, checked.

    Keys set to ``None`` count as absent. Raises :class:`RequestParamError`."""
    raw = expand_shorthand(raw)
    if not isinstance(raw, Mapping):
        raise RequestParamError(f"{WHERE} must be an object, a boolean or an arm name, got {_shown(raw)}")
    unknown = sorted(_shown(k) for k in raw if k not in KEYS_BY_NAME)
    if unknown:
        listed = ", ".join(unknown[:5]) + (f" and {len(unknown) - 5} more" if len(unknown) > 5 else "")
        raise RequestParamError(f"{WHERE} has unknown key(s) {listed}; known keys: {', '.join(sorted(KEYS_BY_NAME))}")
    return {k.name: k.parse(raw[k.name]) for k in REQUEST_KEYS if raw.get(k.name) is not None}


def diagnostic_keys_used(params: Any) -> list[str]:
    """``name=value`` for each diagnostic key or value in ``params`` (a ``RequestParams`` or ``None``), in
    declaration order; empty when the request needs no ``--ridgefill-diagnostics``."""
    if params is None:
        return []
    used = []
    for k in REQUEST_KEYS:
        value = getattr(params, k.name)
        if value is not None and k.is_diagnostic(value):
            used.append(f"{k.name}={json.dumps(value)}")
    return used


def diagnostic_summary() -> str:
    """What ``--ridgefill-diagnostics`` unlocks, for help texts: ```arm` `identity` and `nofill`, `splice```."""
    parts = []
    for k in REQUEST_KEYS:
        if k.diagnostic:
            parts.append(f"`{k.name}`")
        elif isinstance(k, EnumKey) and k.diagnostic_choices:
            parts.append(f"`{k.name}` " + " and ".join(f"`{c}`" for c in k.choices if c in k.diagnostic_choices))
    return ", ".join(parts)


def request_keys_markdown() -> str:
    """The README's table of keys."""
    lines = ["| key | values | default | diagnostic | meaning |", "|---|---|---|---|---|"]
    for k in REQUEST_KEYS:
        default = k.default_doc if k.default is None else f"`{json.dumps(k.default)}`"
        lines.append(f"| `{k.name}` | {k.values_text()} | {default} | {k.diagnostic_text()} | {k.doc} |")
    return "\n".join(lines) + "\n"


class _RequestParamsBase:
    @property
    def wants_exact(self) -> bool:
        return not self.enabled or self.arm == "exact"


# One field per key of REQUEST_KEYS, same order and defaults: a key is declared once, above.
RequestParams = dataclasses.make_dataclass(
    "RequestParams", [k.params_field() for k in REQUEST_KEYS], bases=(_RequestParamsBase,), frozen=True,
)
RequestParams.__module__ = __name__  # pickles by name, as a class written here would
RequestParams.__doc__ = """What one request asked for: one field per key of ``REQUEST_KEYS`` (its name and default);
``None`` fields fall back to the server's policy."""


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
            f"this server accepts them only when started with {setting_flag('diagnostics')}"
        )


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--markdown", action="store_true", help="print the README's table (the default)")
    parser.parse_args()
    print(request_keys_markdown(), end="")
