from __future__ import annotations

import json
import math
import time

import numpy as np
import pytest

from sgl_ridgefill.eval.metrics import (
    TokenScores,
    key_token_mask,
    kl_topk,
    mean_loss,
    new_token_mask,
    top1_agreement,
)


def _scores(logprobs, token_ids=None, start=0, top_ids=None, top_logprobs=None) -> TokenScores:
    lp = np.asarray(logprobs, dtype=np.float64)
    n = lp.size
    ids = np.arange(n, dtype=np.int64) if token_ids is None else np.asarray(token_ids, dtype=np.int64)
    if top_ids is None:
        top_ids, top_logprobs = np.full((n, 0), -1, np.int64), np.full((n, 0), -np.inf)
    return TokenScores(start, ids, lp, np.asarray(top_ids, np.int64), np.asarray(top_logprobs, np.float64))


def _from_dist(logp: np.ndarray, k: int) -> TokenScores:
    """Top-k lists of full log-distributions logp: [n, V], listed in random (not sorted) order."""
    n = logp.shape[0]
    order = np.argsort(-logp, axis=1)[:, :k]
    order = np.random.default_rng(1).permuted(order, axis=1)
    return TokenScores(0, np.zeros(n, np.int64), np.zeros(n), order.astype(np.int64),
                       np.take_along_axis(logp, order, axis=1))


def _log_softmax(x: np.ndarray) -> np.ndarray:
    return x - np.logaddexp.reduce(x, axis=1, keepdims=True)


# --- TokenScores -----------------------------------------------------------------------------------------

META = {
    "input_token_logprobs": [[None, 11, None], [-0.5, 12, None], [-2.25, 13, "x"]],
    "input_top_logprobs": [
        None,
        [[-0.1, 7, None], [-3.0, 12, None], [-4.0, 9, None]],
        [[-0.2, 13, None]],
    ],
}


def test_from_meta_info_parses_sglang_layout():
    s = TokenScores.from_meta_info(META, start=0)
    assert len(s) == 3 and s.k == 3 and s.start == 0
    assert s.token_ids.tolist() == [11, 12, 13]
    assert math.isnan(s.logprobs[0]) and s.logprobs[1:].tolist() == [-0.5, -2.25]
    assert s.top_ids.tolist() == [[-1, -1, -1], [7, 12, 9], [13, -1, -1]]
    assert s.top_logprobs[1].tolist() == [-0.1, -3.0, -4.0]
    assert np.isneginf(s.top_logprobs[0]).all() and np.isneginf(s.top_logprobs[2, 1:]).all()
    assert s.positions.tolist() == [0, 1, 2]
    assert s.token_ids.dtype == np.int64 and s.top_logprobs.dtype == np.float64


def test_from_meta_info_without_top_lists_and_with_offset():
    s = TokenScores.from_meta_info({"input_token_logprobs": [[-1.0, 5, None]]}, start=40)
    assert s.k == 0 and s.top_ids.shape == (1, 0) and s.positions.tolist() == [40]


def test_from_meta_info_errors():
    with pytest.raises(ValueError, match="no 'input_token_logprobs'; request with return_logprob=True"):
        TokenScores.from_meta_info({"prompt_tokens": 3}, start=0)
    bad = {"input_token_logprobs": META["input_token_logprobs"], "input_top_logprobs": [None]}
    with pytest.raises(ValueError, match="1 'input_top_logprobs' entries but 3 'input_token_logprobs'"):
        TokenScores.from_meta_info(bad, start=0)
    with pytest.raises(ValueError, match="start must be a non-negative integer, got -1"):
        _scores([0.0], start=-1)
    with pytest.raises(ValueError, match=r"logprobs has shape \(2,\), expected \(3,\)"):
        TokenScores(0, np.zeros(3, np.int64), np.zeros(2), np.zeros((3, 1), np.int64), np.zeros((3, 1)))


def test_json_round_trip_is_exact_and_strict_json():
    s = TokenScores.from_meta_info(META, start=7)
    text = json.dumps(s.to_json(), allow_nan=False)
    back = TokenScores.from_json(json.loads(text))
    assert back.start == 7
    for name in ("token_ids", "logprobs", "top_ids", "top_logprobs"):
        x, y = getattr(s, name), getattr(back, name)
        assert x.dtype == y.dtype and x.shape == y.shape
        assert x.tobytes() == y.tobytes()  # bit-exact, NaN and -inf included


