"""The RidgeFill server's memory over a soak: resident set size of its scheduler process (and of the whole
server) sampled as jobs finish, and its growth over the last requests of the run.

A leak of per-request state grows the scheduler's RSS with every request; allocator noise and warm-up do not
keep growing once the workload's shapes have all been seen. So the verdict compares the RSS at the end with
the RSS :data:`WINDOW` requests before the end, and only judges runs of at least :data:`JUDGED_FROM`
requests (shorter runs report the samples alone)."""

from __future__ import annotations

from dataclasses import dataclass, field

WINDOW = 500  # requests the growth is measured over
JUDGED_FROM = 1000  # runs shorter than this report their samples but are not judged
MAX_GROWTH = 0.01  # the largest growth over the window that passes


def _processes(pid: int) -> list:
    import psutil

    root = psutil.Process(pid)
    return [root, *root.children(recursive=True)]


def _is_scheduler(proc) -> bool:
    try:
        return "scheduler" in " ".join(proc.cmdline()).lower() or "scheduler" in proc.name().lower()
    except Exception:  # the process ended between listing and reading
        return False


@dataclass
class RssSampler:
    """Samples ``(requests done, scheduler RSS MiB, whole server RSS MiB)`` of the server rooted at ``pid``."""

    pid: int
    samples: list[tuple[int, float, float]] = field(default_factory=list)

    def sample(self, requests_done: int) -> None:
        try:
            procs = _processes(self.pid)
            rss = {p.pid: p.memory_info().rss / 2**20 for p in procs}
        except Exception:  # the server went away: the run's crash check says so
            return
        scheduler = [rss[p.pid] for p in procs if p.pid in rss and _is_scheduler(p)]
        self.samples.append((requests_done, max(scheduler) if scheduler else float("nan"), sum(rss.values())))

    def summary(self) -> dict:
        return memory_summary(self.samples)


def memory_summary(samples: list[tuple[int, float, float]]) -> dict:
    """What the soak reports of the samples, and whether the growth passes (``None``: not judged)."""
    if not samples:
        return {"samples": 0, "judged": False, "scheduler_growth": None, "ok": None}
    last = samples[-1]
    before = [s for s in samples if s[0] <= last[0] - WINDOW]
    base = before[-1] if before else None
    growth = None if base is None or not base[1] > 0 else (last[1] - base[1]) / base[1]
    judged = last[0] >= JUDGED_FROM and growth is not None
    return {
        "samples": len(samples), "requests": last[0], "window": WINDOW,
        "scheduler_rss_mib_first": round(samples[0][1], 1), "scheduler_rss_mib_last": round(last[1], 1),
        "scheduler_rss_mib_window_start": round(base[1], 1) if base else None,
        "server_rss_mib_last": round(last[2], 1), "scheduler_growth": growth, "judged": judged,
        "ok": (growth <= MAX_GROWTH) if judged else None,
    }
