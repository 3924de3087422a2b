"""SGLang frontend programs (``@sgl.function``) with a RidgeFill policy.

``sgl.gen`` has no ``custom_params``, and SGLang's ``RuntimeEndpoint`` builds every ``/generate`` body
itself, so a frontend program cannot ask for RidgeFill on its own. :class:`RidgeFillEndpoint` is a
``RuntimeEndpoint`` that adds ``sampling_params.custom_params = {"ridgefill": {...}}`` (and, if given, an
``extra_key``) to every ``/generate`` request it sends: ``sgl.gen``, streaming, ``sgl.select``, the prefix
cache of ``run_batch`` and the ``max_new_tokens: 0`` request that ``s.fork()`` sends to cache the shared
prefix. The last two matter most: a server started with ``--ridgefill-cache-mode namespace`` keeps filled
KV in a namespace per RidgeFill plan, so a fork finds the prefix its parent cached only when both carry
the same parameters::

    import sglang as sgl
    from sgl_ridgefill.frontend import RidgeFillEndpoint, ridgefill

    # server: python -m sglang.launch_server --model-path M --prefill-backend ridgefill \\
    #             --ridgefill-maps maps/M --ridgefill-cache-mode namespace
    endpoint = RidgeFillEndpoint("http://127.0.0.1:30000", ridgefill={"arm": "ridgefill", "tail": 1024})
    sgl.set_default_backend(endpoint)

    @sgl.function
    def answer_two(s, document):
        s += document
        s.sync()                                # see "Limits" below
        forks = s.fork(2)                       # caches `document` in the RidgeFill namespace
        for i, f in enumerate(forks):
            f += f"\\nQuestion {i}: ..." + sgl.gen("answer", max_tokens=64)   # reuses it
        forks.join()

    answer_two.run(document=long_text)
    with endpoint.ridgefill(enabled=False):     # this block only: exact prefill
        answer_two.run(document=long_text)
    with ridgefill(arm="identity"):             # every RidgeFillEndpoint, this block only
        answer_two.run(document=long_text)
    answer_two.run_batch(batch, backend=endpoint.with_ridgefill(tail=512))

The parameters are those of ``custom_params["ridgefill"]`` (the keys of
:data:`sgl_ridgefill.request_schema.REQUEST_KEYS`); ``None`` sends none and the server's policy applies.
They are checked when given, so a typo fails before any request. An override's fields replace the endpoint's and keep the rest.

Limits. SGLang's ``s.fork(n)`` sends its prefix-caching request only if the parent's worker thread has
already applied the text before it; ``s.sync()`` first makes sure the prefix is filled once and shared,
rather than computed by every branch. Overrides live in a ``contextvars`` context. ``run()`` (not
streaming) runs the program body in the caller's thread, so every executor it creates, forks included,
sees the override. SGLang starts the threads of ``run_batch`` (whole programs) and ``run(stream=True)``
(the body, where forks are made) without the caller's context: there the override is lost, for the forks
alone in the streaming case, so pass ``backend=endpoint.with_ridgefill(...)`` instead.
``sgl.select`` scores choices with prompt logprobs: the server serves them under RidgeFill when every scored
row lies in the tail and the prompt is prefilled in one chunk, and runs the request exactly otherwise.

How the parameters get in: each ``/generate`` POST of ``RuntimeEndpoint`` goes through the module global
``sglang.lang.backend.runtime_endpoint.http_request``. The first endpoint wraps that global once
(``client_patch.wrap_http_request``); the wrapper edits a body only
while a :class:`RidgeFillEndpoint` method runs in the same context, so stock endpoints in the process are
untouched. Each method checks that its request really passed the wrapper and raises otherwise, so an
SGLang that posts some other way fails loudly instead of dropping the policy.
"""

from __future__ import annotations

import contextlib
import contextvars
import copy
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sglang.lang.backend.runtime_endpoint import RuntimeEndpoint

from .client_patch import HTTP_REQUEST, wrap_http_request
from .patches import NAMESPACE_MARK
from .request_schema import KEY, RequestParamError, expand_shorthand, parse_request_params

