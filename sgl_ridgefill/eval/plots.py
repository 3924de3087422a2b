"""The evaluation report's plots (matplotlib, Agg backend, imported lazily): filled-region retrieval,
retrieval against needle depth, loss per arm, and the splice tests' share of loss removed."""

from __future__ import annotations

import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .arms import ARM_ORDER, arm_sort_key
from .retrieval import ALL

DEPTH_BINS = 10
Row = Mapping[str, Any]


def find_row(rows: Sequence[Row], **match: Any) -> Row | None:
    """The first row whose fields equal ``match``."""
    return next((r for r in rows if all(r.get(k) == v for k, v in match.items())), None)


def _color(arm: str) -> Any:
    """The same colour for an arm in every plot and panel (a layer-range splice: its own, by first layer)."""
    from matplotlib import colormaps

    i, first_layer, _ = arm_sort_key(arm)
    if first_layer >= 0:
        i = len(ARM_ORDER) + first_layer
    return colormaps["tab20"]((2 * i + i // 10) % 20)  # the ten strong colours first, then their light twins


def _figure(ncols: int, width: float = 5.5, height: float = 4.0):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width * ncols, height))
    FigureCanvasAgg(fig)
    return fig, [fig.add_subplot(1, ncols, i + 1) for i in range(ncols)]


def _save(fig, path: pathlib.Path) -> pathlib.Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path


def _grouped_bars(ax, rows: Sequence[Row], key: str) -> None:
    """Bars of ``key`` with interval error bars: one group per length, one bar per arm."""
    lengths = sorted({r["length"] for r in rows})
    arms = sorted({r["arm"] for r in rows}, key=arm_sort_key)
    width = 0.8 / max(len(arms), 1)
    for j, arm in enumerate(arms):
        xs, ys, err = [], [], [[], []]
        for i, length in enumerate(lengths):
            r = find_row(rows, length=length, arm=arm)
            if r is None or r.get(key) is None:
                continue
            xs.append(i - 0.4 + width * (j + 0.5))
            ys.append(r[key])
            err[0].append(max(r[key] - r["low"], 0.0) if r.get("low") is not None else 0.0)
            err[1].append(max(r["high"] - r[key], 0.0) if r.get("high") is not None else 0.0)
        # Lists, not an array: matplotlib 3.11 warns on a [2, 1] array for a single bar.
        has_err = any(e > 0 for e in err[0] + err[1])
        ax.bar(xs, ys, width, yerr=err if has_err else None, capsize=2, label=arm, color=_color(arm))
    ax.set_xticks(range(len(lengths)), [str(n) for n in lengths])
    ax.set_xlabel("prompt tokens")
    ax.grid(axis="y", alpha=0.3)


def plot_retrieval(rows: Sequence[Row], path: pathlib.Path) -> pathlib.Path | None:
    rows = [r for r in rows if r["task"] == ALL and r.get("haystack", ALL) == ALL and r.get("mean") is not None]
    if not rows:
        return None
    fig, (ax,) = _figure(1, width=8)
    _grouped_bars(ax, rows, "mean")
    ax.set_ylabel("filled-region score (0-100)")
    ax.set_ylim(0, 105)
    ax.legend(fontsize=7, ncol=2)
    return _save(fig, path)


def plot_depth(needles: Sequence[Row], meta: Row, path: pathlib.Path) -> pathlib.Path | None:
    lengths = sorted({r["length"] for r in needles})
    if not lengths:
        return None
    fig, axes = _figure(len(lengths), width=4.5)
    edges = np.linspace(0.0, 1.0, DEPTH_BINS + 1)
    for ax, length in zip(axes, lengths):
        here = [r for r in needles if r["length"] == length]
        for arm in sorted({r["arm"] for r in here}, key=arm_sort_key):
            depth = np.array([r["position"] / length for r in here if r["arm"] == arm])
            score = np.array([r["score"] for r in here if r["arm"] == arm], dtype=float)
            bins = np.clip(np.digitize(depth, edges) - 1, 0, DEPTH_BINS - 1)
            used = [b for b in range(DEPTH_BINS) if (bins == b).any()]
            centres = (edges[:-1] + edges[1:]) / 2
            ax.plot(centres[used], [score[bins == b].mean() for b in used], "-o", ms=3, alpha=0.8, label=arm,
                    color=_color(arm))
        if meta.get("tail"):
            ax.axvline(1 - meta["tail"] / length, color="black", ls="--", lw=0.8)
        longtail = (meta.get("longtail_tail") or {}).get(str(length))
        if longtail:
            ax.axvline(1 - longtail / length, color="gray", ls=":", lw=0.8)
        ax.set_title(f"{length} tokens")
        ax.set_xlabel("needle position / length")
        ax.set_xlim(0, 1)
        ax.set_ylim(-2, 105)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    axes[0].set_ylabel("score (0-100)")
    return _save(fig, path)


