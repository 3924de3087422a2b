from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scipy import stats

from sgl_ridgefill.eval.stats import (
    Interval,
    bootstrap_mean,
    mcnemar,
    paired_bootstrap,
    sign_test,
    stratified_paired_bootstrap,
)

B = 2000  # resamples in tests (the default stays 5000)


def _pair(n: int = 80, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    b = rng.exponential(size=n)
    return b + 0.3 + rng.normal(scale=0.5, size=n), b


def _scipy_diff(a, b, f, seed):
    res = stats.bootstrap((a, b), lambda x, y, axis=-1: f(x, axis=axis) - f(y, axis=axis), paired=True,
                          vectorized=True, n_resamples=B, method="BCa", rng=np.random.default_rng(seed))
    return res.confidence_interval


# --- paired_bootstrap / bootstrap_mean -------------------------------------------------------------------

def test_paired_bootstrap_is_deterministic_given_seed():
    a, b = _pair()
    assert paired_bootstrap(a, b, n_resamples=B, seed=3) == paired_bootstrap(a, b, n_resamples=B, seed=3)
    assert paired_bootstrap(a, b, n_resamples=B, seed=3) != paired_bootstrap(a, b, n_resamples=B, seed=4)


@pytest.mark.parametrize("statistic, f", [("mean", np.mean), ("median", np.median)])
def test_paired_bootstrap_matches_scipy_and_contains_estimate(statistic, f):
    a, b = _pair()
    iv = paired_bootstrap(a, b, statistic=statistic, n_resamples=B, seed=5)
    assert iv.method == "bca" and iv.n == 80
    assert iv.estimate == pytest.approx(f(a) - f(b))
    assert iv.low < iv.estimate < iv.high
    ref = _scipy_diff(a, b, f, seed=5)
    assert (iv.low, iv.high) == pytest.approx((ref.low, ref.high), rel=1e-12)


def test_constant_difference_gives_point_interval():
    b = np.random.default_rng(0).normal(size=30)
    for statistic in ("mean", "median"):
        iv = paired_bootstrap(b + 1.0, b, statistic=statistic)
        assert iv.method == "constant"
        assert (iv.estimate, iv.low, iv.high) == pytest.approx((1.0, 1.0, 1.0), abs=1e-12)
    iv = paired_bootstrap([2, 3, 4], [1, 2, 3])
    assert (iv.estimate, iv.low, iv.high) == (1.0, 1.0, 1.0)


def test_nan_pairs_are_dropped():
    a, b = _pair(40)
    a_nan, b_nan = a.copy(), b.copy()
    a_nan[[3, 7]] = np.nan
    b_nan[11] = np.nan
    keep = np.ones(40, bool)
    keep[[3, 7, 11]] = False
    iv = paired_bootstrap(a_nan, b_nan, n_resamples=B)
    assert iv.n == 37
    assert iv == paired_bootstrap(a[keep], b[keep], n_resamples=B)


def test_too_few_units_give_nan_bounds():
    iv = paired_bootstrap([1.0, np.nan], [0.5, 2.0])
    assert (iv.estimate, iv.n, iv.method) == (0.5, 1, "undefined")
    assert math.isnan(iv.low) and math.isnan(iv.high)
    empty = paired_bootstrap([], [])
    assert empty.n == 0 and math.isnan(empty.estimate)
    assert json.dumps(iv.to_json(), allow_nan=False) == (
        '{"estimate": 0.5, "low": null, "high": null, "n": 1, "method": "undefined"}'
    )


def test_degenerate_bca_falls_back_to_percentile():
    # Every leave-one-out median is 0: the BCa acceleration is 0/0 and scipy returns NaN bounds.
    a = np.array([0, 0, 0, 0, 0, 0, 0, 0, 1, 1.0])
    iv = paired_bootstrap(a, np.zeros(10), statistic="median", n_resamples=B)
    assert iv.method == "percentile"
    assert iv.low <= iv.estimate <= iv.high and math.isfinite(iv.high)


def test_bootstrap_mean_matches_scipy():
    x = np.random.default_rng(2).exponential(size=60)
    iv = bootstrap_mean(np.append(x, np.nan), n_resamples=B, seed=1)
    ref = stats.bootstrap((x,), np.mean, n_resamples=B, method="BCa", rng=np.random.default_rng(1))
    assert iv.n == 60 and iv.estimate == pytest.approx(x.mean())
    assert (iv.low, iv.high) == pytest.approx(tuple(ref.confidence_interval), rel=1e-12)
    assert bootstrap_mean([0.25] * 5) == Interval(0.25, 0.25, 0.25, 5, "constant")


def test_argument_errors():
    with pytest.raises(ValueError, match="statistic must be one of \\['mean', 'median'\\], got 'mode'"):
        paired_bootstrap([1, 2], [1, 2], statistic="mode")
    with pytest.raises(ValueError, match="confidence must lie strictly between 0 and 1, got 95"):
        bootstrap_mean([1, 2], confidence=95)
    with pytest.raises(ValueError, match="n_resamples must be a positive integer, got 0"):
        paired_bootstrap([1, 2], [1, 2], n_resamples=0)
    with pytest.raises(ValueError, match="paired samples differ in length: a has 2, b has 3"):
        paired_bootstrap([1, 2], [1, 2, 3])
    with pytest.raises(ValueError, match="strata must be 1-D with one label per unit"):
        stratified_paired_bootstrap([1, 2], [1, 2], ["x"])


# --- stratified ------------------------------------------------------------------------------------------

def test_stratified_with_one_stratum_is_close_to_scipy_bca():
    a, b = _pair(120, seed=7)
    ours = stratified_paired_bootstrap(a, b, ["task"] * 120, n_resamples=B, seed=2)
    ref = _scipy_diff(a, b, np.mean, seed=9)  # another seed: agreement is statistical, not by construction
    width = ref.high - ref.low
    assert ours.method == "bca" and ours.n == 120
    assert ours.estimate == pytest.approx(np.mean(a - b))
    assert abs(ours.low - ref.low) < 0.1 * width and abs(ours.high - ref.high) < 0.1 * width


def test_stratified_is_deterministic_and_handles_degenerate_input():
    a, b = _pair(30)
    strata = np.repeat(["a", "b", "c"], 10)
    first = stratified_paired_bootstrap(a, b, strata, n_resamples=B, seed=1)
    assert first == stratified_paired_bootstrap(a, b, strata, n_resamples=B, seed=1)
    assert first.low < first.estimate < first.high
    iv = stratified_paired_bootstrap([3, 4, 5, np.nan], [2, 3, 4, 0], [0, 0, 1, 1])
    assert (iv.estimate, iv.low, iv.high, iv.n) == (1.0, 1.0, 1.0, 3)
    assert stratified_paired_bootstrap([1, np.nan], [0, 0], [0, 1]).method == "undefined"


def test_stratified_removes_between_task_variance():
    # Each task has a different mean difference, fixed by design: resampling within task keeps the mix,
    # so the interval must be narrower than the pooled one.
    rng = np.random.default_rng(4)
    strata = np.repeat(np.arange(4), 25)
    d = np.array([-2.0, 0.0, 2.0, 4.0])[strata] + rng.normal(scale=0.3, size=100)
    b = rng.normal(size=100)
    pooled = paired_bootstrap(b + d, b, n_resamples=B)
    strat = stratified_paired_bootstrap(b + d, b, strata, n_resamples=B)
    assert strat.estimate == pytest.approx(pooled.estimate)
    assert strat.high - strat.low < 0.5 * (pooled.high - pooled.low)


def test_stratified_coverage_is_sane():
    rng = np.random.default_rng(11)
    strata = np.repeat(np.arange(3), 20)
    shift = np.array([0.0, 1.0, -0.5])[strata]
    true_mean = shift.mean() + 1.0  # skewed noise: exponential with mean 1
    hits = 0
    for trial in range(150):
        d = shift + rng.exponential(size=60)
        iv = stratified_paired_bootstrap(d, np.zeros(60), strata, n_resamples=1000, seed=trial)
        hits += iv.low <= true_mean <= iv.high
    assert 0.88 <= hits / 150 <= 0.99


# --- McNemar and sign test -------------------------------------------------------------------------------

def test_mcnemar_counts_and_exact_p_value():
    a = [1, 1, 1, 1, 1, 1, 0, 0, 1, 0]
    b = [0, 0, 0, 0, 0, 1, 1, 0, 1, 0]
    r = mcnemar(a, b)
    assert (r["n"], r["b01"], r["b10"]) == (10, 1, 5)
    assert (r["a_rate"], r["b_rate"]) == (0.7, 0.3)
    assert r["p_value"] == pytest.approx(stats.binomtest(5, 6, 0.5).pvalue)
    assert r["p_value"] == pytest.approx(14 / 64)  # 2 * P(X >= 5), X ~ Bin(6, 1/2)


def test_mcnemar_no_discordant_pairs_nan_and_bool_input():
    assert mcnemar([True, False], [True, False])["p_value"] == 1.0
    r = mcnemar(np.array([1.0, np.nan, 0.0]), np.array([0.0, 1.0, 0.0]))
    assert (r["n"], r["b01"], r["b10"]) == (2, 0, 1) and r["p_value"] == 1.0
    with pytest.raises(ValueError, match="a_success must hold 0/1 \\(or bool\\) outcomes, found 0.5"):
        mcnemar([1, 0.5], [1, 1])


def test_sign_test_drops_ties_and_nan():
    a = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, np.nan, 8.0, 9.0]
    b = [0.0, 1.0, 2.0, 4.0, 4.0, 5.0, 1.0, 7.0, 10.0]
    r = sign_test(a, b)
    assert (r["n"], r["n_ties"], r["n_pos"], r["n_neg"]) == (7, 1, 6, 1)
    assert r["p_value"] == pytest.approx(stats.binomtest(6, 7, 0.5).pvalue)
    assert r["p_value"] == pytest.approx(16 / 128)
    assert sign_test([1, 2], [1, 2]) == {"n": 0, "n_ties": 2, "n_pos": 0, "n_neg": 0, "p_value": 1.0}


def test_a_stratum_of_one_unit_pools_the_strata():
    # A lone unit would be drawn in every replicate and carry no variance: the strata are pooled instead.
    a, b = _pair(9, seed=3)
    lone = stratified_paired_bootstrap(a, b, ["x"] * 8 + ["y"], n_resamples=B, seed=1)
    pooled = stratified_paired_bootstrap(a, b, ["x"] * 9, n_resamples=B, seed=1)
    assert lone.method == "bca-pooled" and pooled.method == "bca"
    assert (lone.low, lone.high) == (pooled.low, pooled.high)
    # A NaN pair that leaves a stratum with one unit counts too.
    a[4] = np.nan
    assert stratified_paired_bootstrap(a, b, ["x"] * 4 + ["y"] * 2 + ["x"] * 3, n_resamples=B).method == "bca-pooled"
    assert stratified_paired_bootstrap(a, b, ["x"] * 3 + ["y"] * 3 + ["x"] * 3, n_resamples=B).method == "bca"