def test_json_round_trip_random_values_bit_exact():
    rng = np.random.default_rng(0)
    n, k = 50, 5
    s = TokenScores(3, rng.integers(0, 2**40, n), rng.normal(size=n), rng.integers(-1, 10**6, (n, k)),
                    rng.normal(size=(n, k)) * 1e-300)
    back = TokenScores.from_json(s.to_json())
    assert all(getattr(s, a).tobytes() == getattr(back, a).tobytes()
               for a in ("token_ids", "logprobs", "top_ids", "top_logprobs"))


def test_from_json_rejects_unknown_format():
    d = TokenScores.from_meta_info(META, start=0).to_json()
    d["format"] = "other"
    with pytest.raises(ValueError, match="format is 'other'"):
        TokenScores.from_json(d)


# --- key and new tokens ----------------------------------------------------------------------------------

def test_key_token_mask_threshold_is_strict_and_nan_is_not_key():
    exact = _scores([-0.1, -0.5, -1.0, np.nan, -0.2], token_ids=[1, 2, 3, 4, 5], start=9000)
    cut = _scores([-2.2, -2.5, -3.5, -9.0, np.nan], token_ids=[1, 2, 3, 4, 5], start=100)
    # rises: 2.1, 2.0 (not > 2), 2.5, NaN, NaN
    assert key_token_mask(exact, cut).tolist() == [True, False, True, False, False]
    assert key_token_mask(exact, cut, threshold=2.4).tolist() == [False, False, True, False, False]


def test_key_token_mask_rejects_misaligned_arms():
    with pytest.raises(ValueError, match=r"token ids differ at offset 1 \(2 vs 9\)"):
        key_token_mask(_scores([0, 0], [1, 2]), _scores([0, 0], [1, 9]))
    with pytest.raises(ValueError, match="arms score 2 and 3 tokens"):
        key_token_mask(_scores([0, 0]), _scores([0, 0, 0]))


def _new_mask_reference(ids: list[int], start: int, span: int) -> list[bool]:
    n = len(ids)
    copied = [False] * n
    for j in range(n - span + 1):
        w = ids[j:j + span]
        if any(ids[i:i + span] == w for i in range(j)):
            for p in range(j, j + span):
                copied[p] = True
    return [not c for c in copied[start:]]


def test_new_token_mask_hand_example():
    ids = [1, 2, 3, 9, 1, 2, 3, 8]
    # window (1,2,3) at 4 repeats the one at 0: positions 4..6 are copied
    assert new_token_mask(ids, 0, span=3).tolist() == [True] * 4 + [False] * 3 + [True]
    assert new_token_mask(ids, 5, span=3).tolist() == [False, False, True]
    assert new_token_mask(ids, 0, span=4).tolist() == [True] * 8


def test_new_token_mask_matches_brute_force():
    rng = np.random.default_rng(0)
    for trial in range(30):
        n = int(rng.integers(1, 60))
        ids = rng.integers(0, 3, n).tolist()  # small alphabet: many repeats, overlapping and self-overlapping
        span = int(rng.integers(1, 6))
        start = int(rng.integers(0, n + 1))
        assert new_token_mask(ids, start, span).tolist() == _new_mask_reference(ids, start, span), trial


def test_new_token_mask_short_prompt_and_errors():
    assert new_token_mask([5, 5, 5], 1, span=8).tolist() == [True, True]
    assert new_token_mask([], 0).shape == (0,)
    with pytest.raises(ValueError, match="span must be >= 1, got 0"):
        new_token_mask([1, 2], 0, span=0)
    with pytest.raises(ValueError, match="start=3 is outside the prompt of 2 tokens"):
        new_token_mask([1, 2], 3)


def test_new_token_mask_is_fast_at_16k():
    ids = np.random.default_rng(0).integers(0, 50_000, 16_384)
    ids[9000:9500] = ids[200:700]
    t0 = time.perf_counter()
    mask = new_token_mask(ids, 4096)
    assert time.perf_counter() - t0 < 0.5
    copied = np.flatnonzero(~mask) + 4096
    assert copied.tolist() == list(range(9000, 9500))


# --- loss and agreement ----------------------------------------------------------------------------------

def test_mean_loss_masks_and_skips_nan():
    s = _scores([np.nan, -1.0, -2.0, -4.0])
    assert mean_loss(s) == pytest.approx(7.0 / 3.0)
    assert mean_loss(s, np.array([True, True, False, True])) == pytest.approx(2.5)
    assert math.isnan(mean_loss(s, np.array([True, False, False, False])))
    assert math.isnan(mean_loss(s, np.zeros(4, bool)))
    with pytest.raises(ValueError, match=r"mask has shape \(3,\), scores have \(4,\)"):
        mean_loss(s, np.ones(3, bool))


