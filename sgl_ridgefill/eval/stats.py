"""Paired statistics for comparing arms on the same units: BCa bootstrap intervals, McNemar, sign test.

A unit is whatever both arms were measured on (a document, a needle sample); ``a[i]`` and ``b[i]`` always
come from the same unit. Intervals follow the spec: BCa, 5,000 resamples, resampled within task when the
units are stratified. Pairs with a NaN on either side are dropped everywhere.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import special, stats

ArrayLike = Sequence[float] | np.ndarray
# Upper bound on resample-matrix elements per scipy batch (n_resamples x units), to bound memory.
_BATCH_ELEMENTS = 4_000_000


@dataclass(frozen=True)
class Interval:
    """A point estimate with a two-sided confidence interval; ``n`` units after dropping NaN pairs.

    method: "bca", "bca-pooled" (strata pooled: one had a single unit), "percentile" (BCa fell back:
    degenerate bootstrap distribution), "constant" (every difference equal: the interval is the point) or
    "undefined" (fewer than 2 units: NaN bounds).
    """

    estimate: float
    low: float
    high: float
    n: int
    method: str

    def to_json(self) -> dict:
        """JSON-safe dict; NaN becomes None."""
        def clean(x: float) -> float | None:
            return None if math.isnan(x) else float(x)

        return {"estimate": clean(self.estimate), "low": clean(self.low), "high": clean(self.high),
                "n": int(self.n), "method": self.method}


_STATISTICS: dict[str, Callable[..., np.ndarray]] = {"mean": np.mean, "median": np.median}


def _check_common(n_resamples: int, confidence: float) -> None:
    if int(n_resamples) != n_resamples or n_resamples < 1:
        raise ValueError(f"n_resamples must be a positive integer, got {n_resamples!r}")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must lie strictly between 0 and 1, got {confidence!r}")


def _as_1d(x: ArrayLike, name: str) -> np.ndarray:
    a = np.asarray(x, dtype=np.float64)
    if a.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {a.shape}")
    return a


def _paired(a: ArrayLike, b: ArrayLike) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Validate two paired samples; return (a, b, keep) with NaN pairs dropped and the [n] keep mask."""
    a, b = _as_1d(a, "a"), _as_1d(b, "b")
    if a.shape != b.shape:
        raise ValueError(f"paired samples differ in length: a has {a.size}, b has {b.size}")
    keep = ~(np.isnan(a) | np.isnan(b))
    return a[keep], b[keep], keep


def _is_constant(d: np.ndarray) -> bool:
    # Relative tolerance: a = b + 1 in floats leaves rounding noise in a - b.
    return bool(np.ptp(d) <= 1e-12 * max(1.0, float(np.abs(d).max())))