def plot_loss(rows: Sequence[Row], path: pathlib.Path) -> pathlib.Path | None:
    # The cut arm (no prefix at all) is left out: it is far above the others by construction on key tokens.
    panels = [(m, [r for r in rows if r["metric"] == m and r["arm"] != "cut" and r.get("mean") is not None])
              for m in ("key", "new")]
    panels = [(m, r) for m, r in panels if r]
    if not panels:
        return None
    fig, axes = _figure(len(panels), width=6)
    for ax, (metric, metric_rows) in zip(axes, panels):
        _grouped_bars(ax, metric_rows, "mean")
        ax.set_ylabel(f"{metric}-token loss (nat)")
        ax.legend(fontsize=7, ncol=2)
    return _save(fig, path)


def plot_splice(rows: Sequence[Row], path: pathlib.Path) -> pathlib.Path | None:
    panels = [(m, [r for r in rows if r["metric"] == m and r["share"] is not None]) for m in ("key", "new")]
    panels = [(m, r) for m, r in panels if r]
    if not panels:
        return None
    fig, axes = _figure(len(panels), width=5.5)
    for ax, (metric, metric_rows) in zip(axes, panels):
        _grouped_bars(ax, [{**r, "share": 100 * r["share"]} for r in metric_rows], "share")
        ax.axhline(100, color="black", ls="--", lw=0.8)
        ax.axhline(0, color="black", lw=0.8)
        ax.set_ylabel(f"share of RidgeFill's {metric}-token loss removed (%)")
        ax.legend(fontsize=7)
    return _save(fig, path)


# ------------------------------------------------------------------------------------------------- results


def plot_overview(rows: Sequence[Row], path: pathlib.Path) -> pathlib.Path | None:
    """``results_md.overview_rows`` against prompt length, one colour per model, map kind, split and preset:
    filled-region retrieval of exact (dotted), RidgeFill (solid) and identity (dashed); RidgeFill's key-token
    loss minus identity's, with its interval."""
    from matplotlib import colormaps

    series: dict[str, list[Row]] = {}
    for r in sorted(rows, key=lambda r: r["length"]):
        kind = "" if r.get("map_kind", "residual") == "residual" else f" {r['map_kind']}"
        preset = f" ({r['preset']})" if r.get("preset") else ""
        series.setdefault(f"{r['model']}{kind} {r['split']}{preset}", []).append(r)
    if not series:
        return None
    fig, (left, right) = _figure(2, width=6.5, height=4.0 + 0.12 * len(series) * 3)
    styles = (("exact", ":"), ("ridgefill", "-"), ("identity", "--"))
    for i, (label, points) in enumerate(series.items()):
        color = colormaps["tab10"](i % 10)
        for arm, style in styles:
            xy = [(r["length"], r["retrieval"][arm]) for r in points if r["retrieval"].get(arm) is not None]
            if xy:
                left.plot(*zip(*xy), style, marker="o", ms=4, color=color, label=f"{label} {arm}")
        diffs = [r for r in points if r["key_diff"] is not None and r["key_diff"].get("diff") is not None]
        if diffs:
            ys = np.array([r["key_diff"]["diff"] for r in diffs])
            low = np.array([y if r["key_diff"].get("low") is None else r["key_diff"]["low"] for r, y in zip(diffs, ys)])
            high = np.array([y if r["key_diff"].get("high") is None else r["key_diff"]["high"] for r, y in zip(diffs, ys)])
            right.errorbar([r["length"] for r in diffs], ys, yerr=[np.maximum(ys - low, 0).tolist(), np.maximum(high - ys, 0).tolist()],
                           fmt="-o", ms=4, capsize=3, color=color, label=label)
    lengths = sorted({r["length"] for r in rows})
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.set_xticks(lengths, [f"{n / 1024:g}K" for n in lengths])
        ax.minorticks_off()
        ax.set_xlabel("prompt tokens")
        ax.grid(alpha=0.3)
    left.set_ylabel("filled-region score (0-100)")
    left.set_ylim(-2, 105)
    if left.get_legend_handles_labels()[0]:
        left.legend(fontsize=6, ncol=2, loc="upper center", bbox_to_anchor=(0.5, -0.15))  # below: never over a point
    right.axhline(0, color="black", lw=0.8)
    right.set_ylabel("key-token loss, RidgeFill − identity (nat)")
    if right.get_legend_handles_labels()[0]:
        right.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.15))
    return _save(fig, path)


