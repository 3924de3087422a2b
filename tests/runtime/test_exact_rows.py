"""Row-exact reuse's record (engine-free): keys name a row by its namespace and the tokens up to it, records
describe the KV the tree took from the recording request, and everything unknown reads as filled."""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from sgl_ridgefill.runtime.exact_rows import _BASES, _PRIMES, ExactRows, prefix_keys


def _rolling(namespace: str, tokens, prime: int, base: int) -> list[int]:
    h, out = zlib.crc32(namespace.encode()) % prime, []
    for t in tokens:
        h = (h * base + int(t) + 1) % prime
        out.append(h)
    return out


def test_keys_are_the_rolling_hashes_of_every_prefix():
    tokens = np.random.default_rng(0).integers(0, 150_000, 300)
    keys = prefix_keys("ns", tokens)
    high = _rolling("ns", tokens, _PRIMES[0], _BASES[0])
    low = _rolling("ns", tokens, _PRIMES[1], _BASES[1])
    assert keys.tolist() == [(a << 31) | b for a, b in zip(high, low)]


def test_keys_are_shared_exactly_where_prefixes_are():
    a = [5, 6, 7, 8, 9]
    b = [5, 6, 7, 1, 9]
    ka, kb = prefix_keys("ns", a), prefix_keys("ns", b)
    assert (ka[:3] == kb[:3]).all() and not (ka[3:] == kb[3:]).any()
    assert not (prefix_keys("other", a) == ka).any()  # another namespace shares nothing
    assert len(set(prefix_keys("ns", np.arange(50_000) % 7).tolist())) == 50_000


def test_a_record_marks_the_tail_the_exact_rows_and_nothing_else():
    keys = prefix_keys("ns", range(40))
    rows = ExactRows()
    rows.record(keys, 0, exact_from=30, exact_rows=[5, 12])
    assert [p for p in range(40) if rows.exact_until(keys, p, p + 1) == p + 1] == [5, 12, *range(30, 40)]
    assert rows.exact_until(keys, 30, 40) == 40
    assert rows.exact_until(keys, 28, 40) == 28  # a filled row stops the match
    assert rows.count_exact(keys, 40) == 12
    # watch_rows over the cached rows [0, 32): 4, 5, 12 and 31 lie there, 5, 12 and 31 exact; 35 lies past them
    assert rows.exact_among(keys, [4, 5, 12, 31, 35], 32) == (4, 3)


def test_rows_the_tree_held_keep_their_first_inserters_record():
    """A longer request filled rows that a shorter one later computes exactly; the tree keeps the longer
    request's filled KV there, so the shorter request's record (from the tree's match before its insert)
    must not call them exact."""
    long_keys = prefix_keys("ns", range(150))
    rows = ExactRows()
    rows.record(long_keys, 0, exact_from=130)
    short = long_keys[:100]
    rows.record(short, 100, exact_from=80)  # the tree held all 100 rows: nothing is the short request's
    assert rows.exact_until(short, 80, 100) == 80
    # Rows it does add are its own: exact past its boundary, and an earlier "exact" the tree now holds filled
    # is forgotten.
    other = prefix_keys("ns", [*range(100), 7, 7, 7])
    rows.record(other, 100, exact_from=102)
    assert rows.exact_until(other, 100, 103) == 100 and rows.exact_until(other, 102, 103) == 103


def test_forget_and_capacity_only_shorten_matches():
    keys = prefix_keys("ns", range(20))
    rows = ExactRows(capacity=5)
    rows.record(keys, 0, exact_from=10)
    assert len(rows) == 5 and rows.exact_until(keys, 10, 20) == 10  # the oldest five went first
    assert rows.exact_until(keys, 15, 20) == 20
    rows.forget(keys, 17)
    assert rows.exact_until(keys, 15, 20) == 17
    with pytest.raises(ValueError, match="capacity must be >= 1"):
        ExactRows(capacity=0)


def test_a_match_keeps_the_rows_it_read_in_the_record():
    keys = prefix_keys("ns", range(10))
    rows = ExactRows(capacity=4)
    rows.record(keys, 0, exact_from=6)  # rows 6..9
    assert rows.exact_until(keys, 6, 7) == 7  # row 6 read: now the most recent
    rows.record(prefix_keys("ns", [1]), 0, exact_from=0)  # one more exact row pushes the oldest out
    assert rows.exact_until(keys, 6, 7) == 7 and rows.exact_until(keys, 7, 8) == 7


def test_rows_made_exact_in_place_read_as_exact_and_the_mask_says_which():
    keys = prefix_keys("ns", range(40))
    rows = ExactRows()
    rows.record(keys, 0, exact_from=30, exact_rows=[4])
    assert rows.exact_mask(keys, 32).tolist() == [i == 4 or 30 <= i for i in range(32)]
    rows.mark_exact(keys, [7, 12, 99])  # a later request chose 7 and 12 and ran them over their slots
    assert np.flatnonzero(rows.exact_mask(keys, 30)).tolist() == [4, 7, 12]
    assert rows.count_exact(keys, 40) == 3 + 10
    assert rows.exact_mask(keys, 100).shape == (40,)
