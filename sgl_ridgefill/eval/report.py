"""``REPORT.md`` and its plots from a ``summarize`` result (``docs/RESULTS.md`` joins them: ``results_md.py``).

The report leads with the fill-disabled check, then the setup, then one table per measurement, each
followed by its plot: filled-region retrieval (``retrieval_filled.png``), retrieval against needle depth
(``retrieval_depth.png``, needs the raw records), key- and new-token loss (``loss.png``) and the splice
tests (``splice.png``). "What the numbers say" states, per length, whether each target is met, not met or
not measured, from the same numbers. matplotlib (Agg) is imported only when a plot is drawn.
"""

from __future__ import annotations

import pathlib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from . import answers, plots
from .analysis import latest_records
from .arms import (EXACT, IDENTITY, NOFILL_LONGTAIL, RIDGEFILL, RIDGEFILL_NEEDLE_RANDOM, RIDGEFILL_NEEDLE_ROWS,
                   RIDGEFILL_RANDOM, RIDGEFILL_ROWS, arm_sort_key)
from .markdown import NA, ci, image, score, signed, table
from .retrieval import ALL, haystacks, pooled

REPORT_NAME = "REPORT.md"
FILLED_PNG, DEPTH_PNG, LOSS_PNG, SPLICE_PNG = "retrieval_filled.png", "retrieval_depth.png", "loss.png", "splice.png"

Row = Mapping[str, Any]


