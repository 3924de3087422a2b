"""The soak's memory verdict: scheduler RSS growth over the last 500 requests, judged on runs of 1,000+."""

from __future__ import annotations

import os

from sgl_ridgefill.soak.memory import JUDGED_FROM, MAX_GROWTH, WINDOW, RssSampler, memory_summary
from sgl_ridgefill.soak.summary import failures


def _samples(last: int, start_mib: float, end_mib: float) -> list[tuple[int, float, float]]:
    """Flat until the window, then a linear rise to ``end_mib``."""
    out = []
    for n in range(0, last + 1, 50):
        rss = start_mib if n <= last - WINDOW else start_mib + (end_mib - start_mib) * (n - last + WINDOW) / WINDOW
        out.append((n, rss, 2 * rss))
    return out


def test_flat_memory_passes_and_growth_fails():
    flat = memory_summary(_samples(JUDGED_FROM, 400.0, 400.0 * (1 + MAX_GROWTH / 2)))
    assert flat["judged"] and flat["ok"] is True and flat["scheduler_rss_mib_window_start"] == 400.0
    leak = memory_summary(_samples(JUDGED_FROM, 400.0, 400.0 * (1 + 3 * MAX_GROWTH)))
    assert leak["judged"] and leak["ok"] is False and abs(leak["scheduler_growth"] - 3 * MAX_GROWTH) < 1e-9
    assert failures({"memory": leak, "server": {"live_requests": 0, "final_request_ok": True}})["rss_growth"] == 1
    assert failures({"memory": flat, "server": {"live_requests": 0, "final_request_ok": True}})["rss_growth"] == 0


def test_short_runs_report_without_a_verdict():
    short = memory_summary(_samples(600, 400.0, 800.0))
    assert short["judged"] is False and short["ok"] is None and short["scheduler_growth"] == 1.0
    assert memory_summary([])["ok"] is None
    assert failures({"memory": short, "server": {"live_requests": 0, "final_request_ok": True}})["rss_growth"] == 0


def test_the_sampler_reads_a_live_process_tree():
    sampler = RssSampler(os.getpid())
    sampler.sample(10)
    ((done, scheduler, total),) = sampler.samples
    assert done == 10 and total > 0  # this process is no scheduler: its scheduler figure is NaN
    assert scheduler != scheduler
    RssSampler(2**22 + 12345).sample(1)  # no such process: nothing recorded, no error
