"""Closed-form centered ridge maps from sufficient statistics, and their held-out scores.

With training means ``mu_x``, ``mu_l`` and centered ``C_xx = X^T X``, ``C_xy = X^T Y_l``:

    A_l = Y_l^T X (X^T X + alpha I)^-1     b_l = mu_l - A_l mu_x     alpha = lam * tr(X^T X) / d_in

solved by Cholesky in float64 (``A_l^T = (C_xx + alpha I)^-1 C_xy``), never by an explicit inverse.
Held-out squared error of any ``(A, b)`` follows from the held-out raw sums:

    sum |y - A x - b|^2 = yy - 2 tr(A H_xy) - 2 b.s_y + tr(A H_xx A^T) + 2 b.(A s_x) + m |b|^2

so ``lam`` is chosen on held-out documents without keeping any hidden state, and the identity fill
(``A = I, b = 0``) is scored on the very same rows.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Sequence

import torch

from .config import LAMBDA_GRID, CalibrationError
from .stats import SplitStats


@dataclasses.dataclass(frozen=True)
class SplitFit:
    """The solved maps of one split and how they score.

    ``A``: ``[U, d_out, d_in]`` float64; ``b``: ``[U, d_out]`` float64; ``r2``/``r2_identity``: held-out
    R^2 per upper layer (``None`` without held-out rows); ``grid``: ``{lam: mean held-out R^2}``.
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

    def info(self, heldout_rows: int, train_rows: int) -> dict[str, Any]:
        """The manifest entry's scores for this split."""
        layers = list(range(self.split, self.split + self.A.shape[0]))
        scores = None
        if self.r2 is not None:
            scores = {
                "metric": "R2 of each layer's input on held-out documents (1 - SSE / total variance)",
                "rows": heldout_rows,
                "layers": {str(l): {"r2": r, "r2_identity": ri} for l, r, ri in zip(layers, self.r2, self.r2_identity)},
                "mean_r2": _mean(self.r2),
                "mean_r2_identity": _mean(self.r2_identity),
            }
        return {
            "lambda": self.lam,
            "alpha": self.alpha,
            "lambda_chosen_on_heldout": self.lam_chosen_on_heldout,
            "lambda_grid": {f"{lam:g}": r2 for lam, r2 in self.grid.items()},
            "train_rows": train_rows,
            "heldout": scores,
        }


def _mean(values: Sequence[float]) -> float:
    return float(sum(values) / len(values))


def _centered(stats: SplitStats) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(mu_x [d], mu_y [U, d], C_xx [d, d], C_xy [U, d_in, d_out])`` about the training means."""
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
    """``[U]`` squared error of the identity fill ``x_l = x_S`` (needs ``d_in == d_out``)."""
    tr_xx = torch.trace(stats.xtx)
    return torch.stack([stats.yy[i] - 2 * torch.trace(stats.xty[i]) + tr_xx for i in range(stats.xty.shape[0])]).clamp_min(0.0)


def total_variance(stats: SplitStats) -> torch.Tensor:
    """``[U]`` sum of ``|y_l - mean(y_l)|^2`` over ``stats``' own rows (R^2's denominator)."""
    return stats.yy - (stats.sum_y * stats.sum_y).sum(-1) / stats.count


def r2_scores(heldout: SplitStats, A: torch.Tensor, b: torch.Tensor) -> tuple[float, ...]:
    return tuple((1.0 - squared_errors(heldout, A, b) / total_variance(heldout)).tolist())


def split_layer_exact(A: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Replace the first upper layer's map (layer ``S`` itself) by the identity.

    Layer ``S``'s input is ``x_S``, known exactly: ridge shrinkage would only make it worse, so its map
    is ``A = I``, ``b = 0`` rather than the penalised fit (which tends to ``I`` as ``lam -> 0``).
    """
    if A.shape[1] != A.shape[2]:
        return A, b
    A, b = A.clone(), b.clone()
    A[0] = torch.eye(A.shape[1], dtype=A.dtype)
    b[0] = 0.0
    return A, b


def fit_split(
    train: SplitStats, heldout: SplitStats | None, lam: float | None, grid: Sequence[float] = LAMBDA_GRID
) -> SplitFit:
    """Solve one split. ``lam=None`` picks the grid value with the best mean held-out R^2 over the layers
    above ``S`` (layer ``S`` itself gets the exact identity map, see :func:`split_layer_exact`)."""
    has_heldout = heldout is not None and heldout.rows > 0
    chosen = lam is None
    if lam is None and not has_heldout:
        raise CalibrationError(f"split {train.split}: choosing lambda needs held-out rows, and there are none")
    scores: dict[float, float] = {}
    if has_heldout and lam is None:
        for candidate in grid:
            A, b, _ = ridge_maps(train, candidate)
            scores[candidate] = _mean(r2_scores(heldout, *split_layer_exact(A, b)))
        lam = max(scores, key=lambda k: (scores[k], k))
    A, b, alpha = ridge_maps(train, lam)
    A, b = split_layer_exact(A, b)
    r2 = r2_identity = None
    if has_heldout:
        r2 = r2_scores(heldout, A, b)
        scores.setdefault(lam, _mean(r2))
        if A.shape[1] == A.shape[2]:
            r2_identity = tuple((1.0 - identity_errors(heldout) / total_variance(heldout)).tolist())
    if r2 is not None and any(math.isnan(v) for v in r2):
        raise CalibrationError(f"split {train.split}: held-out scores are NaN (held-out states are constant?)")
    return SplitFit(train.split, float(lam), alpha, A, b, r2, r2_identity, dict(sorted(scores.items())), chosen)
