"""One soak run, phase by phase, against a RidgeFill server and a stock server.

1. The workload (``workload.py``) from the clients (``client.py``) against the RidgeFill server.
2. Optionally the fuzzer (``fuzz.py``) against the same server.
3. The exact calls' prompts against stock, concurrently, then one at a time on both servers with the radix
   cache flushed before each (``compare.py``); a sample of filled answers against stock, to show how far a
   fill moves logprobs.
4. The server afterwards: ``/health``, one more request answered, ``ridgefill_live_requests`` back to 0,
   the process still running, tracebacks in its log.

Every phase is bounded by the run's deadline; a phase that runs out skips the rest of its work and the
summary counts what was skipped.
"""

from __future__ import annotations

import pathlib
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ..metrics import EXACT_UPGRADE_ROWS, EXACT_UPGRADES_DONE
from . import compare as C
from .client import Outcome, Runner
from .fuzz import run_fuzz
from .memory import RssSampler
from .servers import LIVE_GAUGE, healthy, log_excerpts, metric_value, read_metrics
from .summary import failures, reuse, tally
from .workload import Shape, build_workload

FILL_SAMPLE = 20  # filled answers replayed on stock for the fill_effect section
SETTLE_S = 30.0  # how long the live-request gauge may take to return to 0 once the clients are done


@dataclass
class Target:
    """A server under test: its URL, and its process and log when this run started it."""

    url: str
    process: object | None = None  # ServerProcess
    log_path: pathlib.Path | None = None

    @property
    def alive(self) -> bool:
        return self.process.alive if self.process is not None else healthy(self.url)


@dataclass(frozen=True)
class SoakConfig:
    requests: int = 300
    clients: int = 8
    seed: int = 0
    fuzz: int = 0  # fuzzed request bodies, and as many policy texts (0: no fuzzing)
    shape: Shape = Shape()
    max_minutes: float = 60.0
    maps_dir: pathlib.Path | None = None  # the served maps (policy texts compile against them)
    environment: dict = field(default_factory=dict)  # model, CPU, threads: copied into the summary
    pool_tokens: int | None = None  # the servers' KV pool when this run started them (None: not known)


def say(message: str) -> None:
    print(f"[soak] {message}", file=sys.stderr, flush=True)


def _flush(url: str) -> bool:
    """Empty the radix cache (``BenchClient.flush_cache``: refusals while a request leaves its batch are
    retried); False when the server does not answer or keeps refusing."""
    from ..tools.client import BenchClient, ServerError

    try:
        BenchClient(url).flush_cache()
    except ServerError:
        return False
    return True


def sequential(url: str, bodies: Sequence[dict], deadline: float) -> list[Outcome | None]:
    """Each body alone, the radix cache flushed before each (None: skipped, or the flush failed)."""
    runner, out = Runner(url), []
    for body in bodies:
        if time.monotonic() > deadline or not _flush(url):
            out.append(None)
            continue
        out.extend(runner.send_all([body], clients=1, deadline=deadline))
    return out


def _live_requests(url: str) -> dict:
    """``ridgefill_live_requests`` once it is 0, or its last value after :data:`SETTLE_S` (None: absent),
    beside SGLang's own running and queued request gauges at that moment."""
    deadline = time.monotonic() + SETTLE_S
    while True:
        text = read_metrics(url) or ""
        value = metric_value(text, LIVE_GAUGE)
        if value == 0 or time.monotonic() > deadline:
            return {"live_requests": value, "sglang_running_requests": metric_value(text, "sglang:num_running_reqs"),
                    "sglang_queued_requests": metric_value(text, "sglang:num_queue_reqs")}
        time.sleep(1.0)


def _final_request(url: str, shape: Shape) -> tuple[bool, str]:
    import requests

    ids = list(range(shape.token_low, shape.token_low + shape.tail + shape.chunk))
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": 2, "temperature": 0, "ignore_eos": True}}
    try:
        resp = requests.post(url + "/generate", json=body, timeout=120)
    except requests.RequestException as err:
        return False, type(err).__name__
    finish = (resp.json().get("meta_info") or {}).get("finish_reason") if resp.status_code == 200 else None
    return resp.status_code == 200 and (finish or {}).get("type") == "length", f"{resp.status_code} {finish}"


def _progress(every: int, memory: RssSampler | None, calls_per_job: float) -> Callable[[int, int], None]:
    def report(done: int, total: int) -> None:
        if memory is not None:
            memory.sample(round(done * calls_per_job))
        if done % every == 0 or done == total:
            say(f"jobs done: {done}/{total}")

    return report


