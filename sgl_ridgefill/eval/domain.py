"""The calibration's domain: maps fitted on the builtin mix, on its code alone and on its prose alone, side by
side on haystacks of each kind (filled-region retrieval) and on each other's held-out rows (R^2).

A run of the ``calibration-domain`` group keeps ``domain_r2.json`` beside its report: its maps' mean
held-out R^2 on every domain pass made so far (``calibrate score``), keyed by that pass's corpus.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from .arms import EXACT, RIDGEFILL
from .markdown import NA, score, table
from .tradeoff import NOT_RUN, PlannedRun, tradeoff_rows

DOMAIN_R2 = "domain_r2.json"
TEXT = ("Residual maps at the split, fitted on 200K tokens of the builtin corpus (`builtin`: the King James Bible, "
        "the Python documentation and the Python standard library), of its code alone (`builtin:code`) or of its "
        "prose alone (`builtin:prose`); each run's samples leave out the documents its maps read. Retrieval: mean "
        "filled-region score (0-100) per haystack (text: prose, code: Python sources). R²: the maps' mean held-out "
        "R² over the upper layers on the held-out rows of each pass (the identity fill's in brackets); –: not "
        "run or not calibrated yet.")


def section(runs: Sequence[tuple[str, PlannedRun]], *, n_resamples: int = 5000) -> list[str]:
    """The RESULTS.md section for ``runs`` (``(corpus, planned run)`` pairs, in table order); [] when none ran."""
    if not runs:
        return []
    rows = tradeoff_rows([planned for _, planned in runs], n_resamples=n_resamples)
    if all(r["status"] == NOT_RUN for r in rows) and not any(_r2(p) for _, p in runs):
        return []
    corpora = [corpus for corpus, _ in runs]
    retrieval = []
    for (corpus, _), row in zip(runs, rows):
        by_haystack = row.get("by_haystack") or {}
        for name in sorted(by_haystack) or [NA]:
            arms = by_haystack.get(name, {})
            n = (arms.get(EXACT) or arms.get(RIDGEFILL) or {}).get("n")
            exact, fill = ((arms.get(a) or {}).get("mean") for a in (EXACT, RIDGEFILL))
            diff = NA if exact is None or fill is None else f"{fill - exact:+.1f}"
            retrieval.append((f"`{corpus}`", name, NA if n is None else n, score(exact), score(fill), diff))
    r2_rows = []
    for corpus, planned in runs:
        scores = _r2(planned)
        r2_rows.append((f"`{corpus}`", *(_r2_cell(scores.get(other)) for other in corpora)))
    return ["## Calibration domain: prose, code, both", TEXT,
            table(("maps fitted on", "haystack", "filled samples", "exact", "RidgeFill", "RidgeFill − exact"), retrieval),
            table(("maps fitted on", *(f"R² on `{c}`" for c in corpora)), r2_rows)]


def _r2(planned: PlannedRun) -> dict[str, Any]:
    path = planned.report_dir / DOMAIN_R2
    return json.loads(path.read_text()) if path.exists() else {}


def _r2_cell(entry: dict[str, Any] | None) -> str:
    return NA if not entry else f"{entry['mean_r2']:.3f} ({entry['mean_r2_identity']:.3f})"