def write_report(summary: Mapping[str, Any], out_dir: str | pathlib.Path, *, title: str,
                 records: Iterable[Mapping[str, Any]] | None = None) -> pathlib.Path:
    """Write ``out_dir/REPORT.md`` and its PNGs; returns the Markdown path. ``records`` (the raw
    ``results.jsonl`` records) add the retrieval-by-depth plot."""
    out_dir = pathlib.Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for stale in (FILLED_PNG, DEPTH_PNG, LOSS_PNG, SPLICE_PNG):  # a plot with no data now is not drawn
        (out_dir / stale).unlink(missing_ok=True)
    meta = summary.get("meta") or {}
    parts = [f"# {title}", _check_text(summary.get("check")), "## Setup", _setup_table(meta, summary.get("wall"))]

    filled = [r for r in summary["retrieval"] if r["region"] == "filled"]
    tail = [r for r in summary["retrieval"] if r["region"] == "tail"]
    parts += ["## Needle retrieval, filled region",
              "Mean score (0-100) of the samples whose needle lies in RidgeFill's filled prefix (for "
              "nofill+longtail, part of it lies in that arm's longer exact tail), pooled over tasks and haystacks; "
              "95% BCa bootstrap interval in brackets, number of samples in parentheses."]
    parts += [_by_length_table(_overall(filled), "mean", score),
              image(plots.plot_retrieval(_overall(filled), out_dir / FILLED_PNG), "Filled-region retrieval")]
    parts += _breakdowns(filled, "filled region")
    parts += ["## Needle retrieval, tail region", "Samples whose needle lies in the tail, which every arm "
              "computes with the full model; under the fill arms the tail attends to the filled prefix, so a drop "
              "here is the fill's indirect harm (nofill's tail sees no prefix at all).",
              _by_length_table(_overall(tail), "mean", score)]
    parts += _breakdowns(tail, "tail region", tasks=False)
    if records is not None:
        needles = [r for r in latest_records(records) if r["kind"] == "needle"]
        depth = plots.plot_depth(needles, meta, out_dir / DEPTH_PNG)
        if depth is not None:
            parts += ["## Retrieval against needle depth", "Mean score by needle position / prompt length "
                      f"({plots.DEPTH_BINS} bins, every region); dashed: the tail boundary, dotted: the longer tail of "
                      "nofill+longtail where it ran.", image(depth, "Retrieval against depth")]
    parts += ["## Paired retrieval differences, filled region",
              "Difference of mean scores on the same samples (first arm minus second), 95% BCa interval from "
              "resampling within task; McNemar's exact test on full-score success (b01: only the second arm "
              "succeeds, b10: only the first); over every haystack (all), then per haystack. The needle-row oracle: ridgefill+needle-rows runs the needle's own "
              "tokens exactly, ridgefill+needle-random as many random prefix rows; far above ridgefill and "
              "the random rows, it says the needle rows' own keys are the lever (selectors, row-weighted maps), "
              "near them that the error is in the haystack's keys (better maps).",
              _retrieval_diff_table(summary["retrieval_diffs"])]
    if summary.get("exact_rows"):
        parts += ["Exact prefix rows per filled-region request, as the server reported them (the two needle-row "
                  "arms run the same number), and how much of the needle they held: the mean share of the needle's "
                  "own rows that ran exactly, the samples in which all of them did, and the mean score of those "
                  "samples against the rest (a selection that misses the needle cannot fix it).",
                  _exact_rows_table(summary["exact_rows"])]
    if summary.get("near_misses"):
        others = _knows_other_values(summary["near_misses"])
        parts += ["## Wrong answers to numeric needles",
                  "Filled-region samples of the 7-digit needles, wrong answers read as near misses (at least "
                  f"{answers.NEAR_DIGITS} of the 7 digits of an expected value in order: the needle was found and "
                  "its digits copied wrongly, an error in the needle rows' own keys and values) or misses (no "
                  "number or an unrelated one: the needle was not found among the haystack's keys). "
                  + ("Another key's value: a miss that gives the value of one of the prompt's other keys' needles "
                     "(multikey), the wrong needle found; – where a record does not list those values. " if others else "")
                  + "Share: near misses among wrong answers, 95% BCa interval.",
                  _near_miss_table(summary["near_misses"], others),
                  "A few wrong answers per arm, near misses first:",
                  _near_miss_examples_table(summary.get("near_miss_examples") or [])]

    parts += ["## Loss", f"Per-document mean loss (nat) on the last T = {meta.get('tail')} tokens of each document: on key tokens "
              "(loss with the context cut to those T tokens exceeds exact by more than 2 nat; the cut arm is "
              "above exact there by construction), on new tokens (outside any repeated 8-token span) and on all "
              "scored tokens; mean over documents with a 95% interval (few documents: wide), median after the slash.",
              _loss_table(summary["loss"]), image(plots.plot_loss(summary["loss"], out_dir / LOSS_PNG), "Loss per arm")]
    parts += ["## Paired loss differences", "First arm minus second, paired over documents (95% BCa interval, "
              "resampling documents within their corpus source, or all together when a source has only one).",
              _loss_diff_table(summary["loss_diffs"])]
    parts += ["## Decoding agreement with exact", "Top-1 agreement pooled over tokens and averaged per document; "
              "KL(exact || arm) from the top-k lists; the interval is on the per-document top-1 difference "
              "against identity (resampled like the loss differences).", _agreement_table(summary["agreement"])]
    parts += ["## Splice tests", "RidgeFill with exact keys, exact values, both, or only the exact key "
              "magnitude on the filled rows, in every upper layer or (`@FIRST-LAST`) in those upper layers only; "
              "share of RidgeFill's excess loss over exact that the splice removes, "
              "(L_ridgefill - L_splice) / (L_ridgefill - L_exact), on the documents all three reached. The "
              "per-layer splices say which layers hold the key error that exact keys remove.",
              _splice_table(summary["splice"]), image(plots.plot_splice(summary["splice"], out_dir / SPLICE_PNG),
                                                       "Splice: share of loss removed")]
    parts += ["## What the numbers say", _conclusions(summary)]
    path = out_dir / REPORT_NAME
    path.write_text("\n\n".join(p for p in parts if p) + "\n")
    return path


# ---------------------------------------------------------------------------------------------- formatting


def _loss(x: float | None) -> str:
    return NA if x is None else f"{x:.3f}"


