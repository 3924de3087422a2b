"""The benchmark's outputs: a text table, ``bench.json`` and ``bench.png`` (TTFT and speedup against length)."""

from __future__ import annotations

import dataclasses
import json
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

from ..tools.flops import ModelDims
from .runner import BARE, EXACT, RIDGEFILL, BenchConfig, LengthSummary, Record

JSON_NAME = "bench.json"
PNG_NAME = "bench.png"


def format_table(summaries: Sequence[LengthSummary]) -> str:
    """One line per length: medians, speedup [min..max of pair ratios], both bounds, fraction of each."""
    head = (
        f"{'tokens':>7} {'arm':>9} {'exact rows':>10} {'exact s':>9} {'ridgefill s':>11} {'speedup':>8} "
        f"{'pair ratios':>15} {'1/r':>6} {'reached':>8} {'FLOP bnd':>8} {'reached':>8} {'cache hits':>10}"
    )
    cores = any(s.exact_cores is not None for s in summaries)
    if cores:
        head += f" {'cores ex/rf':>12}"
    lines = [head]
    for s in summaries:
        extra = ""
        if cores:
            extra = f" {_cores(s.exact_cores):>5}/{_cores(s.ridgefill_cores):<6}"
        rows = "-" if s.exact_rows is None else f"{s.exact_rows:.0f}"
        lines.append(
            f"{s.length:>7} {s.arm:>9} {rows:>10} {s.exact_median:>9.3f} {s.ridgefill_median:>11.3f} {s.speedup:>7.3f}x "
            f"{s.ratio_min:>6.3f}..{s.ratio_max:<6.3f} {s.layer_bound:>5.3f}x {s.layer_fraction:>7.1%} "
            f"{s.flop_bound:>7.3f}x {s.flop_fraction:>7.1%} {s.cache_hits:>10}" + extra
        )
    return "\n".join(lines)


def _cores(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def report_dict(
    config: BenchConfig,
    dims: ModelDims,
    records: Sequence[Record],
    summaries: Sequence[LengthSummary],
    server: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    cfg = dataclasses.asdict(config)
    cfg["lengths"] = list(config.lengths)
    cfg["rf_params"] = dict(config.rf_params)
    return {
        "config": cfg,
        "model": dataclasses.asdict(dims),
        "server": dict(server or {}),
        "summary": [s.to_dict() for s in summaries],
        "records": [dataclasses.asdict(r) for r in records],
    }


def write_json(path: pathlib.Path, report: Mapping[str, Any]) -> pathlib.Path:
    path.write_text(json.dumps(report, indent=2) + "\n")
    return path


def plot(path: pathlib.Path, records: Sequence[Record], summaries: Sequence[LengthSummary], title: str = "") -> pathlib.Path:
    """Left: TTFT of each arm (medians joined, every request a dot). Right: measured speedup, per-pair
    ratio range, and both bounds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    main = [s for s in summaries if s.arm == RIDGEFILL]
    bare = [s for s in summaries if s.arm == BARE]
    lengths = [s.length for s in main]
    fig, (ax_t, ax_s) = plt.subplots(1, 2, figsize=(11, 4.2))
    arms = [(EXACT, "tab:gray", main, "exact_median"), (RIDGEFILL, "tab:blue", main, "ridgefill_median")]
    if bare:
        arms.append((BARE, "tab:orange", bare, "ridgefill_median"))
    for arm, color, rows, key in arms:
        ax_t.plot([s.length for s in rows], [getattr(s, key) for s in rows], "-o", color=color, label=f"{arm} (median)")
        pts = [(r.length, r.seconds) for r in records if r.arm == arm]
        if pts:
            ax_t.scatter(*zip(*pts), s=10, color=color, alpha=0.4)
    ax_t.set_xlabel("prompt tokens")
    ax_t.set_ylabel("TTFT (s)")
    ax_t.set_xscale("log", base=2)
    ax_t.set_xticks(lengths, [str(n) for n in lengths])
    ax_t.legend()
    ax_t.grid(alpha=0.3)

    speed = [s.speedup for s in main]
    err = [[s.speedup - s.ratio_min for s in main], [s.ratio_max - s.speedup for s in main]]
    ax_s.errorbar(lengths, speed, yerr=err, fmt="-o", color="tab:blue", capsize=3, label="measured (pair-ratio range)")
    if bare:
        ax_s.plot([s.length for s in bare], [s.speedup for s in bare], "-o", color="tab:orange", label="bare fill")
    ax_s.plot(lengths, [s.layer_bound for s in main], "--", color="tab:green", label="layer-pass bound 1/r")
    ax_s.plot(lengths, [s.flop_bound for s in main], ":", color="tab:red", label="FLOP-counted bound")
    ax_s.axhline(1.0, color="black", lw=0.8)
    ax_s.set_xlabel("prompt tokens")
    ax_s.set_ylabel("speedup over exact (x)")
    ax_s.set_xscale("log", base=2)
    ax_s.set_xticks(lengths, [str(n) for n in lengths])
    ax_s.legend()
    ax_s.grid(alpha=0.3)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
