"""``docs/RESULTS.md`` from several runs' reports: an overview of every run, the split and map-kind
comparison (``tradeoff.py``), then each run's ``REPORT.md`` with its headings one level down and its links
rewritten relative to ``RESULTS.md``."""

from __future__ import annotations

import json
import os
import pathlib
import re
from collections.abc import Sequence
from typing import Any

from . import plots, tradeoff
from .arms import EXACT, IDENTITY, NOFILL, RIDGEFILL, RIDGEFILL_RANDOM, RIDGEFILL_ROWS
from .domain import section as domain_section
from .markdown import NA, ci, image, score, signed, table
from .report import REPORT_NAME
from .retrieval import ALL, pooled

OVERVIEW_PNG = "results_overview.png"  # next to RESULTS.md
TRADEOFF_PNG = "results_tradeoff.png"
Row = dict[str, Any]
_LINK = re.compile(r"(!?\[[^\]]*\])\(([^)\s]+)\)")


def render_results_md(report_dirs: Sequence[str | pathlib.Path], out: str | pathlib.Path, command: str, *,
                      comparison: Sequence[tradeoff.PlannedRun] = (),
                      domain: Sequence[tuple[str, tradeoff.PlannedRun]] = (), n_resamples: int = 5000) -> pathlib.Path:
    """Join ``REPORT.md`` of each directory into ``out`` (e.g. ``docs/RESULTS.md``) under one title, after the
    overview and, when ``comparison`` names runs, the split and map-kind comparison (runs without a
    ``summary.json`` in it are "not run")."""
    out = pathlib.Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    parts = ["# sgl-ridgefill evaluation results",
             f"Generated from {len(report_dirs)} report(s); regenerate with:\n\n```\n{command}\n```\n\n"
             "Do not edit by hand: the next run of that command overwrites this file."]
    overview = overview_rows([pathlib.Path(d) for d in report_dirs])
    if overview:
        figure = plots.plot_overview(overview, out.parent / OVERVIEW_PNG)
        parts += ["## Overview", _OVERVIEW_TEXT, _overview_table(overview),
                  image(figure, "Filled-region retrieval and key-token loss against prompt length")]
    else:
        (out.parent / OVERVIEW_PNG).unlink(missing_ok=True)
    parts += _tradeoff_section(comparison, out.parent, n_resamples)
    parts += domain_section(domain, n_resamples=n_resamples)
    for report_dir in map(pathlib.Path, report_dirs):
        path = report_dir / REPORT_NAME
        if not path.exists():
            raise ValueError(f"render_results_md: {report_dir} has no {REPORT_NAME}")
        parts.append(_titled(report_dir.name, _rebase(path.read_text(), report_dir, out.parent).strip()))
    out.write_text("\n\n".join(parts) + "\n")
    return out


def _tradeoff_section(comparison: Sequence[tradeoff.PlannedRun], folder: pathlib.Path, n_resamples: int) -> list[str]:
    if not comparison:
        (folder / TRADEOFF_PNG).unlink(missing_ok=True)
        return []
    rows = tradeoff.tradeoff_rows(comparison, n_resamples=n_resamples)
    figure = plots.plot_tradeoff(rows, folder / TRADEOFF_PNG)
    if figure is None:
        (folder / TRADEOFF_PNG).unlink(missing_ok=True)
    parts = ["## Choosing the split: map kind × split × rows", tradeoff.TEXT, tradeoff.tradeoff_table(rows),
             image(figure, "Filled-region retrieval against the speed bound, per split and map kind")]
    if any(r.get("by_haystack") for r in rows):
        parts += ["Per haystack (filled region; noise: RULER's repeated sentences, text: real prose):",
                  tradeoff.haystack_table(rows)]
    return [part for part in parts if part]


_OVERVIEW_ARMS = (EXACT, RIDGEFILL, IDENTITY, NOFILL, RIDGEFILL_ROWS, RIDGEFILL_RANDOM)
_OVERVIEW_TEXT = ("One row per run and prompt length (the run's section below, headed by its name, has every "
                  "table, interval and plot). "
                  "Retrieval: mean score (0-100) of the samples whose needle lies in the filled prefix, with their "
                  "number; RidgeFill minus identity on the same samples, 95% BCa interval. Key-token loss: "
                  "RidgeFill minus identity, in nat (below zero: RidgeFill loses less), 95% BCa interval over "
                  "documents. Splice: share of RidgeFill's excess key-token loss that exact keys on the filled "
                  "rows remove in every upper layer (in brackets: in each layer range alone). –: not run. The "
                  "plot draws the same numbers against prompt length, one colour per model, map kind and split.")


