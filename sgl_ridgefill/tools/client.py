"""A small HTTP client for one SGLang server's native API: ``/generate``, ``/flush_cache``, model info.

Only the standard library, so the benchmark runs wherever the package imports. TTFT is the wall time of a
non-streaming ``/generate`` with ``max_new_tokens=1`` (prefill plus one sampling step, which is the
same for both arms), or the time to the first streamed chunk with ``stream=True``.
"""

from __future__ import annotations

import dataclasses
import json
import time
import urllib.error
import urllib.request
from typing import Any


class ServerError(RuntimeError):
    """The server answered with an error, or could not be reached; the message names the URL. ``status``: the
    HTTP status of an error answer (None when there was none)."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


@dataclasses.dataclass(frozen=True)
class Timing:
    """One timed request: ``seconds`` of wall time and the server's ``meta_info`` (``cached_tokens``, ...)."""

    seconds: float
    meta_info: dict[str, Any]

    @property
    def cached_tokens(self) -> int:
        return int(self.meta_info.get("cached_tokens") or 0)


class BenchClient:
    """Talks to the server at ``url`` (``http://host:port``)."""

    def __init__(self, url: str, *, timeout: float = 1800.0):
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"--url must start with http:// or https://, got {url!r}")
        self.url = url.rstrip("/")
        self.timeout = timeout

    def _request(self, method: str, path: str, body: Any = None) -> bytes:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            self.url + path, data=data, method=method, headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                return resp.read()
        except urllib.error.HTTPError as e:
            detail = e.read()[:500].decode(errors="replace")
            raise ServerError(f"{method} {self.url}{path}: HTTP {e.code}: {detail}", e.code) from None
        except (urllib.error.URLError, OSError) as e:
            raise ServerError(f"{method} {self.url}{path}: {getattr(e, 'reason', e)}") from None

    def get_json(self, path: str) -> dict[str, Any]:
        return json.loads(self._request("GET", path))

    def model_info(self) -> dict[str, Any]:
        """``GET /get_model_info`` (``model_path``, ...)."""
        return self.get_json("/get_model_info")

    def flush_cache(self, *, retry_s: float = 60.0) -> None:
        """``POST /flush_cache``: empty the radix cache, so no request reuses another's prefix.

        SGLang answers a ``/generate`` before the request has left its running batch and refuses a flush
        (HTTP 400) until it has: refusals are retried for up to ``retry_s`` seconds, then raised."""
        deadline = time.monotonic() + retry_s
        while True:
            try:
                self._request("POST", "/flush_cache", {})
                return
            except ServerError as e:
                if e.status != 400 or time.monotonic() >= deadline:
                    raise
            time.sleep(0.1)

    def generate(self, body: dict[str, Any]) -> dict[str, Any]:
        """``POST /generate`` with ``body``; raises :class:`ServerError` on an HTTP error or an aborted request."""
        return checked_response(json.loads(self._request("POST", "/generate", body)), f"POST {self.url}/generate")

    def time_generate(self, input_ids: list[int], custom_params: dict[str, Any] | None, *, stream: bool = False) -> Timing:
        """Send one prompt with ``max_new_tokens=1`` and time it (see module docstring)."""
        sampling: dict[str, Any] = {"max_new_tokens": 1, "temperature": 0.0}
        if custom_params is not None:
            sampling["custom_params"] = custom_params
        body = {"input_ids": input_ids, "sampling_params": sampling, "stream": stream}
        req = urllib.request.Request(
            self.url + "/generate", data=json.dumps(body).encode(), method="POST",
            headers={"Content-Type": "application/json"},
        )
        start = time.perf_counter()
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                if stream:
                    first = _first_stream_chunk(resp)
                    seconds = time.perf_counter() - start
                    resp.read()  # drain so the connection closes cleanly
                    payload = first
                else:
                    raw = resp.read()
                    seconds = time.perf_counter() - start
                    payload = json.loads(raw)
        except urllib.error.HTTPError as e:
            detail = e.read()[:500].decode(errors="replace")
            raise ServerError(f"POST {self.url}/generate: HTTP {e.code}: {detail}", e.code) from None
        except (urllib.error.URLError, OSError) as e:
            raise ServerError(f"POST {self.url}/generate: {getattr(e, 'reason', e)}") from None
        payload = checked_response(payload, f"POST {self.url}/generate")
        return Timing(seconds=seconds, meta_info=payload.get("meta_info", {}))


def checked_response(payload: Any, where: str) -> dict[str, Any]:
    """``payload`` (one ``/generate`` response), or :class:`ServerError` naming ``where`` when it is an error
    or an aborted request."""
    if not isinstance(payload, dict):
        raise ServerError(f"{where}: expected one JSON object, got {type(payload).__name__}")
    if payload.get("error"):
        raise ServerError(f"{where}: {payload['error']}")
    finish = (payload.get("meta_info") or {}).get("finish_reason") or {}
    if isinstance(finish, dict) and finish.get("type") == "abort":
        raise ServerError(f"{where}: request aborted: {finish.get('message')}")
    return payload


def _first_stream_chunk(resp) -> dict[str, Any]:
    """The first ``data: {...}`` event of a server-sent-event response."""
    for line in resp:
        line = line.strip()
        if line.startswith(b"data:"):
            data = line[5:].strip()
            if data == b"[DONE]":
                break
            return json.loads(data)
    raise ServerError("the streamed response ended before its first chunk")
