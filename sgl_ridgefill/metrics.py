"""Per-request RidgeFill counters: a debug log line (runtime.py) and Prometheus metrics.

The metrics live in the scheduler process; with SGLang's ``--enable-metrics`` its Prometheus multiprocess
directory collects them beside SGLang's own. Without ``prometheus_client`` they are skipped.
"""

from __future__ import annotations

import functools
from typing import Any


# The names read back from /metrics (the soak); a counter's samples there carry the suffix ``_total``.
LIVE_REQUESTS = "ridgefill_live_requests"
EXACT_UPGRADE_ROWS = "ridgefill_exact_upgrade_rows"
EXACT_UPGRADES_DONE = "ridgefill_exact_upgrades_done"

# Tensor-parallel ranks other than 0 run the same requests as rank 0 and export nothing (no double counts).
_EXPORTING = {"on": True}


def export_from_this_process(on: bool) -> None:
    _EXPORTING["on"] = on


@functools.lru_cache(maxsize=1)
def _counters():
    try:
        from prometheus_client import Counter, Gauge, Histogram
    except ImportError:  # pragma: no cover - prometheus_client ships with SGLang
        return None
    return {
        "requests": Counter("ridgefill_requests", "Requests prefilled by RidgeFill", ["arm"]),
        "filled": Counter("ridgefill_filled_rows", "Prefix rows whose upper layers were filled", ["arm"]),
        "exact": Counter("ridgefill_exact_rows", "Prefix rows selected to run every layer exactly", ["arm"]),
        "tail": Counter("ridgefill_tail_rows", "Tail rows (always exact)", ["arm"]),
        "upgraded": Counter("ridgefill_upgraded_rows",
                            "Cached filled rows a later request chose and ran exactly over their slots", ["arm"]),
        "upgraded_stored": Counter("ridgefill_upgraded_stored_rows",
                                   "Of those, rows whose split state an earlier request kept (no lower layers again)",
                                   ["arm"]),
        "exact_upgrade": Counter(EXACT_UPGRADE_ROWS,
                                 "Rows requests rewrote exactly in their own decode steps (the exact upgrade)", ["arm"]),
        "exact_upgrades_done": Counter(EXACT_UPGRADES_DONE,
                                       "Requests whose exact upgrade reached every row", ["arm"]),
        "reused_filled": Counter("ridgefill_reused_filled_rows",
                                 "Filled rows taken from the radix cache (namespace mode)", ["arm"]),
        "saved": Histogram(
            "ridgefill_compute_saved_fraction", "Estimated share of layer-passes skipped per request", ["arm"],
            buckets=(0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0),
        ),
        # Summed over the scheduler processes; back to 0 once no RidgeFill request is alive (a leak check).
        "live": Gauge(LIVE_REQUESTS, "RidgeFill requests whose SGLang Req is alive in a batch",
                      multiprocess_mode="livesum"),
    }


def record_request(st: Any) -> None:
    """Count one finished request, from its state (``runtime.state.RequestState``: its plan's arm, its
    ``RequestStats`` and the filled rows it reused; read by name, so this module stays below the runtime)."""
    counters = _counters() if _EXPORTING["on"] else None
    if counters is None:
        return
    arm, s = st.plan.arm, st.stats
    counters["requests"].labels(arm).inc()
    for name in ("filled", "exact", "tail", "upgraded", "upgraded_stored"):
        counters[name].labels(arm).inc(s.get(name, 0))
    counters["reused_filled"].labels(arm).inc(getattr(st, "reused_filled", 0))
    if s.saved_fraction is not None:  # not for a request that only ran its new rows over the cache's filled rows
        counters["saved"].labels(arm).observe(s.saved_fraction)


def record_upgrade(arm: str, rows: int, *, done: bool) -> None:
    """Count one slice of a request's exact upgrade (``rows`` rewritten; ``done``: it reached every row)."""
    counters = _counters() if _EXPORTING["on"] else None
    if counters is None:
        return
    counters["exact_upgrade"].labels(arm).inc(rows)
    if done:
        counters["exact_upgrades_done"].labels(arm).inc()


def set_live_requests(count: int) -> None:
    counters = _counters() if _EXPORTING["on"] else None
    if counters is not None:
        counters["live"].set(count)