def _check_text(check: Row | None) -> str:
    if check is None:
        return "**Check not run:** this run has no comparison of the fill-disabled server against stock SGLang."
    if check.get("passed"):
        return (f"Check passed: fill-disabled server byte-identical to stock on {check.get('prompts')} prompts "
                f"(compared: {check.get('compared', NA)}).")
    mismatches = list(check.get("mismatches") or [])
    shown = "\n".join(f"- {m}" for m in mismatches[:10])
    if len(mismatches) > 10:
        shown += f"\n- ... {len(mismatches) - 10} more"
    return (f"**CHECK FAILED: the fill-disabled server is NOT byte-identical to stock SGLang** "
            f"({len(mismatches)} mismatches over {check.get('prompts')} prompts, compared: "
            f"{check.get('compared', NA)}). The numbers below cannot be trusted until this is fixed.\n\n{shown}")


def _setup_table(meta: Row, wall: Row | None = None) -> str:
    if not meta:
        return "_No meta record in this run._"
    fields = ("model", "model_path", "split", "tail", "lengths", "maps", "map_kind", "rows_policy", "rows_fraction",
              "rows_select", "upgrade_rows", "longtail_tail", "preset", "tasks", "haystacks", "depths", "seeds",
              "started", "server", "cpu", "cpu_capability", "dtype", "threads", "command")
    rows = []
    for name in fields:
        if meta.get(name) is not None:
            value = meta[name]
            if isinstance(value, (list, tuple)):
                value = ", ".join(map(str, value))
            elif isinstance(value, Mapping):
                value = ", ".join(f"{k}: {v}" for k, v in value.items())
            rows.append((name, f"`{value}`" if name == "command" else value))
    if wall:
        rows.append(("wall time", _wall_text(wall)))
    return table(("setting", "value"), rows)


def _wall_text(wall: Mapping[str, Any]) -> str:
    """``analysis.wall_time`` in words, with the sessions that did not end normally."""
    text = f"{wall['seconds'] / 60:.1f} min in {wall['sessions']} session(s), {wall['requests']} request(s)"
    stopped = wall.get("stopped", 0)
    if stopped == 1:
        text += "; 1 session stopped early, counted to its last request"
    elif stopped:
        text += f"; {stopped} sessions stopped early, each counted to its last request"
    if wall.get("untimed_requests"):
        text += (f"; {wall['untimed_requests']} more request(s) ran in sessions stopped before wall time was kept "
                 f"per request ({wall['untimed_request_seconds'] / 60:.1f} min of request time)")
    for key, what in (("cpus", "CPU"), ("maps", "maps")):
        if wall.get(key):
            text += f"; requests by {what}: " + ", ".join(f"{name} {n}" for name, n in wall[key].items())
    return text


# -------------------------------------------------------------------------------------------------- tables


def _overall(rows: Sequence[Row]) -> list[Row]:
    """Retrieval rows pooled over tasks and haystacks."""
    return [r for r in pooled(rows) if r["task"] == ALL]


def _breakdowns(rows: Sequence[Row], region: str, *, tasks: bool = True) -> list[str]:
    """The per-task and per-haystack tables of one region's retrieval rows (each where the run has them)."""
    parts = []
    per_task = [r for r in pooled(rows) if r["task"] != ALL]
    if tasks and per_task:
        parts += [f"Per task ({region}):", _by_length_table(per_task, "mean", score, group="task")]
    per_haystack = [r for r in rows if r["task"] == ALL and r.get("haystack", ALL) != ALL]
    if per_haystack:
        parts += [f"Per haystack ({region}; noise: RULER's repeated sentences, text: real prose):",
                  _by_length_table(per_haystack, "mean", score, group="haystack")]
    return parts