def test_top1_agreement_uses_argmax_not_list_order():
    ids = [0, 0, 0]
    exact = _scores([0, 0, 0], ids, top_ids=[[5, 6], [5, 6], [-1, -1]],
                    top_logprobs=[[-0.1, -2.0], [-2.0, -0.1], [-np.inf, -np.inf]])
    arm = _scores([0, 0, 0], ids, top_ids=[[6, 5], [6, 5], [6, 5]],
                  top_logprobs=[[-3.0, -0.2], [-3.0, -0.2], [-0.1, -3.0]])
    assert top1_agreement(exact, arm).tolist() == [True, False, False]


# --- KL --------------------------------------------------------------------------------------------------

def test_kl_topk_identical_is_zero():
    rng = np.random.default_rng(0)
    lp = _log_softmax(rng.normal(size=(16, 300)) * 3)
    for k in (20, 300):
        kl = kl_topk(_from_dist(lp, k), _from_dist(lp, k))
        assert kl.shape == (16,) and np.all(kl >= 0) and np.all(kl < 1e-9)


def test_kl_topk_full_vocabulary_equals_exact_kl():
    rng = np.random.default_rng(1)
    V = 64
    lp = _log_softmax(rng.normal(size=(10, V)) * 2)
    lq = _log_softmax(rng.normal(size=(10, V)) * 2)
    exact = (np.exp(lp) * (lp - lq)).sum(axis=1)
    np.testing.assert_allclose(kl_topk(_from_dist(lp, V), _from_dist(lq, V)), exact, rtol=1e-9, atol=1e-12)


def test_kl_topk_k20_close_on_peaked_distribution():
    rng = np.random.default_rng(0)
    V = 1000
    lp = _log_softmax(rng.normal(size=(20, V)) * 8)  # the top 20 hold >= 98 % of the mass
    lq = _log_softmax(lp + rng.normal(size=(20, V)) * 0.3)
    exact = (np.exp(lp) * (lp - lq)).sum(axis=1)
    approx = kl_topk(_from_dist(lp, 20), _from_dist(lq, 20))
    # Merging the unlisted tail into one bucket loses a little divergence: a few % per position at most.
    np.testing.assert_allclose(approx, exact, rtol=0.08)
    assert approx.mean() == pytest.approx(exact.mean(), rel=0.03)


def test_kl_topk_hand_example_missing_token_gets_capped_share():
    # exact lists tokens 1, 2, 3; the arm lists 1 and 4 only, so 2 and 3 are missing from the arm.
    exact = _scores([0.0], [0], top_ids=[[1, 2, 3]], top_logprobs=[np.log([0.5, 0.3, 0.1])])
    arm = _scores([0.0], [0], top_ids=[[1, 4]], top_logprobs=[np.log([0.6, 0.1])])
    # arm unexplained mass 0.3 shared over 2 missing tokens = 0.15, capped at the arm's k-th prob 0.1
    q = [0.6, 0.1, 0.1]
    q_rest = 1 - sum(q)
    p = [0.5, 0.3, 0.1]
    p_rest = 1 - sum(p)
    expected = sum(pi * math.log(pi / qi) for pi, qi in zip(p, q)) + p_rest * math.log(p_rest / q_rest)
    assert kl_topk(exact, arm)[0] == pytest.approx(expected, rel=1e-9)


def test_kl_topk_uncapped_share_and_missing_lists():
    exact = _scores([0.0, 0.0], [0, 0], top_ids=[[1, 2], [-1, -1]],
                    top_logprobs=[np.log([0.7, 0.2]), [-np.inf, -np.inf]])
    arm = _scores([0.0, 0.0], [0, 0], top_ids=[[1, 5], [1, 5]], top_logprobs=[np.log([0.5, 0.4])] * 2)
    # token 2 missing: unexplained 0.1 < cap 0.4 -> q = 0.1; q_rest = 1 - 0.6 = 0.4
    expected = 0.7 * math.log(0.7 / 0.5) + 0.2 * math.log(0.2 / 0.1) + 0.1 * math.log(0.1 / 0.4)
    kl = kl_topk(exact, arm)
    assert kl[0] == pytest.approx(expected, rel=1e-9)
    assert math.isnan(kl[1])
    assert np.isnan(kl_topk(_scores([0.0], [0]), _scores([0.0], [0]))).all()
