"""Choosing the split and the map kind: runs that differ only by split, map kind and rows selection, side by
side against the speed they buy, paired by sample across runs.

Each planned run is one ``sgl-ridgefill eval`` (one maps folder, one split, one prompt length) whose
``summary.json`` sits in its report folder; a run without one is "not run". Per run: filled-region
retrieval of exact, RidgeFill and RidgeFill with rows (95% BCa intervals), their differences from exact on
the same samples, RidgeFill against the model's reference run (the first planned run of that model)
paired by sample id and prompt hash across the two runs, the key-token loss RidgeFill (and RidgeFill with
rows) adds over exact, and the prefill speed bound ``1/r``.

The speed bound counts only the layers skipped: with split ``S`` of ``L`` layers, tail ``T`` of ``N``
tokens and a share ``rho`` of the prefix rows run exactly, ``r = S/L + (1 - S/L) * (T + rho (N - T)) / N``
(the fill and the row selection cost a few percent more; ``tools/flops.py`` counts them).
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

from .arms import EXACT, RIDGEFILL, RIDGEFILL_ROWS, ROWS_SHARE
from .markdown import NA, ci, score, signed, table
from .plots import find_row
from .retrieval import ALL, haystacks, paired_difference, pooled

NOT_RUN = "not run"
ARMS = (EXACT, RIDGEFILL, RIDGEFILL_ROWS)
DEFAULT_ROWS = f"attention {ROWS_SHARE} %"  # the reference selection (arms.default_rows_select)
Row = Mapping[str, Any]


def rows_label(rows_select: str | None) -> str:
    """The rows column: the reference selection by name, a ``--rows-select`` spelled out."""
    return f"`{rows_select}`" if rows_select else DEFAULT_ROWS


@dataclasses.dataclass(frozen=True)
class PlannedRun:
    """One evaluation of the comparison: what it should measure, and where its ``summary.json`` lands."""

    name: str
    model: str
    map_kind: str
    split: int
    length: int
    report_dir: pathlib.Path
    rows_select: str | None = None  # the run's --rows-select (None: the reference selection)


def speed_bound(split: int, num_layers: int, tail: int, length: int, rows_share: float = 0.0) -> float:
    """``1/r``: exact prefill cost over RidgeFill's, counting layer-rows only (module docstring)."""
    if not 0 < split <= num_layers or not 0 < tail <= length or not 0.0 <= rows_share <= 1.0:
        raise ValueError(f"speed_bound: split {split} of {num_layers} layers, tail {tail} of {length} tokens and "
                         f"rows share {rows_share} do not describe a RidgeFill prefill")
    depth = split / num_layers
    exact_rows = tail + rows_share * (length - tail)
    return 1.0 / (depth + (1.0 - depth) * exact_rows / length)


def tradeoff_rows(planned: Sequence[PlannedRun], *, n_resamples: int = 5000) -> list[dict[str, Any]]:
    """One row per planned run, in the given order: {name, model, map_kind, split ("S/L"), length, status
    ("measured" or :data:`NOT_RUN`), n (filled samples of exact), retrieval (arm -> row), vs_exact (arm ->
    paired row), vs_reference (paired row of RidgeFill against the reference run, or None), reference,
    key_excess (key-token loss RidgeFill minus exact), speed, speed_rows, by_haystack (haystack -> arm -> row),
    split_layer}."""
    summaries = {run.name: _load(run) for run in planned}
    references: dict[str, PlannedRun] = {}
    for run in planned:
        references.setdefault(run.model, run)
    rows = []
    for run in planned:
        summary = summaries[run.name]
        row: dict[str, Any] = {"name": run.name, "model": run.model, "map_kind": run.map_kind,
                               "split_layer": run.split, "split": str(run.split), "length": run.length,
                               "rows": rows_label(run.rows_select), "own_rows": run.rows_select is not None,
                               "reference": references[run.model].name,
                               "status": NOT_RUN}
        if summary is not None:
            row.update(_measured(run, summary, summaries.get(references[run.model].name), n_resamples))
        rows.append(row)
    return rows


def _other_tasks(summary: Mapping[str, Any], reference: Mapping[str, Any] | None) -> tuple[str, ...] | None:
    """The run's needle tasks where they are not the reference run's (its samples are other prompts), else None."""
    tasks = (summary.get("meta") or {}).get("tasks")
    theirs = ((reference or {}).get("meta") or {}).get("tasks")
    return tuple(tasks) if tasks and theirs and set(tasks) != set(theirs) else None