def _by_length_table(rows: Sequence[Row], key: str, fmt, *, group: str | None = None) -> str:
    """One line per (``group``,) arm, one column per length: ``estimate [low, high] (n)``."""
    lengths = sorted({r["length"] for r in rows})
    cells: dict[tuple, dict[int, str]] = {}
    for r in rows:
        line = (r[group], r["arm"]) if group else (r["arm"],)
        cells.setdefault(line, {})[r["length"]] = f"{ci(r, key, fmt)} ({r['n']})"
    order = sorted(cells, key=lambda line: (*line[:-1], arm_sort_key(line[-1])))
    header = ((group,) if group else ()) + ("arm",) + tuple(str(n) for n in lengths)
    return table(header, [(*line, *(cells[line].get(n, NA) for n in lengths)) for line in order])


def _retrieval_diff_table(rows: Sequence[Row]) -> str:
    p = lambda x: NA if x is None else f"{x:.3g}"
    return table(("length", "haystack", "arm", "vs", "n", "difference", "McNemar p", "b01 / b10"),
                  [(r["length"], r.get("haystack", ALL), r["arm"], r["vs"], r["n"], ci(r, "diff", signed(".1f")),
                    p(r["mcnemar_p"]), f"{r['b01']} / {r['b10']}") for r in rows])


def _exact_rows_table(rows: Sequence[Row]) -> str:
    def needle(r: Row) -> tuple[str, str, str]:
        if not r.get("needle_watched"):
            return NA, NA, NA
        scores = " / ".join(NA if r[k] is None else f"{r[k]:.1f}" for k in ("score_whole", "score_partial"))
        return f"{100 * r['needle_share']:.0f} %", f"{r['needle_whole']} / {r['needle_watched']}", scores

    return table(("length", "arm", "requests", "mean", "min", "max", "needle rows exact", "whole needle exact",
                  "score: whole / not"),
                  [(r["length"], r["arm"], r["n"], f"{r['mean']:.1f}", r["min"], r["max"], *needle(r)) for r in rows])


def _knows_other_values(rows: Sequence[Row]) -> bool:
    """Whether any row counts the wrong answers that are another key's value (its records list them)."""
    return any(r.get("distractor") is not None for r in rows)


def _near_miss_table(rows: Sequence[Row], others: bool) -> str:
    share = lambda r: "no wrong answer" if r["share"] is None else ci(r, "share", lambda x: f"{x:.0f} %")  # noqa: E731
    other = (lambda r: (NA if r.get("distractor") is None else r["distractor"],)) if others else (lambda r: ())  # noqa: E731
    return table(("length", "haystack", "arm", "samples", "wrong", "near misses",
                  *(("another key's value",) if others else ()), "share of near misses"),
                 [(r["length"], r["haystack"], r["arm"], r["n"], r["wrong"], r["near"], *other(r), share(r))
                  for r in rows])


def _near_miss_examples_table(rows: Sequence[Row]) -> str:
    return table(("arm", "sample", "expected", "answer", "reading"),
                  [(r["arm"], r["sample"], r["expected"], f"`{r['output']}`" if r["output"] else "(empty)",
                    r["reading"]) for r in rows])


def _loss_table(rows: Sequence[Row]) -> str:
    by: dict[tuple, dict[str, Row]] = {}
    for r in rows:
        by.setdefault((r["length"], r["arm"]), {})[r["metric"]] = r
    cell = lambda r: NA if not r or r.get("mean") is None else f"{ci(r, 'mean', _loss)} / {_loss(r['median'])}"
    out = []
    for (length, arm), m in sorted(by.items(), key=lambda kv: (kv[0][0], arm_sort_key(kv[0][1]))):
        key = m.get("key", {})
        measured = key.get("n_docs", 0) + key.get("docs_without_tokens", 0)
        key_docs = (f"{key['n_docs']} of {measured}" if measured else "not measured (no exact or cut record)")
        out.append((length, arm, m["all"]["n_docs"] if "all" in m else NA, key_docs, key.get("n_tokens", 0),
                    cell(key), cell(m.get("new")), cell(m.get("all"))))
    return table(("length", "arm", "docs", "docs with key tokens", "key tokens", "key loss", "new loss",
                   "all loss"), out)


