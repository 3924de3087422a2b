"""A tiny stand-in for an SGLang server's native API, for the benchmark tests.

``/generate`` sleeps a known time per arm (exact: ``custom_params.ridgefill.enabled == false``; the bare fill:
``policy == "plain"``; else RidgeFill, which reports ``exact_rows`` exact rows in ``meta_info["ridgefill"]``) and
emulates the radix cache: a prompt seen since the last ``/flush_cache`` reports ``cached_tokens``. Every
call is logged in order.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class FakeServer:
    def __init__(self, model_path: str, *, exact_s: float, ridgefill_s: float, abort: bool = False, stream_tail_s: float = 0.0,
                 output_ids: list[int] | None = None, bare_s: float | None = None, exact_rows: int = 0,
                 server_info: dict | None = None):
        self.model_path = model_path
        self.server_info = server_info  # what GET /get_server_info answers (None: 404, as an older server)
        self.output_ids = output_ids or [7]
        self.stream_tail_s = stream_tail_s
        self.exact_s, self.ridgefill_s = exact_s, ridgefill_s
        self.bare_s = ridgefill_s if bare_s is None else bare_s
        self.exact_rows = exact_rows
        self.abort = abort
        self.busy_flushes = 0  # the next this many /flush_cache calls are refused as SGLang does while busy
        self.log: list[tuple] = []  # ("flush",) or ("generate", arm, ids, params)
        self._cache: set[tuple[int, ...]] = set()
        self._lock = threading.Lock()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> FakeServer:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

    def generates(self) -> list[tuple]:
        return [e for e in self.log if e[0] == "generate"]

    def _handler(self):
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep test output quiet
                pass

            def _send(self, code: int, payload) -> None:
                body = json.dumps(payload).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                if self.path == "/get_model_info":
                    self._send(200, {"model_path": fake.model_path, "is_generation": True})
                elif self.path == "/get_server_info" and fake.server_info is not None:
                    self._send(200, fake.server_info)
                else:
                    self._send(404, {"detail": "Not Found"})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                if self.path == "/flush_cache":
                    with fake._lock:
                        if fake.busy_flushes > 0:
                            fake.busy_flushes -= 1
                            fake.log.append(("flush refused",))
                            self._send(400, {"detail": "Flush cache failed."})
                            return
                        fake._cache.clear()
                        fake.log.append(("flush",))
                    self._send(200, {})
                    return
                if self.path != "/generate":
                    self._send(404, {"detail": "Not Found"})
                    return
                params = body["sampling_params"].get("custom_params", {}).get("ridgefill")
                arm = "exact" if params == {"enabled": False} else "ridgefill"
                if arm == "ridgefill" and (params or {}).get("policy") == "plain":
                    arm = "bare"
                ids = tuple(body["input_ids"])
                with fake._lock:
                    cached = len(ids) - 1 if ids in fake._cache else 0
                    fake._cache.add(ids)
                    fake.log.append(("generate", arm, ids, params))
                time.sleep({"exact": fake.exact_s, "bare": fake.bare_s}.get(arm, fake.ridgefill_s))
                finish = {"type": "abort", "message": "RidgeFill: bad"} if fake.abort else {"type": "length", "length": 1}
                payload = {"output_ids": fake.output_ids, "meta_info": {"cached_tokens": cached, "finish_reason": finish}}
                if arm != "exact":
                    payload["meta_info"]["ridgefill"] = {"ran": True, "exact": fake.exact_rows if arm == "ridgefill" else 0}
                if body.get("stream"):
                    # Server-sent events, as SGLang streams them: the first chunk, then a slow tail.
                    self.send_response(200)
                    self.send_header("Content-Type", "text/event-stream")
                    self.end_headers()
                    self.wfile.write(b"data: " + json.dumps(payload).encode() + b"\n\n")
                    self.wfile.flush()
                    time.sleep(fake.stream_tail_s)
                    self.wfile.write(b"data: [DONE]\n\n")
                    return
                self._send(200, payload)

        return Handler