def overview_rows(report_dirs: Sequence[pathlib.Path]) -> list[dict[str, Any]]:
    """One row per run and length from each directory's ``summary.json`` (directories without one are left
    out): ``run`` (the directory's name), ``model``, ``map_kind``, ``split`` ("S/L"), ``length``, ``n`` (filled-region
    samples), ``retrieval`` (arm -> mean score), ``retrieval_diff``, ``key_diff`` (RidgeFill minus identity rows, or
    None), ``splice_keys`` (share), ``splice_key_ranges`` ([(layers, share)] of the per-layer key splices)."""
    rows = []
    for report_dir in report_dirs:
        path = report_dir / "summary.json"
        if not path.exists():
            continue
        summary = json.loads(path.read_text())
        meta = summary.get("meta") or {}
        lengths = sorted({r["length"] for key in ("retrieval", "loss_diffs") for r in summary.get(key, [])
                          if isinstance(r["length"], int)})
        for length in lengths:
            filled = {r["arm"]: r for r in pooled(summary.get("retrieval", []))
                      if r["length"] == length and r["task"] == ALL and r["region"] == "filled"}
            splice = plots.find_row(summary.get("splice", []), length=length, arm="splice:keys", metric="key")
            ranges = [(r["layers"], r["share"]) for r in summary.get("splice", []) if r["length"] == length
                      and r["metric"] == "key" and r.get("kind") == "keys" and r.get("layers", ALL) != ALL]
            rows.append({
                "run": report_dir.name, "model": str(meta.get("model", report_dir.name)),
                "map_kind": str(meta.get("map_kind") or "residual"),
                "split": f"{meta.get('split')}/{meta.get('num_layers', '?')}", "preset": meta.get("preset"),
                "length": length, "n": filled.get(EXACT, filled.get(RIDGEFILL, {})).get("n"),
                "retrieval": {arm: r["mean"] for arm, r in filled.items()},
                "retrieval_diff": plots.find_row(pooled(summary.get("retrieval_diffs", [])), length=length,
                                                 arm=RIDGEFILL, vs=IDENTITY),
                "key_diff": plots.find_row(summary.get("loss_diffs", []), length=length, metric="key", arm=RIDGEFILL,
                                           vs=IDENTITY),
                "splice_keys": None if splice is None else splice.get("share"),
                "splice_key_ranges": ranges,
            })
    return rows


def _overview_table(rows: Sequence[Row]) -> str:
    header = ("run", "model", "map kind", "split", "tokens", "filled samples", *_OVERVIEW_ARMS,
              "retrieval: RidgeFill − identity", "key-token loss: RidgeFill − identity (nat)", "splice: exact keys remove")
    return table(header, [(
        r["run"], r["model"], r["map_kind"], r["split"], r["length"], NA if r["n"] is None else r["n"],
        *(score(r["retrieval"].get(arm)) for arm in _OVERVIEW_ARMS),
        NA if r["retrieval_diff"] is None else ci(r["retrieval_diff"], "diff", signed(".1f")),
        NA if r["key_diff"] is None else ci(r["key_diff"], "diff", signed(".2f")),
        _splice_cell(r),
    ) for r in rows])


def _splice_cell(row: Row) -> str:
    """The all-layer key splice's share, then each layer range's: ``86 % (13-17: 30 %, 18-23: 55 %)``."""
    pct = lambda x: NA if x is None else f"{100 * x:.0f} %"  # noqa: E731
    ranges = ", ".join(f"{layers}: {pct(share)}" for layers, share in row.get("splice_key_ranges") or ())
    if row["splice_keys"] is None and not ranges:
        return NA
    return pct(row["splice_keys"]) + (f" ({ranges})" if ranges else "")


def _titled(run: str, section: str) -> str:
    """A report's section headed by its run (the folder's name), which tells apart runs of one model and split."""
    return f"## {run}: {section[3:]}" if section.startswith("## ") else f"## {run}\n\n{section}"


def _rebase(markdown: str, source_dir: pathlib.Path, target_dir: pathlib.Path) -> str:
    def link(m: re.Match) -> str:
        target = m.group(2)
        if re.match(r"^([a-z][a-z0-9+.-]*:|/|#)", target, re.I):
            return m.group(0)
        rel = os.path.relpath((source_dir / target).resolve(), target_dir.resolve())
        return f"{m.group(1)}({pathlib.PurePath(rel).as_posix()})"

    lines, fenced = [], False
    for line in markdown.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced:
            line = "#" + line if line.startswith("#") else _LINK.sub(link, line)
        lines.append(line)
    return "\n".join(lines)
