"""The one client-side patch: in the process of an ``@sgl.function`` program, ``RidgeFillEndpoint`` wraps
SGLang frontend's ``http_request`` so each request carries its RidgeFill parameters (``frontend.py``). It
is not a ``HookRegistry`` hook (no plugin loads in a client process), so it is not a row of
``patches.HOOKS``."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

HTTP_REQUEST = "sglang.lang.backend.runtime_endpoint.http_request"
CLIENT_TARGETS = (HTTP_REQUEST,)
_client_patch_lock = threading.Lock()


def wrap_http_request(stamp: Callable[[str, Any], Any]) -> None:
    """WRAP the module global ``runtime_endpoint.http_request`` in the client process, once.

    SGLang's frontend ``RuntimeEndpoint`` builds every ``/generate`` body itself and posts it through
    this global, and ``sgl.gen`` has no ``custom_params``. RidgeFill passes each body through
    ``stamp(url, body)`` first, which returns the body unchanged or a copy carrying
    ``custom_params["ridgefill"]`` (``frontend.RidgeFillEndpoint``), so that a frontend program, its forks
    and their prefix-caching requests can ask for a RidgeFill plan. Not a HookRegistry hook: it runs in
    the client process, where no plugin loads, lazily when the first ``RidgeFillEndpoint`` is made.
    Idempotent and thread-safe (later calls keep the first ``stamp``); ``RuntimeError`` when the target is
    missing.
    """
    from sglang.lang.backend import runtime_endpoint

    with _client_patch_lock:
        original = getattr(runtime_endpoint, "http_request", None)
        if getattr(original, "_ridgefill_seam", False):
            return
        if not callable(original):
            raise RuntimeError(
                f"{HTTP_REQUEST} is missing, so RidgeFillEndpoint cannot attach its parameters; "
                "this SGLang version posts requests differently from the one sgl-ridgefill supports"
            )

        @functools.wraps(original)
        def http_request(url: str, *args: Any, **kwargs: Any) -> Any:
            # SGLang passes the body as json=... (or first positional after the URL).
            body = args[0] if args else kwargs.get("json")
            stamped = stamp(url, body)
            if stamped is not body:
                if args:
                    args = (stamped, *args[1:])
                else:
                    kwargs["json"] = stamped
            return original(url, *args, **kwargs)

        http_request._ridgefill_seam = True  # type: ignore[attr-defined]
        runtime_endpoint.http_request = http_request