def _loss_diff_table(rows: Sequence[Row]) -> str:
    return table(("length", "metric", "arm", "vs", "docs", "difference"),
                  [(r["length"], r["metric"], r["arm"], r["vs"], r["n"], ci(r, "diff", signed(".3f"))) for r in rows])


def _agreement_table(rows: Sequence[Row]) -> str:
    pct = lambda x: NA if x is None else f"{100 * x:.1f}%"
    pts = signed(".1f")
    vs = lambda r: (NA if r["vs_identity_diff"] is None else
                    f"{pts(_scaled(r['vs_identity_diff']))} [{pts(_scaled(r['vs_identity_low']))}, "
                    f"{pts(_scaled(r['vs_identity_high']))}] points")
    return table(("length", "arm", "docs", "tokens", "top-1 pooled", "top-1 per doc", "KL mean", "KL median",
                   "top-1 vs identity"),
                  [(r["length"], r["arm"], r["n_docs"], r["n_tokens"], pct(r["top1"]), pct(r["top1_doc_mean"]),
                    _loss(r["kl_mean"]), _loss(r["kl_median"]), vs(r)) for r in rows])


def _scaled(x: float | None) -> float | None:
    return None if x is None else 100 * x


def _splice_table(rows: Sequence[Row]) -> str:
    share = lambda x: "undefined (RidgeFill matches exact)" if x is None else f"{100 * x:.1f}%"
    return table(("length", "arm", "layers", "metric", "docs", "splice loss", "ridgefill loss", "exact loss",
                   "share removed"),
                  [(r["length"], r["arm"], r.get("layers", ALL), r["metric"], r["n_docs"], _loss(r["loss"]),
                    _loss(r["ridgefill"]), _loss(r["exact"]), share(r["share"])) for r in rows])


# ------------------------------------------------------------------------------------------- conclusions


def _target(name: str, row: Row | None, key: str, op: str, threshold: float, fmt) -> str:
    """One line: met / not met by the point estimate (``op`` is ">=", ">" or "<" against ``threshold``), and
    whether the interval settles it."""
    if row is None or row.get(key) is None:
        return f"- {name}: not measured."
    ok = {">=": lambda x: x >= threshold, ">": lambda x: x > threshold, "<": lambda x: x < threshold}[op]
    est, low, high = row[key], row.get("low"), row.get("high")
    line = f"- {name}: **{'met' if ok(est) else 'not met'}** (difference {fmt(est)}"
    if low is None or high is None:
        return line + f", n = {row.get('n')}; no interval)."
    line += f" [{fmt(low)}, {fmt(high)}], n = {row.get('n')}"
    if ok(low) and ok(high):
        return line + "; the whole interval meets it)."
    if not ok(low) and not ok(high):
        return line + "; the whole interval misses it)."
    return line + f"; the interval straddles {fmt(threshold)}, so the data do not settle it)."


_RETRIEVAL_STATEMENTS = (
    ("RidgeFill minus identity", RIDGEFILL, IDENTITY),
    ("RidgeFill minus exact", RIDGEFILL, EXACT),
    ("RidgeFill minus no fill with an equal-cost longer tail", RIDGEFILL, NOFILL_LONGTAIL),
)
# (statement, arm, vs, comparison, threshold) on the filled-region retrieval difference arm - vs, in points.
RETRIEVAL_TARGETS = (
    ("RidgeFill at least 20 points above identity", RIDGEFILL, IDENTITY, ">=", 20.0),
    ("RidgeFill within 5 points of exact", RIDGEFILL, EXACT, ">=", -5.0),
    ("RidgeFill with rows within 2 points of exact", RIDGEFILL_ROWS, EXACT, ">=", -2.0),
    ("RidgeFill with rows above the same number of random rows", RIDGEFILL_ROWS, RIDGEFILL_RANDOM, ">", 0.0),
)


