"""Closed-form centered ridge maps from sufficient statistics, and their held-out scores.

``X`` holds a map kind's features of the training rows and ``Y_l`` its targets at layer ``l``
(``stats.py``). With training means ``mu_x``, ``mu_l`` and centered ``C_xx = X^T X``, ``C_xy = X^T Y_l``:

    A_l = Y_l^T X (X^T X + alpha I)^-1     b_l = mu_l - A_l mu_x     alpha = lam * tr(X^T X) / d_in

solved by Cholesky in float64 (``A_l^T = (C_xx + alpha I)^-1 C_xy``), never by an explicit inverse.
Held-out squared error of any ``(A, b)`` follows from the held-out raw sums:

    sum |y - A x - b|^2 = yy - 2 tr(A H_xy) - 2 b.s_y + tr(A H_xx A^T) + 2 b.(A s_x) + m |b|^2

so ``lam`` is chosen on held-out documents without keeping any hidden state. Identity fill (``x_S`` as
every layer's input, its prediction of each kind's target counted in the statistics) is scored on the very
same rows. Scores come twice: on held-out normal rows (sinks left out, as they are served exactly; ``lam``
is chosen on these) and on all held-out rows (sinks included: what calibration reported before it left
them out, inflated by the sinks' share of the variance).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping, Sequence

import torch

from sgl_ridgefill.maps.kinds import DEFAULT_KIND, MapKind, map_kind

from .config import LAMBDA_GRID, CalibrationError
from .stats import SplitStats

# What a kind's held-out R^2 measures, by its target.
_METRICS = {
    "x": "R2 of each layer's input x_l",
    "u": "R2 of each layer's normalised input u_l = x_l / rms(x_l) (the linear prediction, before the layer's norm)",
    "kv": "R2 of each layer's K (before its K norm and RoPE) and V together",
}


@dataclasses.dataclass(frozen=True)
class SplitFit:
    """The solved maps of one split and how they score.

    ``A``: ``[U, d_out, d_in]`` float64; ``b``: ``[U, d_out]`` float64; ``r2``/``r2_identity``: held-out
    R^2 per upper layer on normal rows, of the maps and of identity fill (``None`` without held-out rows);
    ``r2_all``/``r2_identity_all``: the same on all held-out rows, sinks included; ``grid``:
    ``{lam: mean held-out R^2 on normal rows}``; ``kind``: the map kind's name.
    """

    split: int
    lam: float
    alpha: float
    A: torch.Tensor
    b: torch.Tensor
    r2: tuple[float, ...] | None
    r2_identity: tuple[float, ...] | None
    grid: dict[float, float]
    lam_chosen_on_heldout: bool
    r2_all: tuple[float, ...] | None = None
    r2_identity_all: tuple[float, ...] | None = None
    kind: str = DEFAULT_KIND

    def info(self, train_rows: int, heldout_rows: int, heldout_all_rows: int | None = None,
             sink_rows: Mapping[str, int] | None = None) -> dict[str, Any]:
        """The manifest entry's scores for this split: ``*_rows`` count the rows of the training and
        held-out statistics (``heldout_all_rows``: sinks included); ``sink_rows``: sink rows left out, per side."""
        layers = list(range(self.split, self.split + self.A.shape[0]))
        scores = None
        if self.r2 is not None:
            both = self.r2_all is not None
            per_layer = {}
            for i, layer in enumerate(layers):
                entry = {"r2": self.r2[i], "r2_identity": self.r2_identity[i]}
                if both:
                    entry.update(r2_all_rows=self.r2_all[i], r2_identity_all_rows=self.r2_identity_all[i])
                per_layer[str(layer)] = entry
            scores = {
                "metric": f"{_METRICS[map_kind(self.kind).target]} on held-out documents (1 - SSE / total variance); "
                "r2: on normal rows (sinks left out, as served), r2_all_rows: on all rows; r2_identity: identity "
                "fill's (x_S as every layer's input)",
                "rows": heldout_rows,
                "layers": per_layer,
                "mean_r2": _mean(self.r2),
                "mean_r2_identity": _mean(self.r2_identity),
            }
            if both:
                scores.update(rows_all=heldout_all_rows, mean_r2_all_rows=_mean(self.r2_all),
                              mean_r2_identity_all_rows=_mean(self.r2_identity_all))
        return {
            "lambda": self.lam,
            "alpha": self.alpha,
            "lambda_chosen_on_heldout": self.lam_chosen_on_heldout,
            "lambda_grid": {f"{lam:g}": r2 for lam, r2 in self.grid.items()},
            "train_rows": train_rows,
            **({"sink_rows": dict(sink_rows)} if sink_rows is not None else {}),
            "heldout": scores,
        }


def _mean(values: Sequence[float]) -> float:
    return float(sum(values) / len(values))


def _centered(stats: SplitStats) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(mu_x [d_in], mu_y [U, d_out], C_xx [d_in, d_in], C_xy [U, d_in, d_out])`` about the training means."""
    n = stats.count
    mu_x = stats.sum_x / n
    mu_y = stats.sum_y / n
    cxx = stats.xtx - n * torch.outer(mu_x, mu_x)
    cxy = stats.xty - n * mu_x[None, :, None] * mu_y[:, None, :]
    return mu_x, mu_y, cxx, cxy


