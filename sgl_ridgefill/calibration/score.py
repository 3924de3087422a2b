"""How well fitted maps predict text they were not fitted on: held-out R^2 of a maps folder on another pass's
statistics (``sgl-ridgefill calibrate score``).

Calibration scores its maps on held-out documents of its own corpus. Fitting on one kind of text (prose,
code) and serving another is the open question; this scores a maps folder, as it is served (its stored
``A``, ``b``), on the held-out statistics of any pass over the same model, e.g. one over another part of the
builtin corpus (``calibrate stats --corpus builtin:code``). The arithmetic is the calibration's own
(``solve.kind_r2``), from the sufficient statistics alone: no text is read again.
"""

from __future__ import annotations

import math
import pathlib
from typing import Any

import torch

from sgl_ridgefill.maps import load_maps
from sgl_ridgefill.maps.kinds import DEFAULT_KIND, map_kind

from .config import CalibrationError
from .solve import identity_r2, kind_r2
from .stats import load_stats


def score_maps(maps_dir: pathlib.Path, stats_dir: pathlib.Path, *, splits: tuple[int, ...] | None = None
               ) -> dict[str, Any]:
    """Per split of ``maps_dir`` (or ``splits``): held-out R^2 per upper layer of its maps on the held-out rows
    of ``stats_dir`` (sinks left out, as served), with the identity fill's beside it. Raises
    :class:`CalibrationError` naming what does not match (model, map kind, splits, no held-out rows)."""
    folder = load_maps(maps_dir)
    state = load_stats(stats_dir)
    kind = folder.manifest.get("map_kind", DEFAULT_KIND)
    if kind not in state.kinds:
        raise CalibrationError(f"--stats {stats_dir} holds map kind(s) {', '.join(state.kinds)}, not the maps' {kind} "
                               f"(accumulate it with `calibrate stats --kinds {kind}`)")
    mismatch = folder.check_model(state.run["model"])
    if mismatch:
        raise CalibrationError(f"--stats {stats_dir} is of another model than --maps {maps_dir}: {'; '.join(mismatch)}")
    chosen = tuple(splits) if splits else tuple(s for s in folder.splits if s in state.splits)
    absent = [s for s in chosen if s not in folder.splits or s not in state.splits]
    if absent or not chosen:
        raise CalibrationError(f"split(s) {', '.join(map(str, absent or folder.splits))}: the maps hold "
                               f"{', '.join(map(str, folder.splits))}, the statistics {', '.join(map(str, state.splits))}")
    out: dict[str, Any] = {"maps": str(maps_dir), "stats": str(stats_dir), "map_kind": kind,
                           "maps_corpus": folder.manifest.get("calibration", {}).get("corpus", {}).get("name"),
                           "stats_corpus": state.run["corpus"]["name"], "splits": {}}
    for split in chosen:
        heldout = state.heldout[split, kind]
        if heldout.rows == 0:
            raise CalibrationError(f"--stats {stats_dir}: no held-out rows for split {split} (--heldout-docs 0?)")
        A, b = folder.load_split(split, dtype=torch.float64)
        r2, r2_identity = kind_r2(heldout, A, b, map_kind(kind)), identity_r2(heldout)
        if any(math.isnan(v) for v in r2):
            raise CalibrationError(f"split {split}: held-out scores are NaN (held-out states are constant?)")
        out["splits"][str(split)] = {
            "layers": list(folder.layers(split)), "r2": [round(v, 5) for v in r2],
            "r2_identity": [round(v, 5) for v in r2_identity], "heldout_rows": int(heldout.rows),
            "mean_r2": round(sum(r2) / len(r2), 5), "mean_r2_identity": round(sum(r2_identity) / len(r2_identity), 5),
        }
    return out


def markdown(result: dict[str, Any]) -> str:
    """A table per split: layer, R^2 of the maps, R^2 of the identity fill."""
    lines = [f"maps fitted on `{result['maps_corpus']}`, scored on held-out rows of `{result['stats_corpus']}` "
             f"({result['map_kind']} maps)", ""]
    for split, s in result["splits"].items():
        lines += [f"split {split} ({s['heldout_rows']} held-out rows): mean R² {s['mean_r2']:.4f}, identity "
                  f"{s['mean_r2_identity']:.4f}", "", "| layer | R² | R² identity |", "|---|---|---|"]
        lines += [f"| {layer} | {r:.4f} | {i:.4f} |" for layer, r, i in zip(s["layers"], s["r2"], s["r2_identity"])]
        lines.append("")
    return "\n".join(lines)
