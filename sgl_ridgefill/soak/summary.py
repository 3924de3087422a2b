"""The soak's verdict: what every call got against what its job expected, and the JSON summary.

A call that had to succeed must come back complete (2xx, finished by length); one the server had to refuse
must get a 4xx (or a 2xx that SGLang finished as aborted); the others (aborts, a rid sent twice at once) may
end either way. A 5xx is never right, and neither is a client-side connection error (the server went away).
The run fails when any of these is non-zero: exact mismatches, exact requests that did not run exactly (or
whose ``meta_info["ridgefill"]`` is malformed), 5xx answers, unexpected outcomes, fuzz failures, server
crashes, RidgeFill request states still alive at the end, and later questions on cached documents of which not
one reused the cache (the namespace's reuse is broken, so nothing upgraded could be checked either), judged
where the pool is large enough to keep a document until its next question.

Engine-free.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..vocabulary import EXACT_CACHE_NOTE
from .client import Outcome
from .workload import Job, count_calls

SHOWN = 5
FAILURE_KEYS = ("mismatches", "exact_not_exact", "5xx", "unexpected_outcomes", "fuzz_failures", "crashes",
                "leaked_states", "rss_growth", "reuse_missing")
REUSE_JUDGED_FROM = 5  # completed later questions before "none reused the cache" counts as a failure
# The smallest pool in which a document is expected to outlive its next question under the soak's 16 clients
# (measured: 43 of 64 later questions reused it at 2,048 tokens, none at 768, where every document is evicted
# before its next question): a smaller pool tests eviction, not reuse.
REUSE_POOL_TOKENS = 2048


def status_key(out: Outcome) -> str:
    """``"200"``, ``"400"``, ... or ``"client:<error>"`` when no status came back."""
    return str(out.status) if out.status is not None else f"client:{out.error}"


def is_server_error(out: Outcome) -> bool:
    return out.status is not None and out.status >= 500


def unexpected(job: Job, out: Outcome) -> str | None:
    """Why ``out`` is not what its call expected (None: it is). 5xx answers are counted on their own."""
    call = job.calls[out.call] if out.call < len(job.calls) else None
    if is_server_error(out):
        return None
    if out.error == "connection":
        return "connection error (the server went away?)"
    if call is None:  # a session that did not open
        return f"session: {out.error}"
    aborted = (out.meta.get("finish_reason") or {}).get("type") == "abort"
    if call.expect == "ok" and not out.finished:
        return f"expected a complete answer, got {status_key(out)}: {out.error or out.meta.get('finish_reason')}"
    if call.expect == "refused" and not ((out.status is not None and 400 <= out.status < 500) or aborted):
        return f"expected a refusal (4xx), got {status_key(out)}"
    if call.expect == "any" and out.status is not None and not 200 <= out.status < 500:
        return f"got {status_key(out)}"
    return None


def tally(jobs: Sequence[Job], outcomes: Sequence[Outcome]) -> dict[str, Any]:
    """The ``requests`` and ``responses`` sections."""
    by_index = {job.index: job for job in jobs}
    by_status: dict[str, int] = {}
    ran = {"true": 0, "false": 0}
    cut = {"requests": 0, "sliced": 0, "yields": 0}  # prefills in short forwards while others decoded
    # exact upgrades planned (each decode step that runs the request alone rewrites some rows), and later
    # questions that found every cached row exact
    upgrades = {"planned": 0, "planned_rows": 0, "over_exact_cache": 0}
    tags: dict[str, int] = {}
    sent_kinds: dict[str, int] = {}
    problems = []
    for out in outcomes:
        job = by_index[out.job]
        key = status_key(out)
        by_status[key] = by_status.get(key, 0) + 1
        sent_kinds[out.kind] = sent_kinds.get(out.kind, 0) + 1
        meta = out.meta.get("ridgefill")
        if isinstance(meta, dict) and isinstance(meta.get("ran"), bool):
            ran["true" if meta["ran"] else "false"] += 1
            if meta.get("yields") or meta.get("slices"):
                cut["requests"] += 1
                cut["sliced"] += int(bool(meta.get("slices")))
                cut["yields"] += int(meta.get("yields") or 0)
            if meta.get("exact_upgrade"):
                upgrades["planned"] += 1
                upgrades["planned_rows"] += int(meta["exact_upgrade"])
            if meta.get("note") == EXACT_CACHE_NOTE:
                upgrades["over_exact_cache"] += 1
        why = unexpected(job, out)
        if why is not None:
            problems.append({"request": f"job {out.job} call {out.call} ({out.kind})", "problem": why})
    for job in jobs:
        for tag in job.tags:
            tags[tag] = tags.get(tag, 0) + 1
    server_errors = [o for o in outcomes if is_server_error(o)]
    return {
        "requests": {"planned": sum(count_calls(list(jobs)).values()), "sent": len(outcomes),
                     "by_kind": dict(sorted(sent_kinds.items())), "tags": dict(sorted(tags.items()))},
        "responses": {
            "by_status": dict(sorted(by_status.items())), "5xx": len(server_errors),
            "first_5xx": [{"request": f"job {o.job} call {o.call} ({o.kind})", "status": o.status, "error": o.error}
                          for o in server_errors[:SHOWN]],
            "ridgefill_ran": ran, "ridgefill_short_forwards": cut,
            "ridgefill_exact_upgrade": upgrades, "unexpected": len(problems),
            "first_unexpected": problems[:SHOWN],
        },
    }


def reuse(jobs: Sequence[Job], outcomes: Sequence[Outcome]) -> dict[str, Any]:
    """The ``reuse`` section: the later questions on a cached document (every call after a job's first
    under the namespace policy) that completed, how many reused cached rows, how many of those made cached
    filled rows exact in place (``upgraded``), and the rows involved."""
    by_index = {job.index: job for job in jobs}
    later = [o for o in outcomes if "later_question" in by_index[o.job].tags and o.call > 0 and o.finished
             and by_index[o.job].calls[o.call].exact is None]
    metas = [m for m in (o.meta.get("ridgefill") for o in later) if isinstance(m, dict) and m.get("ran")]
    return {
        "later_questions": len(later), "ran": len(metas),
        "reused": sum(1 for m in metas if (m.get("cached") or 0) > 0),
        "cached_rows": sum(int(m.get("cached") or 0) for m in metas),
        "cached_exact_rows": sum(int(m.get("cached_exact") or 0) for m in metas),
        "upgraded": sum(1 for m in metas if (m.get("upgraded") or 0) > 0),
        "upgraded_rows": sum(int(m.get("upgraded") or 0) for m in metas),
    }


def failures(summary: dict) -> dict[str, int]:
    """The counts that make the run fail (a missing check counts as one failure)."""
    server = summary.get("server", {})
    leaked = server.get("live_requests")
    exact = summary.get("exact", {})
    later = summary.get("reuse", {})
    return {
        "mismatches": int(exact.get("mismatches", 0)),
        "exact_not_exact": int(exact.get("not_exact", 0)),
        "5xx": int(summary.get("responses", {}).get("5xx", 0)) + int(summary.get("fuzz", {}).get("server_errors", 0)),
        "unexpected_outcomes": int(summary.get("responses", {}).get("unexpected", 0))
        + int(not server.get("final_request_ok", False)),
        "fuzz_failures": int(summary.get("fuzz", {}).get("failures", 0)),
        "crashes": int(server.get("crashes", 0)),
        "leaked_states": 1 if leaked is None else int(leaked),
        "rss_growth": int(summary.get("memory", {}).get("ok") is False),  # judged on runs of 1,000+ requests
        "reuse_missing": int(later.get("ran", 0) >= REUSE_JUDGED_FROM and not later.get("reused")
                             and (summary.get("pool", {}).get("tokens") or REUSE_POOL_TOKENS) >= REUSE_POOL_TOKENS),
    }


def exit_status(summary: dict) -> int:
    return 1 if any(summary["failures"].values()) else 0