def _oracle_reading(oracle: Row, vs_exact: Row | None, fmt) -> str:
    """What the needle-row oracle says: the needles' own rows exact, minus as many random rows exact."""
    line = (f"- Needle-row oracle: the needles' own rows exact minus as many random rows, filled-region retrieval: "
            f"{ci(oracle, 'diff', fmt)} points over {oracle['n']} samples")
    if vs_exact is not None:
        line += f" (needle rows exact minus exact: {ci(vs_exact, 'diff', fmt)})"
    if oracle.get("low") is not None and oracle["low"] > 0:
        return line + (": the needles' own keys are the lever (a selector that finds their rows, or maps weighted "
                       "to them).")
    if oracle.get("high") is not None and oracle["high"] <= 0:
        return line + ": the needles' own rows do not help; the error is in the haystack's keys (better maps)."
    return line + "; the interval reaches 0, so the data do not say whether the needles' own rows are the lever."


def _conclusions(summary: Mapping[str, Any]) -> str:
    """Per length: the retrieval statements and targets over every haystack, each target followed by its
    reading per haystack, then the key-token loss target."""
    every, loss_diffs = summary["retrieval_diffs"], summary["loss_diffs"]
    diffs, names = pooled(every), haystacks(every)
    lengths = sorted({r["length"] for r in diffs if r["length"] != ALL} | {r["length"] for r in loss_diffs})
    if len({r["length"] for r in diffs if r["length"] != ALL}) > 1:
        lengths.append(ALL)
    if not lengths:
        return ("Nothing was measured in this run, so every target is not measured: RidgeFill at least 20 points "
                "above identity, within 5 points of exact, with rows within 2 points of exact and above random "
                "rows (filled-region retrieval), key-token loss below identity.")
    pts, nat = signed(".1f"), signed(".3f")
    out = []
    for length in lengths:
        head = "All lengths pooled" if length == ALL else f"{length} tokens"
        lines = [f"**{head}.**"]
        for label, arm, vs in _RETRIEVAL_STATEMENTS:
            r = plots.find_row(diffs, length=length, arm=arm, vs=vs)
            lines.append(f"- {label}, filled-region retrieval: " + (
                "not measured." if r is None else f"{ci(r, 'diff', pts)} points over {r['n']} samples."))
        for label, arm, vs, op, threshold in RETRIEVAL_TARGETS:
            lines.append(_target(label, plots.find_row(diffs, length=length, arm=arm, vs=vs), "diff", op, threshold, pts))
            for name in names:
                row = plots.find_row(every, length=length, haystack=name, arm=arm, vs=vs)
                if row is not None:
                    lines.append("  " + _target(f"{name} haystack", row, "diff", op, threshold, pts))
        oracle = plots.find_row(diffs, length=length, arm=RIDGEFILL_NEEDLE_ROWS, vs=RIDGEFILL_NEEDLE_RANDOM)
        if oracle is not None:
            lines.append(_oracle_reading(oracle, plots.find_row(diffs, length=length, arm=RIDGEFILL_NEEDLE_ROWS,
                                                                vs=EXACT), pts))
        near = plots.find_row(summary.get("near_misses") or [], length=length, haystack=ALL, arm=RIDGEFILL)
        if near is not None and near["wrong"]:
            other = (f", {near['distractor']} of {near['wrong']} another key's value (the wrong needle found)"
                     if near.get("distractor") is not None else "")
            lines.append(f"- RidgeFill's wrong filled-region answers to numeric needles: {near['near']} of "
                         f"{near['wrong']} are near misses (the digits copied wrongly, not the needle missed){other}.")
        if length != ALL:
            key = plots.find_row(loss_diffs, length=length, metric="key", arm=RIDGEFILL, vs=IDENTITY)
            lines.append(_target("Key-token loss of RidgeFill below identity (nat)", key, "diff", "<", 0.0, nat))
        out.append("\n".join(lines))
    return "\n\n".join(out)