def _load(run: PlannedRun) -> dict[str, Any] | None:
    path = run.report_dir / "summary.json"
    return json.loads(path.read_text()) if path.exists() else None


def _measured(run: PlannedRun, summary: Mapping[str, Any], reference: Mapping[str, Any] | None,
              n_resamples: int) -> dict[str, Any]:
    meta = summary.get("meta") or {}
    filled = [r for r in summary.get("retrieval", []) if r["length"] == run.length and r["region"] == "filled"
              and r["task"] == ALL]
    overall = {r["arm"]: r for r in pooled(filled) if r["arm"] in ARMS}
    by_haystack: dict[str, dict[str, Row]] = {}
    for name in haystacks(filled):
        by_haystack[name] = {r["arm"]: r for r in filled if r.get("haystack") == name and r["arm"] in ARMS}
    diffs = pooled(summary.get("retrieval_diffs", []))
    vs_exact = {arm: find_row(diffs, length=run.length, arm=arm, vs=EXACT) for arm in (RIDGEFILL, RIDGEFILL_ROWS)}
    key, key_rows = (find_row(summary.get("loss_diffs", []), length=run.length, metric="key", arm=arm, vs=EXACT)
                     for arm in (RIDGEFILL, RIDGEFILL_ROWS))
    layers, tail = meta.get("num_layers"), meta.get("tail")
    speed = speed_rows = None
    if isinstance(layers, int) and isinstance(tail, int):
        speed = speed_bound(run.split, layers, tail, run.length)
        fraction = meta.get("rows_fraction")
        if fraction is None:  # a selection of one's own (--rows-select): the rows the server said it computed
            fraction = _served_rows_fraction(summary, run.length, tail)
        speed_rows = None if fraction is None else speed_bound(run.split, layers, tail, run.length, fraction)
    return {
        "status": "measured", "map_kind": str(meta.get("map_kind") or run.map_kind),
        "rows": rows_label(meta.get("rows_select")), "own_rows": bool(meta.get("rows_select")),
        "split": f"{run.split}/{layers}" if isinstance(layers, int) else str(run.split),
        "n": (overall.get(EXACT) or overall.get(RIDGEFILL) or {}).get("n"), "retrieval": overall,
        "by_haystack": by_haystack, "vs_exact": vs_exact, "key_excess": key, "key_excess_rows": key_rows,
        "speed": speed, "speed_rows": speed_rows,
        "fill_flops": meta.get("fill_flops_per_row"),
        "other_tasks": _other_tasks(summary, reference),
        "vs_reference": None if reference is None or reference is summary else
        cross_run_difference(summary, reference, run.length, RIDGEFILL, n_resamples=n_resamples),
    }


def _served_rows_fraction(summary: Mapping[str, Any], length: int, tail: int) -> float | None:
    """The mean share of the prefix the RidgeFill+rows arm computed exactly, as the server reported it."""
    row = find_row(summary.get("exact_rows", []), length=length, arm=RIDGEFILL_ROWS)
    if row is None or row.get("mean") is None or length <= tail:
        return None
    return float(row["mean"]) / (length - tail)


def cross_run_difference(summary: Mapping[str, Any], reference: Mapping[str, Any], length: int, arm: str, *,
                         n_resamples: int = 5000) -> dict[str, Any] | None:
    """``arm``'s filled-region score in ``summary`` minus the same arm's in ``reference`` on the samples both
    runs scored: the same sample id and prompt hash (a text haystack leaves out each maps folder's own
    calibration documents, so a sample's prose can differ between runs). {n, diff, low, high, mcnemar_p,
    b01, b10, other_prompt (samples left out because their prompts differ)}; None when no sample pairs."""
    ours, theirs = _scores(summary, length, arm), _scores(reference, length, arm)
    shared = [key for key in ours if key in theirs]
    paired = [key for key in shared if ours[key][0] == theirs[key][0]]
    if not paired:
        return None
    row = paired_difference([ours[k][1] for k in paired], [theirs[k][1] for k in paired], [k[0] for k in paired],
                            n_resamples)
    return {**row, "other_prompt": len(shared) - len(paired)}


def _scores(summary: Mapping[str, Any], length: int, arm: str) -> dict[tuple, tuple[str | None, float]]:
    """(task, sample) -> (prompt hash, score) of the filled-region samples ``arm`` scored."""
    return {(s["task"], s["sample"]): (s.get("prompt_sha"), s["scores"][arm]) for s in summary.get("samples", [])
            if s["length"] == length and s["region"] == "filled" and arm in s["scores"]}