def run_soak(cfg: SoakConfig, rf: Target, stock: Target) -> dict:
    """Run every phase; returns the summary (its ``failures`` say whether the run passed)."""
    t0 = time.monotonic()
    deadline = t0 + cfg.max_minutes * 60
    jobs = build_workload(cfg.requests, cfg.seed, cfg.shape)
    calls = sum(len(j.calls) for j in jobs)
    say(f"workload: {len(jobs)} jobs, {calls} requests, {cfg.clients} clients")
    pid = getattr(getattr(rf.process, "proc", None), "pid", None)
    memory = RssSampler(pid) if pid is not None else None  # a server this run started: its processes are here
    progress = _progress(max(1, len(jobs) // 10), memory, calls / max(1, len(jobs)))
    outcomes, skipped = Runner(rf.url).run(jobs, cfg.clients, deadline, progress)
    soak_s = time.monotonic() - t0
    crashed = not rf.alive

    fuzz = None
    if cfg.fuzz and not crashed:
        say(f"fuzz: {cfg.fuzz} request bodies, {cfg.fuzz} policy texts")
        fuzz = run_fuzz(rf.url, bodies=cfg.fuzz, policies=cfg.fuzz, seed=cfg.seed, shape=cfg.shape,
                        clients=cfg.clients, deadline=deadline, healthy=lambda: healthy(rf.url),
                        maps_dir=cfg.maps_dir)
        crashed = crashed or not rf.alive

    cases, not_exact = C.exact_cases(jobs, outcomes)
    bodies = [c.body for c in cases]
    say(f"exact: {len(cases)} calls; stock concurrent, then both servers one at a time")
    stock_conc = Runner(stock.url).send_all(bodies, cfg.clients, deadline)
    stock_seq = sequential(stock.url, bodies, deadline)
    rf_seq, forced, replay_not_exact = _ridgefill_sequential(rf.url, cases, deadline, crashed)
    exact = C.compare(cases, rf_seq, stock_seq, stock_conc)
    exact["sequential"]["forced_exact"] = forced
    not_exact += replay_not_exact
    exact["not_exact"] = len(not_exact)
    exact["first_not_exact"] = not_exact[:C.SHOWN]

    filled = _filled_sample(jobs, outcomes)
    fill_stock = sequential(stock.url, [b for _, b in filled], deadline)
    fill_effect = C.fill_effect([o for o, _ in filled], fill_stock, exact["concurrent"]["tolerance"])

    final_ok, final = (False, "server down") if crashed else _final_request(rf.url, cfg.shape)
    live = _live_requests(rf.url) if not crashed else {"live_requests": None}
    alive = rf.alive
    tracebacks, excerpts = log_excerpts(rf.log_path)
    metrics = (read_metrics(rf.url) or "") if not crashed else ""
    pool = {"tokens": cfg.pool_tokens,
            "retracted_requests": metric_value(metrics, "sglang:num_retracted_requests_total"),
            "evictions": metric_value(metrics, "sglang:eviction_duration_seconds_count")}
    summary = {
        **tally(jobs, outcomes),
        "reuse": reuse(jobs, outcomes),
        "exact": exact,
        "fill_effect": fill_effect,
        "fuzz": fuzz or {},
        "memory": memory.summary() if memory is not None else {"samples": 0, "judged": False, "ok": None},
        "pool": pool,
        "server": {
            "healthy_at_end": healthy(rf.url), "final_request_ok": final_ok, "final_request": final,
            **live, "crashes": int(crashed or not alive), "log_tracebacks": tracebacks,
            "first_log_tracebacks": excerpts, "stock_alive": stock.alive,
        },
        "run": {"seed": cfg.seed, "clients": cfg.clients, "skipped_jobs": skipped, "soak_s": round(soak_s, 1),
                "wall_s": round(time.monotonic() - t0, 1), "shape": cfg.shape.__dict__},
        "environment": cfg.environment,
    }
    summary["requests"]["skipped_jobs"] = skipped
    # what the planned upgrades ran: they run only in decode steps that hold their request alone
    summary["responses"]["ridgefill_exact_upgrade"].update(
        rows_run=metric_value(metrics, EXACT_UPGRADE_ROWS + "_total"),
        done=metric_value(metrics, EXACT_UPGRADES_DONE + "_total"))
    summary["failures"] = failures(summary)
    summary["ok"] = not any(summary["failures"].values())
    return summary


def _ridgefill_sequential(url: str, cases, deadline: float, crashed: bool):
    """The exact calls replayed one at a time on the RidgeFill server with their own parameters. A call that
    was exact because the radix cache held its prefix runs RidgeFill on a flushed cache: it is replayed
    once more with ``{"enabled": false}`` (counted by reason). Returns the answers, those counts, and the
    replays that ran RidgeFill where the call itself had to run exactly, or that still did not run exactly."""
    if crashed:
        return [None] * len(cases), {}, []
    answers = sequential(url, [c.ridgefill_body for c in cases], deadline)
    again = [i for i, o in enumerate(answers) if o is not None and o.finished and C.meta_problem(o) is None
             and C.ridgefill_meta(o)["ran"]]
    for i, o in zip(again, sequential(url, [C.forced_exact(cases[i].body) for i in again], deadline)):
        answers[i] = o
    failing = [f"replay of {cases[i].label} had to run exactly but ran RidgeFill" for i in again
               if cases[i].must_be_exact]
    failing += [f"replay of {cases[i].label}: {C.meta_problem(o) or C.ridgefill_meta(o)}" for i, o in enumerate(answers)
                if o is not None and o.finished and (C.meta_problem(o) or C.ridgefill_meta(o)["ran"])]
    return answers, C.count_reasons(cases[i] for i in again), failing


def _filled_sample(jobs, outcomes) -> list[tuple[Outcome, dict]]:
    """Up to :data:`FILL_SAMPLE` complete answers RidgeFill filled, with the body that asks stock for them."""
    by_index = {job.index: job for job in jobs}
    out = []
    for o in outcomes:
        meta = o.meta.get("ridgefill")
        if o.finished and o.prompt is not None and isinstance(meta, dict) and meta.get("ran") is True:
            out.append((o, C.replay_body(by_index[o.job].calls[o.call], o.prompt)))
        if len(out) >= FILL_SAMPLE:
            break
    return out
