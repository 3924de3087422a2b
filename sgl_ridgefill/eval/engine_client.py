"""The eval runner's client over an offline ``sglang.Engine`` in this process (``sgl-ridgefill eval --engine``).

It answers like :class:`~sgl_ridgefill.tools.client.BenchClient` (``flush_cache``, ``generate(body)`` with
the ``/generate`` body and response), so the runner does not know which one it talks to. The stock engine
and the RidgeFill engine never run at the same time: the stock one answers the check prompts and is shut
down before the RidgeFill one starts.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

from ..tools.client import ServerError, checked_response

_PASSED = ("return_logprob", "logprob_start_len", "top_logprobs_num")


class EngineClient:
    def __init__(self, engine: Any, name: str):
        self.engine = engine
        self.name = name

    def flush_cache(self) -> None:
        self.engine.flush_cache()

    def generate(self, body: dict[str, Any]) -> dict[str, Any]:
        unknown = set(body) - {"input_ids", "sampling_params", *_PASSED}
        if unknown:
            raise ValueError(f"EngineClient.generate: unsupported field(s) {', '.join(sorted(unknown))}")
        kwargs = {k: body[k] for k in _PASSED if k in body}
        try:
            out = self.engine.generate(input_ids=body["input_ids"], sampling_params=body["sampling_params"], **kwargs)
        except (ValueError, RuntimeError) as e:  # a request SGLang or RidgeFill refused
            raise ServerError(f"{self.name}: {type(e).__name__}: {e}") from None
        return checked_response(out, self.name)


def engine_kwargs(settings: dict[str, Any], *, cpu: bool) -> dict[str, Any]:
    """``sglang.Engine`` keywords for one evaluation engine: the local servers' ``settings``, quieter logs,
    and the CPU arguments on a machine without a GPU."""
    from ..cpu.environment import CPU_SERVER_ARGS

    kwargs = {**settings, "log_level": "warning"}
    if cpu:
        kwargs.update(CPU_SERVER_ARGS)
    return kwargs


@contextlib.contextmanager
def running_engine(kwargs: dict[str, Any], ridgefill: dict[str, Any] | None, name: str) -> Iterator[EngineClient]:
    """An engine for the ``with`` block: stock when ``ridgefill`` is None, else ``ridgefill_engine`` with
    those ``ridgefill_*`` options. ``RIDGEFILL_*`` variables of the caller's environment are dropped first,
    so the stock engine is stock."""
    for key in [k for k in os.environ if k.startswith("RIDGEFILL_")]:
        del os.environ[key]
    if ridgefill is None:
        import sglang

        engine = sglang.Engine(**kwargs)
    else:
        from ..engine import ridgefill_engine

        engine = ridgefill_engine(**kwargs, **ridgefill)
    try:
        yield EngineClient(engine, name)
    finally:
        engine.shutdown()
