"""Needle retrieval tables of one run: mean scores per arm and region, paired differences between arms,
the exact rows the server ran, and each sample's scores for comparisons across runs.

Every table is broken down by haystack (RULER's noise haystack is far from the prose
the maps were fitted on): a row's ``haystack`` is ``"all"`` (pooled) or the haystack's name, as the needle
records name it. Records come from ``results.jsonl`` (``runner.run_needle``), later duplicates already
dropped (``analysis.latest_records``).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .arms import (EXACT, IDENTITY, IDENTITY_ROWS, LATER_ARMS, NOFILL_LONGTAIL, RIDGEFILL, RIDGEFILL_NEEDLE_RANDOM,
                   RIDGEFILL_NEEDLE_ROWS, RIDGEFILL_RANDOM, RIDGEFILL_ROWS, arm_sort_key)
from .stats import bootstrap_mean, interval_fields, json_number, mcnemar, stratified_paired_bootstrap

ALL = "all"
REGIONS = ("filled", "tail")
SUCCESS = 100.0  # a needle sample succeeds when its score is full marks

# (arm, vs) pairs compared on filled-region retrieval.
RETRIEVAL_PAIRS = (
    (RIDGEFILL, IDENTITY),
    (RIDGEFILL, EXACT),
    (RIDGEFILL_ROWS, EXACT),
    (RIDGEFILL_ROWS, RIDGEFILL_RANDOM),
    (RIDGEFILL, NOFILL_LONGTAIL),
    (IDENTITY_ROWS, IDENTITY),
    # The needle-row oracle: the needle's own rows exact, against the bare fill and
    # against as many random rows.
    (RIDGEFILL_NEEDLE_ROWS, RIDGEFILL),
    (RIDGEFILL_NEEDLE_RANDOM, RIDGEFILL),
    (RIDGEFILL_NEEDLE_ROWS, RIDGEFILL_NEEDLE_RANDOM),
    (RIDGEFILL_NEEDLE_ROWS, EXACT),
    # A question asked second or third on a cached document, against the same question asked first.
    *((later, RIDGEFILL_ROWS) for later in LATER_ARMS),
    *((later, EXACT) for later in LATER_ARMS),
)

Record = Mapping[str, Any]


def haystack_of(record: Record) -> str:
    return str(record.get("haystack") or "?")


def pooled(rows: Sequence[Record]) -> list[Record]:
    """The rows over every haystack (summaries written before the breakdown have no ``haystack``)."""
    return [r for r in rows if r.get("haystack", ALL) == ALL]


def haystacks(rows: Sequence[Record]) -> list[str]:
    """The haystacks ``rows`` break down by, in order of first appearance (``"all"`` left out)."""
    return list(dict.fromkeys(r["haystack"] for r in rows if r.get("haystack", ALL) != ALL))


def retrieval_rows(needles: Sequence[Record], n_resamples: int) -> list[dict[str, Any]]:
    """Mean score per length, arm and region (filled, tail), with its 95% BCa interval: pooled, per task
    and per haystack. Rows: {length, task, haystack, arm, region, n, mean, low, high}; ``task`` and
    ``haystack`` are ``"all"`` where they pool."""
    groups: dict[tuple, list[float]] = defaultdict(list)
    for r in needles:
        if r["region"] in REGIONS:
            for task, haystack in ((ALL, ALL), (r["task"], ALL), (ALL, haystack_of(r))):
                groups[(r["length"], task, haystack, r["arm"], r["region"])].append(float(r["score"]))
    rows = []
    for (length, task, haystack, arm, region), scores in sorted(groups.items(), key=lambda kv: _order(kv[0])):
        interval = bootstrap_mean(np.asarray(scores), n_resamples=n_resamples)
        rows.append({"length": length, "task": task, "haystack": haystack, "arm": arm, "region": region,
                     "n": len(scores), **interval_fields(interval, "mean")})
    return rows


def _order(key: tuple) -> tuple:
    length, task, haystack, arm, region = key
    return (length, task != ALL, task, haystack != ALL, haystack, arm_sort_key(arm), REGIONS.index(region))


def retrieval_diffs(needles: Sequence[Record], n_resamples: int) -> list[dict[str, Any]]:
    """:data:`RETRIEVAL_PAIRS` on the same samples, per length and pooled (``"all"``), over every haystack
    and per haystack: {length, haystack, arm, vs, n, diff, low, high, mcnemar_p, b01, b10}.

    The samples are those whose needle the first arm's record puts in the filled region, against the same
    samples in the second arm whatever region its own record names (``nofill+longtail`` runs a longer tail,
    so part of RidgeFill's filled region is in its tail). Intervals resample within task."""
    filled: dict[str, dict[tuple, float]] = defaultdict(dict)
    scored: dict[str, dict[tuple, float]] = defaultdict(dict)
    for r in needles:
        key = (r["length"], r["task"], r["sample"], haystack_of(r))
        scored[r["arm"]][key] = float(r["score"])
        if r["region"] == "filled":
            filled[r["arm"]][key] = float(r["score"])
    lengths = sorted({r["length"] for r in needles})
    names = list(dict.fromkeys(haystack_of(r) for r in needles))
    rows = []
    for length in [*lengths, ALL]:
        for haystack in [ALL, *names]:
            for arm, vs in RETRIEVAL_PAIRS:
                keys = [k for k in filled[arm] if k in scored[vs] and length in (ALL, k[0]) and haystack in (ALL, k[3])]
                if keys:
                    rows.append({"length": length, "haystack": haystack, "arm": arm, "vs": vs,
                                 **paired_difference([filled[arm][k] for k in keys], [scored[vs][k] for k in keys],
                                                     [k[1] for k in keys], n_resamples)})
    return rows


def paired_difference(a: Sequence[float], b: Sequence[float], strata: Sequence[str], n_resamples: int) -> dict[str, Any]:
    """Mean of ``a - b`` over paired samples, its BCa interval resampled within ``strata``, and McNemar's
    exact test on full-score success: {n, diff, low, high, mcnemar_p, b01, b10}."""
    a_, b_ = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    interval = stratified_paired_bootstrap(a_, b_, list(strata), n_resamples=n_resamples)
    test = mcnemar(a_ >= SUCCESS, b_ >= SUCCESS)
    return {"n": len(a_), **interval_fields(interval, "diff"), "mcnemar_p": json_number(test["p_value"]),
            "b01": int(test["b01"]), "b10": int(test["b10"])}


def exact_rows(needles: Sequence[Record]) -> list[dict[str, Any]]:
    """Exact prefix rows per filled-region request, as the server reported them (``meta_info["ridgefill"]``):
    {length, arm, n, mean, min, max}, for the arms whose records carry them; with the needle rows the server
    watched (``needle_rows``, ``needle_rows_exact``), also how much of the needle ran exactly: ``needle_share``
    (mean share of its rows), ``needle_whole`` of ``needle_watched`` samples with every row exact, and the mean
    score of those (``score_whole``) and of the rest (``score_partial``); None where nothing was watched."""
    groups: dict[tuple, list[Record]] = defaultdict(list)
    for r in needles:
        if r["region"] == "filled" and isinstance(r.get("exact_rows"), int):
            groups[(r["length"], r["arm"])].append(r)
    out = []
    for (length, arm), records in sorted(groups.items(), key=lambda kv: (kv[0][0], arm_sort_key(kv[0][1]))):
        v = [r["exact_rows"] for r in records]
        out.append({"length": length, "arm": arm, "n": len(v), "mean": float(np.mean(v)), "min": min(v), "max": max(v),
                    **_needle_coverage(records)})
    return out


def _needle_coverage(records: Sequence[Record]) -> dict[str, Any]:
    watched = [r for r in records if isinstance(r.get("needle_rows_exact"), int) and r.get("needle_rows", 0) > 0]
    whole = [r for r in watched if r["needle_rows_exact"] == r["needle_rows"]]
    partial = [r for r in watched if r["needle_rows_exact"] != r["needle_rows"]]
    mean = lambda xs: float(np.mean(xs)) if xs else None  # noqa: E731
    return {"needle_watched": len(watched), "needle_whole": len(whole),
            "needle_share": mean([r["needle_rows_exact"] / r["needle_rows"] for r in watched]),
            "score_whole": mean([float(r["score"]) for r in whole]),
            "score_partial": mean([float(r["score"]) for r in partial])}


def sample_scores(needles: Sequence[Record]) -> list[dict[str, Any]]:
    """Each sample's score per arm, for comparisons across runs (other maps folders, splits), which pair
    samples by id and prompt hash: {length, task, haystack, sample, prompt_sha, region, scores: {arm: score}}.
    ``prompt_sha`` is None in records written before the runner hashed prompts."""
    samples: dict[tuple, dict[str, Any]] = {}
    for r in needles:
        key = (r["length"], r["task"], r["sample"])
        entry = samples.setdefault(key, {"length": r["length"], "task": r["task"], "haystack": haystack_of(r),
                                         "sample": r["sample"], "prompt_sha": r.get("prompt_sha"),
                                         "region": r["region"], "scores": {}})
        entry["scores"][r["arm"]] = float(r["score"])
        if r["arm"] == EXACT or entry["prompt_sha"] is None:
            entry["prompt_sha"] = r.get("prompt_sha")
    return [samples[k] for k in sorted(samples, key=lambda k: (k[0], k[1], str(k[2])))]
