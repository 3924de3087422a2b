"""Exact requests against the stock server: what is compared, and how.

An exact request is any call the RidgeFill server ran with RidgeFill off (its response says
``meta_info["ridgefill"] == {"ran": false, ...}``), whatever the reason: it asked for exact, its prompt is
not longer than the tail, it wants prompt logprobs of filled rows, the radix cache held its prefix, or it
sent no parameters and was short. Its output ids and output logprobs (and prompt logprobs when it asked for
them) must equal what the stock server answers for the same prompt.

On CPU a GEMM's rounding depends on how many rows it multiplies (measured: one row of ``X @ W.T`` differs
in the last bits between a 1-row and an 8-row call), so an answer depends on what else was in the batch and
on whether its prefix came from the radix cache, on stock SGLang as much as on RidgeFill. Hence three
comparisons, each of the same prompts on both sides:

- ``sequential``: every exact prompt replayed one at a time on both servers, the radix cache flushed before
  each; RidgeFill's answer must equal stock's bit for bit (the "byte-identical with RidgeFill off" claim).
- ``stock_vs_stock``: stock answering the exact prompts concurrently (8 clients) against stock sequential:
  the spread that batching and cache hits alone cause.
- ``concurrent``: RidgeFill's answers from the soak itself against stock sequential: ids equal, logprobs
  within a tolerance derived from the stock spread. This is the comparison that would see an exact request
  reading filled KV under load (a fill moves logprobs by orders of magnitude more than the spread).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .client import Outcome
from .workload import NO_PARAMS, Call, Job

TOLERANCE_FACTOR = 4.0  # the concurrent tolerance: this many times the largest stock-vs-stock difference ...
TOLERANCE_FLOOR = 1e-5  # ... and never below this (a run whose stock spread happened to be 0)
SHOWN = 5  # mismatches listed in the summary


@dataclass(frozen=True)
class Answer:
    """The parts of a response the comparison reads."""

    ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    prompt_logprobs: tuple[float | None, ...] = ()

    @classmethod
    def of(cls, response: dict) -> Answer:
        meta = response.get("meta_info") or {}
        out = meta.get("output_token_logprobs") or []
        prompt = meta.get("input_token_logprobs") or []
        return cls(tuple(response.get("output_ids") or ()), tuple(float(x[0]) for x in out),
                   tuple(None if x[0] is None else float(x[0]) for x in prompt))


@dataclass(frozen=True)
class ExactCase:
    """One exact call of the soak: where it came from, what a replay sends (``body`` to stock,
    ``ridgefill_body``, with the call's own RidgeFill parameters, to the RidgeFill server), RidgeFill's
    answer in the soak."""

    job: int
    call: int
    kind: str
    reason: str
    body: dict
    ridgefill_body: dict
    answer: Answer
    must_be_exact: bool = False  # the call itself (not the cache or the load) made it exact

    @property
    def label(self) -> str:
        return f"job {self.job} call {self.call} ({self.kind})"


def ridgefill_meta(outcome: Outcome) -> Any:
    return outcome.meta.get("ridgefill")


def meta_problem(outcome: Outcome) -> str | None:
    """Why a 2xx response's ``meta_info["ridgefill"]`` is not ``{"ran": bool, ...}`` (None: it is)."""
    meta = ridgefill_meta(outcome)
    if not isinstance(meta, dict) or not isinstance(meta.get("ran"), bool):
        return f'meta_info["ridgefill"] is {meta!r}, not {{"ran": true|false, ...}}'
    if meta["ran"] is False and not isinstance(meta.get("reason"), str):
        return f'meta_info["ridgefill"] = {meta!r} says "ran": false without a reason'
    return None


def replay_body(call: Call, prompt: Sequence[int], ridgefill: Any = NO_PARAMS) -> dict:
    """The body that asks a server for ``call``'s answer on ``prompt``: no rid, no session; the same
    decoding, logprob and cache-key settings; ``custom_params["ridgefill"]`` only when ``ridgefill`` is
    given (a stock server refuses RidgeFill parameters that ask for RidgeFill)."""
    sampling: dict[str, Any] = {"max_new_tokens": call.max_new_tokens, "temperature": call.temperature,
                                "ignore_eos": True}
    if ridgefill != NO_PARAMS:
        sampling["custom_params"] = {"ridgefill": ridgefill}
    body: dict[str, Any] = {"input_ids": list(prompt), "sampling_params": sampling, "return_logprob": True}
    for key, value in call.extra:
        if key in ("logprob_start_len", "extra_key"):
            body[key] = value
    return body


def forced_exact(body: dict) -> dict:
    """``body`` asking for exact prefill explicitly (``{"enabled": false}``)."""
    sampling = {**body["sampling_params"], "custom_params": {"ridgefill": {"enabled": False}}}
    return {**body, "sampling_params": sampling}


def exact_cases(jobs: Sequence[Job], outcomes: Sequence[Outcome]) -> tuple[list[ExactCase], list[str]]:
    """The exact calls to compare, and the expectation failures: a call that had to run exactly but says
    ``"ran": true``, and any complete answer whose ``meta_info["ridgefill"]`` is malformed."""
    by_index = {job.index: job for job in jobs}
    cases, failures = [], []
    for out in outcomes:
        if not out.finished:
            continue
        call = by_index[out.job].calls[out.call]
        problem = meta_problem(out)
        if problem is not None:
            failures.append(f"job {out.job} call {out.call} ({out.kind}): {problem}")
            continue
        meta = ridgefill_meta(out)
        if call.exact and meta["ran"]:
            failures.append(f"job {out.job} call {out.call} ({out.kind}) had to run exactly but says {meta!r}")
            continue
        if meta["ran"] or out.prompt is None:
            continue
        cases.append(ExactCase(out.job, out.call, out.kind, meta["reason"], replay_body(call, out.prompt),
                               replay_body(call, out.prompt, call.ridgefill), Answer.of(out.response),
                               must_be_exact=bool(call.exact)))
    return cases, failures


def difference(a: Answer, b: Answer) -> float:
    """The largest absolute logprob difference; ``inf`` when the ids or the lengths differ."""
    if a.ids != b.ids or len(a.logprobs) != len(b.logprobs) or len(a.prompt_logprobs) != len(b.prompt_logprobs):
        return math.inf
    pairs = list(zip(a.logprobs, b.logprobs)) + [
        (x, y) for x, y in zip(a.prompt_logprobs, b.prompt_logprobs) if x is not None or y is not None
    ]
    worst = 0.0
    for x, y in pairs:
        if x is None or y is None:
            return math.inf
        worst = max(worst, abs(x - y))
    return worst


def _describe(case: ExactCase, got: Answer, want: Answer) -> dict:
    return {"request": case.label, "reason": case.reason, "prompt_tokens": len(case.body["input_ids"]),
            "ridgefill_ids": list(got.ids), "stock_ids": list(want.ids),
            "ridgefill_logprobs": list(got.logprobs), "stock_logprobs": list(want.logprobs),
            "max_abs_diff": _finite(difference(got, want))}


def _finite(x: float) -> float | str:
    return "ids differ" if math.isinf(x) else x


def _answers(outcomes: Sequence[Outcome | None]) -> list[Answer | None]:
    return [Answer.of(o.response) if o is not None and o.finished else None for o in outcomes]


def compare(cases: Sequence[ExactCase], ridgefill_sequential: Sequence[Outcome | None],
            stock_sequential: Sequence[Outcome | None], stock_concurrent: Sequence[Outcome | None]) -> dict:
    """The ``exact`` section of the summary (see the module docstring); ``mismatches`` counts both the
    sequential (bitwise) and the concurrent (tolerance) mismatches."""
    rf_seq, st_seq, st_conc = _answers(ridgefill_sequential), _answers(stock_sequential), _answers(stock_concurrent)
    missing = sum(1 for a in (*rf_seq, *st_seq) if a is None)

    seq_bad, seq_n = [], 0
    for case, got, want in zip(cases, rf_seq, st_seq):
        if got is None or want is None:
            continue
        seq_n += 1
        if got != want:
            seq_bad.append(_describe(case, got, want))

    spread, spread_n, spread_ids, spread_differ = 0.0, 0, 0, 0
    for conc, want in zip(st_conc, st_seq):
        if conc is None or want is None:
            continue
        spread_n += 1
        d = difference(conc, want)
        if math.isinf(d):
            spread_ids += 1
        else:
            spread = max(spread, d)
            spread_differ += d > 0
    tolerance = max(TOLERANCE_FACTOR * spread, TOLERANCE_FLOOR)

    conc_bad, conc_n, conc_worst = [], 0, 0.0
    for case, want in zip(cases, st_seq):
        if want is None:
            continue
        conc_n += 1
        d = difference(case.answer, want)
        if d > tolerance:
            conc_bad.append(_describe(case, case.answer, want))
        else:
            conc_worst = max(conc_worst, d)

    return {
        "cases": len(cases),
        "replays_missing": missing,
        "by_reason": count_reasons(cases),
        "sequential": {
            "method": "each prompt alone on each server, /flush_cache before each; ids and logprobs bit-equal",
            "compared": seq_n, "mismatches": len(seq_bad), "first": seq_bad[:SHOWN],
        },
        "stock_vs_stock": {
            "method": "stock concurrent (the soak's clients) vs stock sequential, same prompts",
            "compared": spread_n, "id_mismatches": spread_ids, "requests_differing": spread_differ,
            "max_abs_logprob_diff": spread,
        },
        "concurrent": {
            "method": "RidgeFill's soak answers vs stock sequential: ids equal, |logprob diff| <= tolerance",
            "tolerance": tolerance,
            "tolerance_rule": f"max({TOLERANCE_FACTOR:g} x stock_vs_stock max_abs_logprob_diff, {TOLERANCE_FLOOR:g})",
            "compared": conc_n, "mismatches": len(conc_bad), "max_abs_logprob_diff_within_tolerance": conc_worst,
            "first": conc_bad[:SHOWN],
        },
        "mismatches": len(seq_bad) + len(conc_bad),
    }


def fill_effect(ridgefill: Sequence[Outcome], stock: Sequence[Outcome | None], tolerance: float) -> dict:
    """How far answers RidgeFill filled are from stock: the concurrent comparison can only see a request
    that read filled KV if the fill moved its answer by more than the tolerance (``within_tolerance`` counts
    the fills it could not tell from exact, e.g. ``exact_every: 1``, which computes every row)."""
    diffs = []
    for rf, st in zip(ridgefill, stock):
        if st is None or not st.finished:
            continue
        diffs.append(difference(Answer.of(rf.response), Answer.of(st.response)))
    finite = sorted(d for d in diffs if not math.isinf(d))
    return {
        "compared": len(diffs), "ids_differ": sum(1 for d in diffs if math.isinf(d)),
        "within_tolerance": sum(1 for d in diffs if d <= tolerance),
        "min_abs_logprob_diff": finite[0] if finite else None,
        "median_abs_logprob_diff": finite[len(finite) // 2] if finite else None,
    }


def count_reasons(cases) -> dict[str, int]:
    """Cases per exact reason (numbers shown as N), most frequent first."""
    out: dict[str, int] = {}
    for case in cases:
        reason = re.sub(r"\d+", "N", case.reason)
        out[reason] = out.get(reason, 0) + 1
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))
