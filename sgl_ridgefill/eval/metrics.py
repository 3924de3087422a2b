"""Per-token loss and agreement metrics computed from SGLang prompt logprobs.

Every arm (exact, RidgeFill, baselines) scores the same prompt through SGLang's ``/generate`` with
``return_logprob=True, logprob_start_len=s, top_logprobs_num=k``; :class:`TokenScores` holds one arm's
answer for one document. The metrics follow the evaluation in the spec: loss restricted to key tokens
(tokens that need the far prefix), loss restricted to new tokens (not copied from earlier in the prompt),
and top-1 agreement / KL against the exact arm. Engine-free: numpy only.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

_JSON_FORMAT = "ridgefill-token-scores/1"
# Floor for probabilities inside logarithms: a token the arm does not list must not yield log(0).
_TINY = 1e-12


@dataclass(frozen=True, eq=False)
class TokenScores:
    """One arm's prompt logprobs on one document, for prompt positions ``start .. start + n - 1``.

    token_ids: [n] int64, the scored prompt tokens.
    logprobs: [n] float64, log P(token_i | tokens before i); NaN where the server gave none (the first
        prompt token when ``start == 0``).
    top_ids: [n, k] int64, the server's top-k token ids per position, -1 padding.
    top_logprobs: [n, k] float64, their logprobs, -inf padding.
    """

    start: int
    token_ids: np.ndarray
    logprobs: np.ndarray
    top_ids: np.ndarray
    top_logprobs: np.ndarray

    def __post_init__(self) -> None:
        if int(self.start) != self.start or self.start < 0:
            raise ValueError(f"TokenScores.start must be a non-negative integer, got {self.start!r}")
        n = self.token_ids.shape[0] if self.token_ids.ndim == 1 else -1
        if n < 0:
            raise ValueError(f"TokenScores.token_ids must be 1-D, got shape {self.token_ids.shape}")
        if self.logprobs.shape != (n,):
            raise ValueError(f"TokenScores.logprobs has shape {self.logprobs.shape}, expected ({n},)")
        if self.top_ids.ndim != 2 or self.top_ids.shape[0] != n:
            raise ValueError(f"TokenScores.top_ids has shape {self.top_ids.shape}, expected ({n}, k)")
        if self.top_logprobs.shape != self.top_ids.shape:
            raise ValueError(
                f"TokenScores.top_logprobs has shape {self.top_logprobs.shape}, "
                f"expected {self.top_ids.shape} like top_ids"
            )

    def __len__(self) -> int:
        return int(self.token_ids.shape[0])

    @property
    def k(self) -> int:
        return int(self.top_ids.shape[1])

    @property
    def positions(self) -> np.ndarray:
        """[n] int64 absolute prompt positions of the scored tokens."""
        return np.arange(self.start, self.start + len(self), dtype=np.int64)

    @property
    def losses(self) -> np.ndarray:
        """[n] float64 per-token loss (-logprob, nat), NaN where no logprob was given."""
        return -self.logprobs

    @classmethod
    def from_meta_info(cls, meta_info: dict, start: int) -> TokenScores:
        """Build from the ``meta_info`` of one SGLang ``/generate`` answer.

        ``input_token_logprobs``: [n] entries ``[logprob, token_id, text_or_None]``;
        ``input_top_logprobs`` (optional): [n] entries, each a list of such triples or None. Lists of
        unequal length are padded to the longest.
        """
        if "input_token_logprobs" not in meta_info:
            raise ValueError(
                "meta_info has no 'input_token_logprobs'; request with return_logprob=True "
                f"(keys present: {sorted(meta_info)})"
            )
        entries = meta_info["input_token_logprobs"]
        n = len(entries)
        token_ids = np.array([int(e[1]) for e in entries], dtype=np.int64)
        logprobs = np.array([np.nan if e[0] is None else float(e[0]) for e in entries], dtype=np.float64)

        tops = meta_info.get("input_top_logprobs") or [None] * n
        if len(tops) != n:
            raise ValueError(
                f"meta_info has {len(tops)} 'input_top_logprobs' entries but {n} 'input_token_logprobs'"
            )
        k = max((len(t) for t in tops if t), default=0)
        top_ids = np.full((n, k), -1, dtype=np.int64)
        top_logprobs = np.full((n, k), -np.inf, dtype=np.float64)
        for i, row in enumerate(tops):
            for j, e in enumerate(row or ()):
                if e[0] is None:
                    continue
                top_ids[i, j] = int(e[1])
                top_logprobs[i, j] = float(e[0])
        return cls(int(start), token_ids, logprobs, top_ids, top_logprobs)

    def to_json(self) -> dict:
        """JSON-safe dict; arrays as base64 little-endian bytes (compact, bit-exact, keeps NaN/-inf)."""
        return {
            "format": _JSON_FORMAT,
            "start": int(self.start),
            "n": len(self),
            "k": self.k,
            "token_ids": _encode(self.token_ids, "<i8"),
            "logprobs": _encode(self.logprobs, "<f8"),
            "top_ids": _encode(self.top_ids, "<i8"),
            "top_logprobs": _encode(self.top_logprobs, "<f8"),
        }

    @classmethod
    def from_json(cls, d: dict) -> TokenScores:
        if d.get("format") != _JSON_FORMAT:
            raise ValueError(f"TokenScores JSON format is {d.get('format')!r}, expected {_JSON_FORMAT!r}")
        n, k = int(d["n"]), int(d["k"])
        return cls(
            int(d["start"]),
            _decode(d["token_ids"], "<i8", (n,)),
            _decode(d["logprobs"], "<f8", (n,)),
            _decode(d["top_ids"], "<i8", (n, k)),
            _decode(d["top_logprobs"], "<f8", (n, k)),
        )


def _encode(a: np.ndarray, dtype: str) -> str:
    return base64.b64encode(np.ascontiguousarray(a, dtype=dtype).tobytes()).decode("ascii")


def _decode(s: str, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    a = np.frombuffer(base64.b64decode(s), dtype=dtype)
    if a.size != int(np.prod(shape)):
        raise ValueError(f"TokenScores JSON array holds {a.size} values, expected shape {shape}")
    return a.astype(np.int64 if "i" in dtype else np.float64).reshape(shape)


def _check_aligned(a: TokenScores, b: TokenScores, what: str) -> None:
    if len(a) != len(b):
        raise ValueError(
            f"{what}: arms score {len(a)} and {len(b)} tokens; pass both over the same positions"
        )
    bad = np.flatnonzero(a.token_ids != b.token_ids)
    if bad.size:
        i = int(bad[0])
        raise ValueError(
            f"{what}: token ids differ at offset {i} ({int(a.token_ids[i])} vs {int(b.token_ids[i])}); "
            "the arms do not score the same tokens"
        )


def key_token_mask(exact: TokenScores, cut: TokenScores, threshold: float = 2.0) -> np.ndarray:
    """[n] bool: key tokens, whose loss rises by more than ``threshold`` nat when the context is cut.

    ``exact`` scores the tokens with the full prompt before them; ``cut`` scores the same tokens with the
    context cut to the last T tokens (its own ``start`` is relative to the shorter prompt, so only the
    token ids are compared). A token is key when ``cut_loss - exact_loss > threshold``: it really depends on
    the far prefix. Tokens without a logprob in either arm are not key.
    """
    _check_aligned(exact, cut, "key_token_mask")
    rise = exact.logprobs - cut.logprobs  # = cut_loss - exact_loss
    with np.errstate(invalid="ignore"):
        return np.nan_to_num(rise, nan=-np.inf) > threshold


def new_token_mask(prompt_ids: Sequence[int] | np.ndarray, start: int, span: int = 8) -> np.ndarray:
    """[N - start] bool over positions ``start .. N-1``: True for tokens not copied from earlier.

    prompt_ids: [N] the whole prompt. A position is *not* new when some ``span``-token window of the
    prompt containing it repeats a window that starts at a smaller index. Windows are hashed exactly as
    byte strings of their ids (sort-based unique, a few ms for N = 16384).
    """
    ids = np.asarray(prompt_ids, dtype=np.int64)
    if ids.ndim != 1:
        raise ValueError(f"new_token_mask: prompt_ids must be 1-D, got shape {ids.shape}")
    n = ids.shape[0]
    if span < 1:
        raise ValueError(f"new_token_mask: span must be >= 1, got {span}")
    if not 0 <= start <= n:
        raise ValueError(f"new_token_mask: start={start} is outside the prompt of {n} tokens")
    if n < span:
        return np.ones(n - start, dtype=bool)
    windows = np.ascontiguousarray(np.lib.stride_tricks.sliding_window_view(ids, span))  # [W, span]
    keys = windows.view(np.dtype((np.void, 8 * span))).ravel()  # [W]
    _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
    repeated = first[inverse.ravel()] < np.arange(keys.shape[0])  # [W] window seen earlier
    # A repeated window starting at j covers positions j .. j+span-1: mark with a difference array.
    cover = np.zeros(n + 1, dtype=np.int64)
    starts = np.flatnonzero(repeated)
    np.add.at(cover, starts, 1)
    np.add.at(cover, starts + span, -1)
    copied = np.cumsum(cover[:n]) > 0
    return ~copied[start:]


def mean_loss(scores: TokenScores, mask: np.ndarray | None = None) -> float:
    """Mean of -logprob over ``mask`` ([n] bool; None = all), skipping NaN; NaN when nothing is left."""
    losses = scores.losses
    if mask is not None:
        mask = np.asarray(mask, dtype=bool)
        if mask.shape != losses.shape:
            raise ValueError(f"mean_loss: mask has shape {mask.shape}, scores have {losses.shape}")
        losses = losses[mask]
    losses = losses[~np.isnan(losses)]
    return float(losses.mean()) if losses.size else float("nan")


def _argmax_ids(s: TokenScores) -> np.ndarray:
    """[n] id of the most likely token per position, -1 where no top list was given."""
    if s.k == 0:
        return np.full(len(s), -1, dtype=np.int64)
    best = np.argmax(s.top_logprobs, axis=1)
    ids = s.top_ids[np.arange(len(s)), best]
    return np.where(np.isfinite(s.top_logprobs.max(axis=1)), ids, -1)


def top1_agreement(exact: TokenScores, arm: TokenScores) -> np.ndarray:
    """[n] bool: the arm's most likely next token equals the exact arm's (False where either has no list)."""
    _check_aligned(exact, arm, "top1_agreement")
    e, a = _argmax_ids(exact), _argmax_ids(arm)
    return (e == a) & (e >= 0)


def kl_topk(exact: TokenScores, arm: TokenScores) -> np.ndarray:
    """[n] float64 KL(p_exact || q_arm) per position, approximated from the servers' top-k lists.

    The server returns only the top k tokens, so the KL is taken over a reduced support: the exact arm's
    top-k tokens plus one "rest" bucket.
      - p_i = exp(exact logprob of top token i); p_rest = 1 - sum p_i (clamped at 0).
      - q_i = exp(arm logprob of token i) when token i is in the arm's top-k; otherwise the arm's
        unexplained mass (1 - sum of its top-k probabilities) shared evenly over the exact top-k tokens
        missing from the arm's list, capped at the arm's k-th (smallest listed) probability, since an
        unlisted token cannot be more likely than a listed one.
      - q_rest = max(1 - sum q_i, 1e-12).
    Merging the tail into one bucket drops the divergence inside the tail (log-sum inequality), so the
    value is close when the exact top-k holds most of the mass (k = 20 holding >= 98 %: about 1 % low on
    average, at most ~5 % per position), and exact when k covers the vocabulary.
    Probabilities are floored at 1e-12 inside logs; the result is clipped at 0 against rounding.
    NaN where either arm has no top list at a position.
    """
    _check_aligned(exact, arm, "kl_topk")
    n = len(exact)
    if exact.k == 0 or arm.k == 0:
        return np.full(n, np.nan)
    p = np.exp(exact.top_logprobs)  # [n, ke], 0 at padding
    e_valid = exact.top_ids >= 0
    q_listed = np.exp(arm.top_logprobs)  # [n, ka]
    a_valid = arm.top_ids >= 0

    match = (exact.top_ids[:, :, None] == arm.top_ids[:, None, :]) & e_valid[:, :, None] & a_valid[:, None, :]
    found = match.any(axis=2)  # [n, ke]
    q_found = (match * q_listed[:, None, :]).sum(axis=2)  # [n, ke]

    missing = e_valid & ~found
    n_missing = missing.sum(axis=1)  # [n]
    unexplained = np.clip(1.0 - q_listed.sum(axis=1), 0.0, 1.0)
    kth = np.where(a_valid, q_listed, np.inf).min(axis=1)
    share = np.minimum(unexplained / np.maximum(n_missing, 1), kth)  # [n]
    q = np.where(found, q_found, np.where(missing, share[:, None], 0.0))

    p_rest = np.clip(1.0 - p.sum(axis=1), 0.0, 1.0)
    q_rest = np.maximum(1.0 - q.sum(axis=1), _TINY)
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(p > 0, p * (np.log(np.maximum(p, _TINY)) - np.log(np.maximum(q, _TINY))), 0.0)
        rest = np.where(p_rest > 0, p_rest * (np.log(np.maximum(p_rest, _TINY)) - np.log(q_rest)), 0.0)
    kl = np.clip(terms.sum(axis=1) + rest, 0.0, None)
    has_lists = e_valid.any(axis=1) & a_valid.any(axis=1)
    return np.where(has_lists, kl, np.nan)