def _factor(cxx: torch.Tensor, lam: float, split: int) -> tuple[torch.Tensor, float]:
    d = cxx.shape[0]
    alpha = lam * float(torch.trace(cxx)) / d
    chol, info = torch.linalg.cholesky_ex(cxx + alpha * torch.eye(d, dtype=cxx.dtype))
    if int(info) != 0 or not alpha > 0:
        raise CalibrationError(
            f"split {split}: X^T X + alpha I is not positive definite at lambda {lam:g} (alpha {alpha:g}); "
            f"the calibration rows are degenerate (too few rows, or constant states)"
        )
    return chol, alpha


def ridge_maps(stats: SplitStats, lam: float) -> tuple[torch.Tensor, torch.Tensor, float]:
    """``(A [U, d_out, d_in], b [U, d_out], alpha)`` for penalty ``lam`` from training statistics."""
    if not lam > 0:
        raise CalibrationError(f"lambda must be positive, got {lam!r}")
    if stats.rows < 2:
        raise CalibrationError(f"split {stats.split}: {stats.rows} calibration rows; cannot fit maps")
    mu_x, mu_y, cxx, cxy = _centered(stats)
    chol, alpha = _factor(cxx, lam, stats.split)
    u, d_in, d_out = cxy.shape
    # One triangular solve pair for every layer at once: [d_in, U * d_out].
    rhs = cxy.permute(1, 0, 2).reshape(d_in, u * d_out)
    at = torch.cholesky_solve(rhs, chol).reshape(d_in, u, d_out)
    A = at.permute(1, 2, 0).contiguous()
    b = mu_y - torch.einsum("uoi,i->uo", A, mu_x)
    return A, b, alpha