def _scipy_bca(data: tuple[np.ndarray, ...], statistic: Callable[..., np.ndarray], estimate: float,
               *, paired: bool, n_resamples: int, confidence: float, seed: int) -> Interval:
    n = data[0].size
    with warnings.catch_warnings():
        # Degenerate bootstrap distributions give NaN bounds with a warning; fall back below instead.
        warnings.simplefilter("ignore", stats.DegenerateDataWarning)
        warnings.simplefilter("ignore", RuntimeWarning)
        res = stats.bootstrap(data, statistic, n_resamples=n_resamples, confidence_level=confidence,
                              method="BCa", paired=paired, vectorized=True,
                              batch=max(1, _BATCH_ELEMENTS // n), rng=np.random.default_rng(seed))
    low, high = float(res.confidence_interval.low), float(res.confidence_interval.high)
    if math.isfinite(low) and math.isfinite(high):
        return Interval(estimate, low, high, n, "bca")
    return _percentile(res.bootstrap_distribution, estimate, n, confidence)


def _percentile(replicates: np.ndarray, estimate: float, n: int, confidence: float) -> Interval:
    alpha = (1.0 - confidence) / 2.0
    low, high = np.quantile(replicates, [alpha, 1.0 - alpha])
    return Interval(estimate, float(low), float(high), n, "percentile")


def paired_bootstrap(a: ArrayLike, b: ArrayLike, *, statistic: str = "mean", n_resamples: int = 5000,
                     confidence: float = 0.95, seed: int = 0) -> Interval:
    """BCa interval of ``statistic(a) - statistic(b)``, resampling paired units together.

    a, b: [n] per-unit values of the two arms. statistic: "mean" or "median" (the median of each arm,
    then the difference). Uses ``scipy.stats.bootstrap(paired=True, method="BCa")``.
    """
    if statistic not in _STATISTICS:
        raise ValueError(f"statistic must be one of {sorted(_STATISTICS)}, got {statistic!r}")
    _check_common(n_resamples, confidence)
    a, b, _ = _paired(a, b)
    f = _STATISTICS[statistic]
    n = a.size
    if n == 0:
        return Interval(math.nan, math.nan, math.nan, 0, "undefined")
    estimate = float(f(a) - f(b))
    if n < 2:
        return Interval(estimate, math.nan, math.nan, n, "undefined")
    if _is_constant(a - b):
        return Interval(estimate, estimate, estimate, n, "constant")

    def diff(x: np.ndarray, y: np.ndarray, axis: int = -1) -> np.ndarray:
        return f(x, axis=axis) - f(y, axis=axis)

    return _scipy_bca((a, b), diff, estimate, paired=True, n_resamples=n_resamples,
                      confidence=confidence, seed=seed)


def bootstrap_mean(a: ArrayLike, *, n_resamples: int = 5000, confidence: float = 0.95,
                   seed: int = 0) -> Interval:
    """One-sample BCa interval for the mean of ``a`` ([n], NaN dropped), e.g. an arm's score."""
    _check_common(n_resamples, confidence)
    a = _as_1d(a, "a")
    a = a[~np.isnan(a)]
    n = a.size
    if n == 0:
        return Interval(math.nan, math.nan, math.nan, 0, "undefined")
    estimate = float(a.mean())
    if n < 2:
        return Interval(estimate, math.nan, math.nan, n, "undefined")
    if _is_constant(a):
        return Interval(estimate, estimate, estimate, n, "constant")
    return _scipy_bca((a,), np.mean, estimate, paired=False, n_resamples=n_resamples,
                      confidence=confidence, seed=seed)


def stratified_paired_bootstrap(a: ArrayLike, b: ArrayLike, strata: Sequence[object] | np.ndarray, *,
                                n_resamples: int = 5000, confidence: float = 0.95, seed: int = 0) -> Interval:
    """BCa interval of mean(a - b) over all units, resampling units within each stratum (task).

    a, b: [n] paired values; strata: [n] labels (task or domain). Each replicate draws every stratum's
    units with replacement, keeping its size, so the task mix is fixed as in the evaluation design.
    Bias correction comes from the replicate distribution, acceleration from the leave-one-out
    jackknife over all units (Efron & Tibshirani 14.3, as scipy does for one sample).

    A stratum with a single unit would add no resampling variance at all (every replicate draws that unit),
    which makes the interval too narrow; when any stratum has fewer than two units (after dropping NaN
    pairs) the units are pooled into one stratum and ``method`` says "bca-pooled".
    """
    _check_common(n_resamples, confidence)
    labels = np.asarray(strata)
    if labels.ndim != 1 or labels.shape[0] != np.asarray(a).shape[0]:
        raise ValueError(f"strata must be 1-D with one label per unit, got shape {labels.shape} "
                         f"for {np.asarray(a).shape[0]} units")
    a, b, keep = _paired(a, b)
    d, labels = a - b, labels[keep]
    n = d.size
    if n == 0:
        return Interval(math.nan, math.nan, math.nan, 0, "undefined")
    estimate = float(d.mean())
    if n < 2:
        return Interval(estimate, math.nan, math.nan, n, "undefined")
    if _is_constant(d):
        return Interval(estimate, estimate, estimate, n, "constant")

    rng = np.random.default_rng(seed)
    totals = np.zeros(n_resamples)  # [B] replicate sums of d
    _, group, counts = np.unique(labels, return_inverse=True, return_counts=True)
    pooled = len(counts) > 1 and counts.min() < 2
    if pooled:
        group = np.zeros_like(group)
    for g in range(group.max() + 1):
        d_g = d[group.ravel() == g]
        rows = max(1, _BATCH_ELEMENTS // d_g.size)
        for lo in range(0, n_resamples, rows):
            hi = min(n_resamples, lo + rows)
            totals[lo:hi] += d_g[rng.integers(0, d_g.size, size=(hi - lo, d_g.size))].sum(axis=1)
    replicates = totals / n

    # Mid-rank percentile of the estimate among the replicates, as scipy does.
    z0 = special.ndtri((np.count_nonzero(replicates < estimate)
                        + np.count_nonzero(replicates <= estimate)) / (2.0 * n_resamples))
    loo = (d.sum() - d) / (n - 1)  # [n] jackknife means
    u = loo.mean() - loo
    den = (u**2).sum() ** 1.5
    # Jackknife means all equal only for constant d (handled above); guard anyway: no skew, no acceleration.
    accel = (u**3).sum() / (6.0 * den) if den > 0 else 0.0
    z = special.ndtri((1.0 - confidence) / 2.0)
    levels = [special.ndtr(z0 + (z0 + zz) / (1.0 - accel * (z0 + zz))) for zz in (z, -z)]
    if not all(0.0 <= x <= 1.0 for x in levels):
        return _percentile(replicates, estimate, n, confidence)
    low, high = np.quantile(replicates, levels)
    return Interval(estimate, float(low), float(high), n, "bca-pooled" if pooled else "bca")


def _binary(x: ArrayLike, name: str) -> np.ndarray:
    v = _as_1d(x, name)
    ok = np.isnan(v) | (v == 0) | (v == 1)
    if not ok.all():
        raise ValueError(f"{name} must hold 0/1 (or bool) outcomes, found {float(v[~ok][0])}")
    return v


def mcnemar(a_success: ArrayLike, b_success: ArrayLike) -> dict:
    """Exact McNemar test on paired binary outcomes ([n] bool or 0/1; NaN pairs dropped).

    Returns n, a_rate, b_rate, b01 (a failed, b succeeded), b10 (a succeeded, b failed) and the two-sided
    exact p-value of ``binomtest(b10, b01 + b10, 0.5)`` (1.0 when no pair is discordant).
    """
    a, b, _ = _paired(_binary(a_success, "a_success"), _binary(b_success, "b_success"))
    b01 = int(np.count_nonzero((a == 0) & (b == 1)))
    b10 = int(np.count_nonzero((a == 1) & (b == 0)))
    p = stats.binomtest(b10, b01 + b10, 0.5).pvalue if b01 + b10 else 1.0
    return {"n": int(a.size), "a_rate": float(a.mean()) if a.size else math.nan,
            "b_rate": float(b.mean()) if b.size else math.nan, "b01": b01, "b10": b10, "p_value": float(p)}


def sign_test(a: ArrayLike, b: ArrayLike) -> dict:
    """Paired sign test on continuous outcomes ([n]; NaN pairs and ties dropped), two-sided binomtest.

    Returns n (pairs used), n_ties, n_pos (a > b), n_neg (a < b) and p_value (1.0 when nothing is left).
    """
    a, b, _ = _paired(a, b)
    n_pos = int(np.count_nonzero(a > b))
    n_neg = int(np.count_nonzero(a < b))
    p = stats.binomtest(n_pos, n_pos + n_neg, 0.5).pvalue if n_pos + n_neg else 1.0
    return {"n": n_pos + n_neg, "n_ties": int(a.size) - n_pos - n_neg, "n_pos": n_pos, "n_neg": n_neg,
            "p_value": float(p)}


def json_number(x: object) -> float | None:
    """A JSON-safe float: ``None`` for missing, NaN or infinite values."""
    if x is None:
        return None
    x = float(x)  # type: ignore[arg-type]
    return x if math.isfinite(x) else None


def interval_fields(interval: Interval, name: str) -> dict[str, float | None]:
    """``{name: estimate, "low": ..., "high": ...}`` of ``interval``, JSON-safe."""
    return {name: json_number(interval.estimate), "low": json_number(interval.low), "high": json_number(interval.high)}
