"""Run the soak's jobs against a server from several client threads and record what came back.

Every HTTP call has a timeout and the run has a deadline: a job not started by then is skipped (and counted).
A job runs on one thread, its calls in order (a session's turns continue one another), except a job whose
calls go ``together`` (one rid twice at once), which gets a thread per call. Client aborts are real: the
client asks ``/abort_request`` for the rid, gives up on a read timeout, or closes a stream after its first
chunk.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from .workload import Call, Job

REQUEST_TIMEOUT_S = 120.0


@dataclass
class Outcome:
    """What one call got. ``status`` is the HTTP status (None: no response, see ``error``); ``response`` the
    parsed JSON of a 2xx answer; ``prompt`` the ids the server ran (a session turn: its whole history),
    None when a turn's history is unknown because an earlier turn failed."""

    job: int
    call: int
    kind: str
    status: int | None = None
    error: str | None = None
    response: dict | None = None
    prompt: tuple[int, ...] | None = None
    elapsed_s: float = 0.0

    @property
    def meta(self) -> dict:
        return (self.response or {}).get("meta_info") or {}

    @property
    def finished(self) -> bool:
        """A complete answer: 2xx and finished by length (not aborted)."""
        return (
            self.status is not None and 200 <= self.status < 300 and self.response is not None
            and (self.meta.get("finish_reason") or {}).get("type") == "length"
        )

    def output_ids(self) -> list[int]:
        return list((self.response or {}).get("output_ids") or [])


class _Http:
    """A ``requests.Session`` per thread (connection reuse without sharing a session across threads)."""

    def __init__(self, url: str):
        self.url = url.rstrip("/")
        self._local = threading.local()

    @property
    def session(self):
        import requests

        if not hasattr(self._local, "session"):
            self._local.session = requests.Session()
        return self._local.session

    def post(self, path: str, body: Any, timeout: float | tuple = REQUEST_TIMEOUT_S, **kwargs):
        return self.session.post(self.url + path, json=body, timeout=timeout, **kwargs)

    def get(self, path: str, timeout: float = 30.0):
        return self.session.get(self.url + path, timeout=timeout)


def _error_name(err: BaseException) -> str:
    import requests

    if isinstance(err, requests.Timeout):
        return "timeout"
    if isinstance(err, requests.ConnectionError):
        return "connection"
    return type(err).__name__


def _parse(resp) -> tuple[dict | None, str | None]:
    try:
        data = resp.json()
    except ValueError:
        return None, resp.text[:300]
    if 200 <= resp.status_code < 300:
        return data, None
    message = data.get("error", data) if isinstance(data, dict) else data
    if isinstance(message, dict):
        message = message.get("message", message)
    return None, str(message)[:300]