if TYPE_CHECKING:
    from sglang.lang.choices import ChoicesDecision, ChoicesSamplingMethod
    from sglang.lang.interpreter import StreamExecutor
    from sglang.lang.ir import SglSamplingParams

__all__ = ["RidgeFillEndpoint", "ridgefill"]

_GENERATE_PATH = "/generate"


@dataclass(frozen=True)
class _Override:
    target: RidgeFillEndpoint | None  # None: every endpoint
    fields: Mapping[str, Any]


_OVERRIDES: contextvars.ContextVar[tuple[_Override, ...]] = contextvars.ContextVar("ridgefill_overrides", default=())


@dataclass
class _Sending:
    """What one endpoint method attaches to the ``/generate`` bodies it posts, and how many it posted."""

    url: str
    params: dict[str, Any] | None
    extra_key: str | None
    stamped: int = 0

    def stamp(self, body: Any) -> Any:
        self.stamped += 1
        if not isinstance(body, dict) or (self.params is None and self.extra_key is None):
            return body
        body = dict(body)  # the caller's dict is left as it was
        if self.params is not None:
            sampling = dict(body.get("sampling_params") or {})
            sampling["custom_params"] = {**(sampling.get("custom_params") or {}), KEY: dict(self.params)}
            body["sampling_params"] = sampling
        if self.extra_key is not None:
            body.setdefault("extra_key", self.extra_key)
        return body


_SENDING: contextvars.ContextVar[_Sending | None] = contextvars.ContextVar("ridgefill_sending", default=None)


def _stamp(url: str, body: Any) -> Any:
    """The body SGLang's ``http_request`` posts to ``url``: stamped while an endpoint method sends there."""
    sending = _SENDING.get()
    return sending.stamp(body) if sending is not None and url == sending.url else body


def _checked_params(spec: Any, origin: str) -> dict[str, Any] | None:
    """``spec`` as a ``custom_params["ridgefill"]`` dict, validated; errors name ``origin``."""
    if spec is None:
        return None
    if isinstance(spec, (bool, str)):
        params: Any = expand_shorthand(spec)
    elif isinstance(spec, Mapping):
        params = dict(spec)
    else:
        raise RequestParamError(f"{origin}: expected a mapping, a boolean or an arm or policy name, got {spec!r}")
    try:
        parse_request_params({KEY: params})
    except RequestParamError as e:
        raise RequestParamError(f"{origin}: {e}") from None
    return params


def _describe(fields: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in fields.items())


@contextlib.contextmanager
def _overriding(target: RidgeFillEndpoint | None, fields: dict[str, Any], origin: str) -> Iterator[None]:
    _checked_params(fields, origin)
    token = _OVERRIDES.set((*_OVERRIDES.get(), _Override(target, fields)))
    try:
        yield
    finally:
        _OVERRIDES.reset(token)


def ridgefill(**fields: Any) -> contextlib.AbstractContextManager[None]:
    """Override the RidgeFill parameters of every :class:`RidgeFillEndpoint` for a ``with`` block.

    ``fields`` are ``custom_params["ridgefill"]`` keys (``ridgefill(arm="exact")``); they replace the
    endpoint's and keep the rest. Validated on entry (``RequestParamError``). See the module docstring for
    where a context does not reach (``run_batch``, ``stream=True``)."""
    return _overriding(None, fields, f"ridgefill({_describe(fields)})")