# ------------------------------------------------------------------------------------------------ Markdown


TEXT = (
    "Runs that differ only by split, map kind and rows, on the same prompts (a run of other needle tasks names "
    "them beside its sample count). Retrieval: mean score (0-100) of the "
    "samples whose needle lies in the filled prefix, 95% BCa interval; RidgeFill+rows also runs the rows of the "
    f"rows column exactly ({DEFAULT_ROWS}: {ROWS_SHARE} % of the prefix by attention from the last 64 tokens; "
    "otherwise the run's `--rows-select`). \"− exact\": the difference from exact on the same samples. "
    "\"vs reference\": RidgeFill minus RidgeFill of the model's first run below, paired by sample id and prompt "
    "across the two runs (n pairs). Key-token excess: RidgeFill's key-token loss minus exact's (nat, over "
    "documents), and RidgeFill+rows'. Fill: what filling one row of one upper layer costs with the map kind, in "
    "MFLOP (map and, for kinds that predict the layer input, its K/V projections). Speed bound: 1/r with "
    f"r = S/L + (1 − S/L)·T/N (with rows: T + {ROWS_SHARE} % of the prefix exact, or the mean the server reported "
    "for a --rows-select), counting only the layers skipped. –: not measured. Pick the cheapest split and kind "
    "whose retrieval is close enough to exact for the use; the plot draws the same trade-off."
)


def tradeoff_table(rows: Sequence[Row]) -> str:
    pts, nat = signed(".1f"), signed(".2f")
    header = ("model", "map kind", "split", "tokens", "rows", "filled samples", "exact", "RidgeFill", "RidgeFill+rows",
              "RidgeFill − exact", "RidgeFill+rows − exact", "RidgeFill vs reference", "key-token excess (nat)",
              "with rows (nat)",
              "fill (MFLOP/row/layer)", "speed bound", "with rows")
    out = []
    for r in rows:
        if r["status"] == NOT_RUN:
            out.append((r["model"], r["map_kind"], r["split"], r["length"], r.get("rows", NA), NOT_RUN,
                        *([NA] * (len(header) - 6))))
            continue
        retrieval, vs_exact = r["retrieval"], r["vs_exact"]
        out.append((
            r["model"], r["map_kind"], r["split"], r["length"], r["rows"], _samples(r),
            *(_cell(retrieval.get(arm), "mean", score) for arm in ARMS),
            *(_cell(vs_exact.get(arm), "diff", pts) for arm in (RIDGEFILL, RIDGEFILL_ROWS)),
            _reference_cell(r, pts), _cell(r["key_excess"], "diff", nat), _cell(r["key_excess_rows"], "diff", nat),
            _mflop(r.get("fill_flops")),
            _speed(r["speed"]), _speed(r["speed_rows"]),
        ))
    return table(header, out)


def _samples(row: Row) -> str:
    """Filled samples, with the needle tasks where they are not the reference run's."""
    n = NA if row["n"] is None else str(row["n"])
    return f"{n} ({', '.join(row['other_tasks'])})" if row.get("other_tasks") else n


def _cell(row: Row | None, key: str, fmt) -> str:
    return NA if row is None or row.get(key) is None else ci(row, key, fmt)


def _reference_cell(row: Row, fmt) -> str:
    if row["name"] == row["reference"]:
        return "reference"
    paired = row.get("vs_reference")
    if paired is None:
        return NA
    text = f"{ci(paired, 'diff', fmt)} (n = {paired['n']})"
    return text + (f", {paired['other_prompt']} with other prompts left out" if paired.get("other_prompt") else "")


def _mflop(flops: float | None) -> str:
    return NA if flops is None else f"{flops / 1e6:.2f}"


def _speed(x: float | None) -> str:
    return NA if x is None else f"{x:.2f}×"


def haystack_table(rows: Sequence[Row]) -> str:
    """Filled-region retrieval per haystack of every measured run."""
    out = []
    for r in rows:
        for name, arms in (r.get("by_haystack") or {}).items():
            n = (arms.get(EXACT) or arms.get(RIDGEFILL) or {}).get("n")
            out.append((r["model"], r["map_kind"], r["split"], r["length"], r["rows"], name, NA if n is None else n,
                        *(_cell(arms.get(arm), "mean", score) for arm in ARMS)))
    return table(("model", "map kind", "split", "tokens", "rows", "haystack", "filled samples", "exact", "RidgeFill",
                  "RidgeFill+rows"), out)