class Runner:
    """Sends jobs (or plain bodies) to one server; what each call got is an :class:`Outcome`."""

    def __init__(self, url: str):
        self.http = _Http(url)

    # ------------------------------------------------------------------ one call
    def call(self, job: Job, index: int, call: Call, body: dict, prompt: tuple[int, ...] | None) -> Outcome:
        out = Outcome(job.index, index, job.kind, prompt=prompt)
        start = time.perf_counter()
        try:
            if call.abort == "stream":
                self._stream_and_close(body, out)
            elif call.abort == "timeout":
                self._send(body, out, timeout=(10.0, call.abort_after_s))
            elif call.abort == "endpoint":
                self._send_and_abort(body, out, call)
            else:
                self._send(body, out)
        except Exception as err:  # noqa: BLE001 - every client-side failure is an outcome, not a crash
            out.error = _error_name(err)
        out.elapsed_s = time.perf_counter() - start
        return out

    def _send(self, body: dict, out: Outcome, timeout: float | tuple = REQUEST_TIMEOUT_S) -> None:
        resp = self.http.post("/generate", body, timeout=timeout)
        out.status = resp.status_code
        out.response, out.error = _parse(resp)

    def _send_and_abort(self, body: dict, out: Outcome, call: Call) -> None:
        worker = threading.Thread(target=self._send_quietly, args=(body, out), daemon=True)
        worker.start()
        time.sleep(call.abort_after_s)
        try:
            self.http.post("/abort_request", {"rid": body["rid"]}, timeout=30.0)
        finally:
            worker.join(REQUEST_TIMEOUT_S + 5)

    def _send_quietly(self, body: dict, out: Outcome) -> None:
        try:
            self._send(body, out)
        except Exception as err:  # noqa: BLE001
            out.error = _error_name(err)

    def _stream_and_close(self, body: dict, out: Outcome) -> None:
        with self.http.post("/generate", body, stream=True) as resp:
            out.status = resp.status_code
            if resp.status_code >= 300:
                out.response, out.error = _parse(resp)
                return
            for line in resp.iter_lines():
                if line.startswith(b"data:"):
                    out.error = "closed_after_first_chunk"
                    return  # leaving the block closes the connection mid-stream
            out.error = "stream_ended_without_data"

    # ------------------------------------------------------------------ one job
    def run_job(self, job: Job) -> list[Outcome]:
        bodies = list(job.bodies())
        if job.together:
            results: list[Outcome | None] = [None] * len(job.calls)

            def one(i: int) -> None:
                results[i] = self.call(job, i, job.calls[i], bodies[i], job.calls[i].input_ids)

            threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(len(job.calls))]
            for t in threads:
                t.start()
            for t in threads:
                t.join(REQUEST_TIMEOUT_S + 10)
            return [r if r is not None else Outcome(job.index, i, job.kind, error="client_thread_hung")
                    for i, r in enumerate(results)]
        if job.session is not None:
            return self._run_session(job, bodies)
        return [self.call(job, i, c, b, c.input_ids) for i, (c, b) in enumerate(zip(job.calls, bodies))]

    def _run_session(self, job: Job, bodies: list[dict]) -> list[Outcome]:
        outcomes = []
        try:
            opened = self.http.post("/open_session", {"capacity_of_str_len": 100_000, "session_id": job.session},
                                    timeout=30.0)
        except Exception as err:  # noqa: BLE001
            return [Outcome(job.index, 0, job.kind, error="open_session: " + _error_name(err))]
        if opened.status_code != 200:
            return [Outcome(job.index, 0, job.kind, status=opened.status_code, error="open_session: " + opened.text[:200])]
        history: tuple[int, ...] | None = ()
        try:
            for i, (call, body) in enumerate(zip(job.calls, bodies)):
                prompt = None if history is None else history + call.input_ids
                out = self.call(job, i, call, body, prompt)
                outcomes.append(out)
                # The next turn's prompt: this one's, its output, then the next turn's own tokens
                # (sglang/srt/session/session_controller.py, Session._concat_token_arrays).
                history = prompt + tuple(out.output_ids()[: call.max_new_tokens]) if out.finished and prompt else None
        finally:
            try:
                self.http.post("/close_session", {"session_id": job.session}, timeout=30.0)
            except Exception:  # noqa: BLE001 - a failed close shows in the server's health, checked later
                pass
        return outcomes

    # ------------------------------------------------------------------ many jobs
    def run(self, jobs: Sequence[Job], clients: int, deadline: float,
            progress: Callable[[int, int], None] | None = None) -> tuple[list[Outcome], int]:
        """Run ``jobs`` on ``clients`` threads until done or ``deadline`` (``time.monotonic()``); returns the
        outcomes in job order and how many jobs were skipped for the deadline."""
        lock = threading.Lock()
        done = [0]
        skipped = [0]

        def job_or_skip(job: Job) -> list[Outcome]:
            if time.monotonic() > deadline:
                with lock:
                    skipped[0] += 1
                return []
            result = self.run_job(job)
            with lock:
                done[0] += 1
                if progress is not None:
                    progress(done[0], len(jobs))
            return result

        with ThreadPoolExecutor(max_workers=clients, thread_name_prefix="soak-client") as pool:
            results = list(pool.map(job_or_skip, jobs))
        return [o for outs in results for o in outs], skipped[0]

    def send_all(self, bodies: Sequence[dict], clients: int, deadline: float) -> list[Outcome | None]:
        """Send plain ``/generate`` bodies from ``clients`` threads (None: skipped for the deadline)."""

        def one(body: dict) -> Outcome | None:
            if time.monotonic() > deadline:
                return None
            out = Outcome(-1, 0, "replay", prompt=tuple(body["input_ids"]))
            start = time.perf_counter()
            try:
                self._send(body, out)
            except Exception as err:  # noqa: BLE001
                out.error = _error_name(err)
            out.elapsed_s = time.perf_counter() - start
            return out

        with ThreadPoolExecutor(max_workers=clients, thread_name_prefix="soak-replay") as pool:
            return list(pool.map(one, bodies))