def squared_errors(stats: SplitStats, A: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``[U]`` sum over ``stats``' rows of ``|y_l - A_l x - b_l|^2``, from raw sums alone."""
    errors = torch.empty(A.shape[0], dtype=torch.float64)
    for i in range(A.shape[0]):
        a, bi = A[i].double(), b[i].double()
        at = a.T  # [d_in, d_out]
        cross = (at * stats.xty[i]).sum()
        quad = (at * (stats.xtx @ at)).sum()
        errors[i] = (
            stats.yy[i] - 2 * cross - 2 * bi @ stats.sum_y[i] + quad + 2 * bi @ (a @ stats.sum_x) + stats.count * bi @ bi
        )
    return errors.clamp_min(0.0)


def identity_errors(stats: SplitStats) -> torch.Tensor:
    """``[U]`` squared error of identity fill (``x_S`` as every layer's input) in the kind's target space."""
    return (stats.yy - 2 * stats.py + stats.pp).clamp_min(0.0)


def total_variance(stats: SplitStats) -> torch.Tensor:
    """``[U]`` sum of ``|y_l - mean(y_l)|^2`` over ``stats``' own rows (R^2's denominator)."""
    return stats.yy - (stats.sum_y * stats.sum_y).sum(-1) / stats.count


def r2_scores(heldout: SplitStats, A: torch.Tensor, b: torch.Tensor) -> tuple[float, ...]:
    return tuple((1.0 - squared_errors(heldout, A, b) / total_variance(heldout)).tolist())


def identity_r2(heldout: SplitStats) -> tuple[float, ...]:
    return tuple((1.0 - identity_errors(heldout) / total_variance(heldout)).tolist())


def split_layer_exact(
    A: torch.Tensor, b: torch.Tensor, exact: tuple[torch.Tensor, torch.Tensor] | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Replace the first upper layer's map (layer ``S`` itself) by its exact map.

    Layer ``S``'s input is ``x_S``, known exactly: ridge shrinkage would only make it worse. ``exact``:
    ``(A_S [d_out, d_in'], b_S [d_out])`` with ``d_in' <= d_in`` (the first features; the rest get zero
    columns), e.g. the split layer's own K/V projection for the ``kv`` kinds; ``None``: the identity where
    ``A`` is square (``residual``; ``normalised``, whose maps are served through the layer's scale-free norm),
    else the penalised fit stays.
    """
    if exact is None and A.shape[1] != A.shape[2]:
        return A, b
    A, b = A.clone(), b.clone()
    if exact is None:
        A[0] = torch.eye(A.shape[1], dtype=A.dtype)
        b[0] = 0.0
    else:
        a0, b0 = exact
        A[0] = 0.0
        A[0, :, : a0.shape[1]] = a0.to(A.dtype)
        b[0] = b0.to(b.dtype)
    return A, b


def kind_r2(heldout: SplitStats, A: torch.Tensor, b: torch.Tensor, kind: MapKind) -> tuple[float, ...]:
    """Held-out R^2 per upper layer of maps ``(A, b)`` of ``kind``, as calibration reports it."""
    r2 = r2_scores(heldout, A, b)
    if kind.scale_free_target:
        # Layer S's identity map, served through the layer's scale-free norm, is u_S exactly, identity fill's
        # prediction; the linear prediction x_S that r2_scores measures in u-space is not what is served.
        r2 = identity_r2(heldout)[:1] + r2[1:]
    return r2


def fit_split(
    train: SplitStats,
    heldout: SplitStats | None,
    lam: float | None,
    grid: Sequence[float] = LAMBDA_GRID,
    *,
    kind: str = DEFAULT_KIND,
    exact: tuple[torch.Tensor, torch.Tensor] | None = None,
    heldout_all: SplitStats | None = None,
) -> SplitFit:
    """Solve one split of map kind ``kind``. ``lam=None`` picks the grid value with the best mean held-out
    R^2 on ``heldout``'s rows (normal rows: sinks left out), layer ``S`` included, whose map is exact
    (:func:`split_layer_exact` with ``exact``). ``heldout_all``: held-out rows with sinks, scored too."""
    kind_ = map_kind(kind)
    has_heldout = heldout is not None and heldout.rows > 0
    chosen = lam is None
    if lam is None and not has_heldout:
        raise CalibrationError(f"split {train.split}: choosing lambda needs held-out rows, and there are none")
    scores: dict[float, float] = {}
    if has_heldout and lam is None:
        for candidate in grid:
            A, b, _ = ridge_maps(train, candidate)
            scores[candidate] = _mean(kind_r2(heldout, *split_layer_exact(A, b, exact), kind_))
        lam = max(scores, key=lambda k: (scores[k], k))
    A, b, alpha = ridge_maps(train, lam)
    A, b = split_layer_exact(A, b, exact)
    r2 = r2_identity = r2_all = r2_identity_all = None
    if has_heldout:
        r2, r2_identity = kind_r2(heldout, A, b, kind_), identity_r2(heldout)
        scores.setdefault(lam, _mean(r2))
        if heldout_all is not None and heldout_all.rows > 0:
            r2_all, r2_identity_all = kind_r2(heldout_all, A, b, kind_), identity_r2(heldout_all)
    if r2 is not None and any(math.isnan(v) for v in r2):
        raise CalibrationError(f"split {train.split}: held-out scores are NaN (held-out states are constant?)")
    return SplitFit(train.split, float(lam), alpha, A, b, r2, r2_identity, dict(sorted(scores.items())), chosen,
                    r2_all, r2_identity_all, kind_.name)
