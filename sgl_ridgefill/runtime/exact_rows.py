"""Which cached rows of a RidgeFill namespace were computed exactly: row-exact reuse of the radix cache.

In namespace mode RidgeFill requests with one plan share their KV through SGLang's radix cache. A row's KV
there is *filled* (written from the map's prediction) or *exact* (the row ran every layer: the tail, the
selected exact rows, the sink rows and every decoded token; exact in RidgeFill's sense: its upper layers
attended to the filled prefix). A later request fills the rows before its own boundary and runs the rest
exactly, so it may take filled rows from the cache before its boundary, and exact rows anywhere: its match
may reach into its own tail as far as the cached rows there are exact. A document followed by a new
question, or a conversation's next turn, then prefills only its new tokens, as it would on stock SGLang.

A question shorter than the one that filled the document puts its boundary a few rows before the first
request's: those rows are filled in the cache but in the new request's tail, and a radix match cannot skip
them, so without slack the request would recompute its whole tail. :func:`tail_slack` lets the match take up
to an eighth of the tail's rows filled (the first ones, farthest from the question); the request then runs
at least ``7/8`` of its tail exactly and says how many of its tail rows came filled (``tail_reused_filled``).

The radix tree keeps no facts per row, so :class:`ExactRows` keeps them beside it, keyed by the row's place
in its token sequence: a hash of the namespace and the tokens up to and including the row (two sequences
share a key exactly where the radix tree would share the row). The tree keeps the KV of whichever request
inserted a row first, so a request records only the rows the tree did not hold before its own insert
(``patches.around_release_kv_cache`` asks the tree just before SGLang inserts): each key then describes the
KV the tree holds under it. Only exact rows are remembered; a key without a record reads as filled, and the
record forgets its least recently used keys past its capacity, which only makes a later match shorter.

A plan that chooses exact rows chooses them again over a reused cache (``RequestPlan.reselects``): among every
prefix row, so a later question gets rows chosen for itself, not for the question that filled the document.
The rows it chooses that the cache holds filled run exactly over their own cached slots (their split states
recomputed from the cached lower layers, which are exact): an upgrade in place, which every later reader of
the node shares and :meth:`ExactRows.mark_exact` records.

Engine-free: numpy and the standard library.
"""

from __future__ import annotations

import itertools
import logging
import zlib
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

logger = logging.getLogger("sgl_ridgefill")

# Two primes below 2**31: products of two residues fit int64, and a prefix sum of residues stays below 2**63
# for any prompt shorter than 2**32 rows. A key is the pair of polynomial hashes, one 62-bit integer.
_PRIMES = (2_147_483_629, 2_147_483_587)
_BASES = (1_000_003, 998_244_353)
CAPACITY = 1 << 21  # exact rows remembered (≈ 100 MiB of host memory at most)
TAIL_SLACK_SHARE = 8  # a match may take up to tail // 8 of a request's tail rows filled from the cache


def tail_slack(tail: int) -> int:
    """How many of its first tail rows a namespace request may take filled from the cache."""
    return tail // TAIL_SLACK_SHARE


def _powers(base: int, prime: int, n: int) -> np.ndarray:
    """``[n]`` int64: ``base**i mod prime``, by doubling (no overflow: every factor is below 2**31)."""
    out = np.ones(max(n, 1), dtype=np.int64)
    have, step = 1, base % prime
    while have < n:
        take = min(have, n - have)
        out[have : have + take] = out[:take] * step % prime
        have += take
        step = step * step % prime
    return out[:n]


def prefix_keys(namespace: str, token_ids: Sequence[int]) -> np.ndarray:
    """``[N]`` int64 keys: entry ``p`` names row ``p`` of ``token_ids`` under ``namespace`` (the tokens ``0..p``).

    Row ``p``'s key is ``(h_1(p) << 31) | h_2(p)`` with ``h(p) = (s·b^(p+1) + Σ_{i≤p} (t_i + 1)·b^(p-i)) mod q``
    for a seed ``s`` from the namespace: vectorised as ``b^p · Σ_{i≤p} (t_i + 1)·b^(-i)``."""
    tokens = np.asarray(token_ids, dtype=np.int64)
    n = int(tokens.size)
    seed = zlib.crc32(namespace.encode())
    key = np.zeros(n, dtype=np.int64)
    for prime, base in zip(_PRIMES, _BASES):
        up = _powers(base, prime, n + 1)
        down = _powers(pow(base, prime - 2, prime), prime, n)  # b^(-i): Fermat's inverse
        terms = (tokens % prime + 1) * down % prime
        h = (np.cumsum(terms) % prime) * up[:n] % prime
        h = (h + seed % prime * up[1:]) % prime
        key = (key << 31) | h
    return key


