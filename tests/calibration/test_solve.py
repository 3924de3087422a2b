from __future__ import annotations

import numpy as np
import pytest
import torch

from sgl_ridgefill.calibration import CalibrationError, SplitStats, fit_split, ridge_maps
from sgl_ridgefill.calibration.solve import identity_errors, r2_scores, squared_errors, total_variance

D = 12


def _data(n: int, seed: int):
    """States with a large mean (like a residual stream) and a noisy linear relation between layers."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, D)) * rng.uniform(0.5, 3.0, size=D) + 100.0
    w = np.random.default_rng(99).normal(size=(2, D, D)) * 0.3
    ys = [x @ w[i] + rng.normal(size=(n, D)) * 0.5 + 7.0 * (i + 1) for i in range(2)]
    return x, ys


def _stats_layers(x, ys, chunk=None):
    """Split 1 of a 3-layer model (residual kind): layer 1's input is x itself, layer 2's is the target ys[0];
    identity fill predicts x for both."""
    stats = SplitStats.zeros(1, 3, D)
    n = x.shape[0]
    step = chunk or n
    for start in range(0, n, step):
        sl = slice(start, start + step)
        xs, y = torch.from_numpy(x[sl]), torch.from_numpy(ys[0][sl])
        stats.add(xs, [(xs, xs), (y, xs)])
    return stats


def _direct_ridge(x, y, lam):
    mx, my = x.mean(0), y.mean(0)
    xc, yc = x - mx, y - my
    alpha = lam * np.trace(xc.T @ xc) / x.shape[1]
    aug_x = np.vstack([xc, np.sqrt(alpha) * np.eye(x.shape[1])])
    aug_y = np.vstack([yc, np.zeros((x.shape[1], y.shape[1]))])
    wt, *_ = np.linalg.lstsq(aug_x, aug_y, rcond=None)
    a = wt.T
    return a, my - a @ mx, alpha


def test_chunked_accumulation_matches_one_shot():
    x, ys = _data(300, 0)
    one = _stats_layers(x, ys)
    many = _stats_layers(x, ys, chunk=37)
    for name in ("count", "sum_x", "sum_y", "xtx", "xty", "yy", "py", "pp"):
        assert torch.allclose(getattr(one, name), getattr(many, name), rtol=1e-12, atol=1e-9), name
    assert one.rows == 300


@pytest.mark.parametrize("lam", [1e-4, 0.03, 1.0])
def test_ridge_matches_lstsq_on_the_augmented_system(lam):
    x, ys = _data(400, 1)
    stats = _stats_layers(x, ys, chunk=50)
    A, b, alpha = ridge_maps(stats, lam)
    a_ref, b_ref, alpha_ref = _direct_ridge(x, ys[0], lam)
    assert alpha == pytest.approx(alpha_ref, rel=1e-10)
    assert A.shape == (2, D, D) and b.shape == (2, D)
    np.testing.assert_allclose(A[1].numpy(), a_ref, rtol=1e-7, atol=1e-9)
    np.testing.assert_allclose(b[1].numpy(), b_ref, rtol=1e-7, atol=1e-7)


def test_heldout_errors_from_statistics_match_direct_errors():
    x, ys = _data(400, 2)
    xh, yh = _data(150, 3)
    train, heldout = _stats_layers(x, ys), _stats_layers(xh, yh, chunk=40)
    A, b, _ = ridge_maps(train, 0.01)
    y_pairs = [xh, yh[0]]  # layer 1's input is x itself; layer 2's is ys[0]
    direct = [((y - (xh @ A[i].numpy().T + b[i].numpy())) ** 2).sum() for i, y in enumerate(y_pairs)]
    np.testing.assert_allclose(squared_errors(heldout, A, b).numpy(), direct, rtol=1e-6)
    direct_identity = [((y - xh) ** 2).sum() for y in y_pairs]
    np.testing.assert_allclose(identity_errors(heldout).numpy(), direct_identity, rtol=1e-8, atol=1e-6)
    direct_tv = [((y - y.mean(0)) ** 2).sum() for y in y_pairs]
    np.testing.assert_allclose(total_variance(heldout).numpy(), direct_tv, rtol=1e-8)
    r2 = r2_scores(heldout, A, b)
    assert r2[1] == pytest.approx(1 - direct[1] / direct_tv[1], rel=1e-6)


def test_lambda_is_chosen_by_heldout_r2_and_split_layer_is_exact():
    x, ys = _data(60, 4)  # few rows: the penalty matters
    xh, yh = _data(200, 5)
    train, heldout = _stats_layers(x, ys), _stats_layers(xh, yh)
    grid = (1e-4, 1e-2, 1.0)
    fit = fit_split(train, heldout, None, grid)
    expected = {}
    for lam in grid:
        a, b, _ = _direct_ridge(x, ys[0], lam)
        pred = xh @ a.T + b
        expected[lam] = 1 - ((yh[0] - pred) ** 2).sum() / ((yh[0] - yh[0].mean(0)) ** 2).sum()
    best = max(expected, key=expected.get)
    assert fit.lam == best
    assert fit.lam_chosen_on_heldout
    assert fit.grid[best] == pytest.approx((1.0 + expected[best]) / 2, rel=1e-6)
    # The split layer (its input is x_S itself) maps exactly.
    assert torch.equal(fit.A[0], torch.eye(D, dtype=torch.float64))
    assert torch.equal(fit.b[0], torch.zeros(D, dtype=torch.float64))
    assert fit.r2[0] == pytest.approx(1.0, abs=1e-9)
    assert fit.r2_identity[0] == pytest.approx(1.0, abs=1e-9)
    assert fit.r2[1] == pytest.approx(expected[best], rel=1e-6)
    assert fit.r2_identity[1] < fit.r2[1]


def test_given_lambda_without_heldout():
    x, ys = _data(100, 6)
    fit = fit_split(_stats_layers(x, ys), None, 0.1)
    assert fit.lam == 0.1 and fit.r2 is None and not fit.lam_chosen_on_heldout
    with pytest.raises(CalibrationError, match="choosing lambda needs held-out rows"):
        fit_split(_stats_layers(x, ys), None, None)


def test_degenerate_statistics_are_refused():
    stats = SplitStats.zeros(1, 3, D)
    zeros = torch.zeros(10, D, dtype=torch.float64)
    stats.add(zeros, [(zeros, zeros), (zeros, zeros)])
    with pytest.raises(CalibrationError) as info:
        ridge_maps(stats, 0.03)
    assert str(info.value) == (
        "split 1: X^T X + alpha I is not positive definite at lambda 0.03 (alpha 0); "
        "the calibration rows are degenerate (too few rows, or constant states)"
    )
    with pytest.raises(CalibrationError, match="lambda must be positive"):
        ridge_maps(stats, 0.0)