def plot_tradeoff(rows: Sequence[Row], path: pathlib.Path) -> pathlib.Path | None:
    """``tradeoff.tradeoff_rows``: filled-region retrieval against the speed bound 1/r, one panel per model and
    length, one colour per map kind (and per kind with a ``--rows-select`` of its own), each point labelled with
    its split; RidgeFill filled circles (the splits
    of a kind joined), RidgeFill+rows hollow squares at their own bound (map kinds spread slightly apart along
    the axis); exact as a dotted line."""
    from matplotlib import colormaps

    measured = [r for r in rows if r.get("speed") is not None and r.get("retrieval")]
    panels: dict[tuple, list[Row]] = {}
    for r in measured:
        panels.setdefault((r["model"], r["length"]), []).append(r)
    if not panels:
        return None
    series = lambda r: r["map_kind"] + (" (--rows-select)" if r.get("own_rows") else "")  # noqa: E731
    kinds = list(dict.fromkeys(series(r) for r in measured))
    fig, axes = _figure(len(panels), width=6.5, height=4.8)
    for ax, ((model, length), points) in zip(axes, panels.items()):
        for arm, speed_key, marker, fill in (("ridgefill", "speed", "o", True),
                                             ("ridgefill+rows", "speed_rows", "s", False)):
            for kind in kinds:
                color = colormaps["tab10"](kinds.index(kind) % 10)
                here = sorted((r for r in points if series(r) == kind and r["retrieval"].get(arm)
                               and r["retrieval"][arm].get("mean") is not None), key=lambda r: r[speed_key])
                if not here:
                    continue
                # Kinds at the same split share a bound: spread them a little apart so every bar shows.
                xs = [r[speed_key] + 0.004 * (kinds.index(kind) - (len(kinds) - 1) / 2) for r in here]
                ys = np.array([r["retrieval"][arm]["mean"] for r in here])
                ax.errorbar(xs, ys, yerr=_yerr([r["retrieval"][arm] for r in here], ys),
                            fmt=marker + ("-" if fill else ""), ms=6, capsize=3, color=color,
                            mfc=color if fill else "white", label=f"{kind} {'RidgeFill' if fill else 'RidgeFill+rows'}")
                for r, x, y in zip(here, xs, ys):
                    ax.annotate(f"S{r['split_layer']}", (x, y), textcoords="offset points", xytext=(5, 4), fontsize=7)
        exact = [r["retrieval"]["exact"]["mean"] for r in points
                 if r["retrieval"].get("exact") and r["retrieval"]["exact"].get("mean") is not None]
        if exact:
            ax.axhline(float(np.mean(exact)), color="black", ls=":", lw=0.9, label="exact")
        ax.set_title(f"{model}, {length} tokens", fontsize=9)
        ax.set_xlabel("speed bound 1/r (exact prefill time / RidgeFill's)")
        ax.set_ylabel("filled-region score (0-100)")
        ax.set_ylim(-2, 105)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="lower left")
    return _save(fig, path)


def _yerr(rows: Sequence[Row], ys: np.ndarray) -> list[list[float]]:
    """Error bars from each row's ``low`` and ``high`` (none where a row has no interval)."""
    low = np.array([y if r.get("low") is None else r["low"] for r, y in zip(rows, ys)])
    high = np.array([y if r.get("high") is None else r["high"] for r, y in zip(rows, ys)])
    return [np.maximum(ys - low, 0).tolist(), np.maximum(high - ys, 0).tolist()]