class ExactRows:
    """The keys of cached rows whose KV was computed exactly; at most ``capacity`` are remembered."""

    def __init__(self, capacity: int = CAPACITY):
        if capacity < 1:
            raise ValueError(f"ExactRows capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self._exact: dict[int, None] = {}  # insertion-ordered: the least recently used first

    def __len__(self) -> int:
        return len(self._exact)

    def record(self, keys: np.ndarray, lo: int, exact_from: int, exact_rows: Iterable[int] = ()) -> None:
        """Record rows ``[lo, len(keys))`` of a sequence whose KV enters the tree: exact are the rows at or past
        ``exact_from`` and the ``exact_rows`` (positions) below it, filled the others. Rows before ``lo`` (the
        tree held them already) keep what their own inserter recorded."""
        lo = max(lo, 0)
        exact = np.zeros(max(len(keys) - lo, 0), dtype=bool)
        exact[max(exact_from - lo, 0) :] = True
        below = [p - lo for p in exact_rows if lo <= p < exact_from]
        exact[below] = True
        self._drop(keys[lo:][~exact].tolist())  # the tree's new KV there is filled: forget "exact"
        self._touch(keys[lo:][exact].tolist())

    def forget(self, keys: np.ndarray, lo: int) -> None:
        """Rows ``[lo, len(keys))`` entered the tree with KV of unknown kind: none reads as exact."""
        self._drop(keys[lo:].tolist())

    def exact_until(self, keys: np.ndarray, lo: int, hi: int) -> int:
        """The first position in ``[lo, hi)`` whose row is not known to be exact (``hi`` when all are); the rows
        read count as used."""
        hi = min(hi, len(keys))
        found = []
        for key in keys[lo:hi].tolist():
            if key not in self._exact:
                break
            found.append(key)
        self._touch(found)
        return lo + len(found) if lo < hi else hi

    def count_exact(self, keys: np.ndarray, hi: int) -> int:
        """How many of the rows ``[0, hi)`` are known to be exact."""
        return sum(1 for key in keys[:hi].tolist() if key in self._exact)

    def exact_mask(self, keys: np.ndarray, hi: int) -> np.ndarray:
        """``[min(hi, len(keys))]`` bool: which of the rows ``[0, hi)`` are known to be exact."""
        return np.fromiter((key in self._exact for key in keys[:hi].tolist()), dtype=bool, count=min(hi, len(keys)))

    def mark_exact(self, keys: np.ndarray, positions: Iterable[int]) -> None:
        """The rows at ``positions``, which the tree holds, were made exact in place (a later request chose them
        and ran them exactly over their cached slots)."""
        self._touch([int(keys[p]) for p in positions if 0 <= p < len(keys)])

    def exact_among(self, keys: np.ndarray, positions: Iterable[int], hi: int) -> tuple[int, int]:
        """``(n, exact)``: how many of ``positions`` lie in rows ``[0, hi)``, and how many of those are known
        to be exact."""
        inside = [p for p in positions if 0 <= p < min(hi, len(keys))]
        return len(inside), sum(1 for p in inside if int(keys[p]) in self._exact)

    def _drop(self, keys: list[int]) -> None:
        for key in self._exact.keys() & set(keys):
            del self._exact[key]

    def _touch(self, keys: list[int]) -> None:
        for key in keys:
            self._exact.pop(key, None)
            self._exact[key] = None
        for key in list(itertools.islice(self._exact, max(len(self._exact) - self.capacity, 0))):
            del self._exact[key]


def record_inserted_rows(exact_rows: "ExactRows", req: Any, tree_cache: Any, st: Any) -> None:
    """Before a namespace request's KV enters the tree: which of its rows the tree does not hold yet (those it
    takes from this request), and which of those are exact. Where the tree cannot be asked, the rows are
    recorded as filled: a later match only gets shorter."""
    from array import array

    ids = list(req.origin_input_ids) + list(getattr(req, "output_ids", None) or ())
    keys = st.row_keys(ids)
    try:
        from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams
        from sglang.srt.mem_cache.radix_cache import RadixKey

        held = tree_cache.match_prefix(MatchPrefixParams(key=RadixKey(
            array("q", ids), extra_key=req.extra_key, cache_salt=getattr(req, "cache_salt", None),
        ))).device_prefix_len
    except Exception:  # a tree this release does not know how to ask: nothing it adds reads as exact
        logger.debug("request %s: the radix tree could not be matched before insert", req.rid, exc_info=True)
        exact_rows.forget(keys, max(st.start, 0))
        return
    exact_rows.record(keys, int(held), exact_from=st.exact_from(), exact_rows=st.exact_prefix_positions())
    # Cached rows this request chose and made exact in place; the tree still holds them (they were matched,
    # so locked, until this release).
    exact_rows.mark_exact(keys, [p for p in st.upgraded_positions if p < int(held)])