class RidgeFillEndpoint(RuntimeEndpoint):
    """A ``RuntimeEndpoint`` whose every ``/generate`` request carries RidgeFill parameters.

    ``ridgefill``: the ``custom_params["ridgefill"]`` value (a dict, ``True``/``False`` or an arm or policy
    name), or ``None`` for the server's policy. ``extra_key``: an optional radix-cache key of your own,
    also sent with every request (RidgeFill's namespace is added to it server-side). Both are checked
    before the server is contacted; the other arguments are ``RuntimeEndpoint``'s.
    """

    def __init__(
        self,
        base_url: str,
        ridgefill: Mapping[str, Any] | bool | str | None = None,
        *,
        extra_key: str | None = None,
        api_key: str | None = None,
        verify: str | None = None,
        chat_template_name: str | None = None,
    ) -> None:
        self._ridgefill = _checked_params(ridgefill, f"RidgeFillEndpoint(ridgefill={ridgefill!r})")
        if extra_key is not None and (not isinstance(extra_key, str) or NAMESPACE_MARK in extra_key):
            raise ValueError(
                f"RidgeFillEndpoint(extra_key={extra_key!r}): expected a string without {NAMESPACE_MARK!r} "
                "(reserved for RidgeFill's cache namespace)"
            )
        self._extra_key = extra_key
        wrap_http_request(_stamp)
        super().__init__(base_url, api_key=api_key, verify=verify, chat_template_name=chat_template_name)

    # ------------------------------------------------------------------------- policy
    @property
    def ridgefill_params(self) -> dict[str, Any] | None:
        """The ``custom_params["ridgefill"]`` a request from the current context carries (``None``: none)."""
        params = self._ridgefill
        for override in _OVERRIDES.get():
            if override.target is None or override.target is self:
                params = {**(params or {}), **override.fields}
        return params

    def ridgefill(self, **fields: Any) -> contextlib.AbstractContextManager[None]:
        """Override this endpoint's parameters for a ``with`` block (same rules as :func:`ridgefill`)."""
        return _overriding(self, fields, f"RidgeFillEndpoint.ridgefill({_describe(fields)})")

    def with_ridgefill(self, **fields: Any) -> RidgeFillEndpoint:
        """A copy of this endpoint (no request sent) whose parameters are these ``fields`` over its own.

        Use it as ``backend=`` where a context override does not reach (``run_batch``, ``stream=True``)."""
        origin = f"RidgeFillEndpoint.with_ridgefill({_describe(fields)})"
        _checked_params(fields, origin)
        other = copy.copy(self)
        other._ridgefill = {**(self._ridgefill or {}), **fields}
        return other

    @contextlib.contextmanager
    def _sending(self, method: str) -> Iterator[_Sending]:
        sending = _Sending(self.base_url + _GENERATE_PATH, self.ridgefill_params, self._extra_key)
        token = _SENDING.set(sending)
        try:
            yield sending
        finally:
            _SENDING.reset(token)
        if sending.stamped == 0:
            raise RuntimeError(
                f"RidgeFillEndpoint.{method}: SGLang's RuntimeEndpoint.{method} posted no /generate request "
                f"through {HTTP_REQUEST}, so the RidgeFill parameters were not attached"
            )

    # ------------------------------------------------------------------------- every method that posts
    def cache_prefix(self, prefix_str: str) -> None:
        with self._sending("cache_prefix"):
            super().cache_prefix(prefix_str)

    def commit_lazy_operations(self, s: StreamExecutor) -> None:
        with self._sending("commit_lazy_operations"):
            super().commit_lazy_operations(s)

    def fill_image(self, s: StreamExecutor) -> None:
        with self._sending("fill_image"):
            super().fill_image(s)

    def generate(self, s: StreamExecutor, sampling_params: SglSamplingParams) -> tuple[str, dict]:
        with self._sending("generate"):
            return super().generate(s, sampling_params)

    def generate_stream(self, s: StreamExecutor, sampling_params: SglSamplingParams) -> Iterator[tuple[str, dict]]:
        chunks = super().generate_stream(s, sampling_params)
        # The POST happens at the first ``next``; the context is set only around it, never across a yield.
        with self._sending("generate_stream"):
            first = next(chunks, None)
        if first is None:
            return
        yield first
        yield from chunks

    def select(
        self, s: StreamExecutor, choices: list[str], temperature: float, choices_method: ChoicesSamplingMethod
    ) -> ChoicesDecision:
        with self._sending("select"):
            return super().select(s, choices, temperature, choices_method)
