"""Exact-row selection bounds (no engine needed)."""

from __future__ import annotations

import torch

from sgl_ridgefill.runtime.selection import every_kth_row, query_window, watched_rows


def test_every_kth_row_is_empty_when_the_range_is_shorter_than_k():
    """C2: ``exact_every`` larger than the new prefix raised inside the forward and stopped the scheduler."""
    assert every_kth_row(8, 1973, 1976).numel() == 0
    assert every_kth_row(100_000, 0, 1976).numel() == 0
    assert every_kth_row(8, 0, 6).numel() == 0
    assert every_kth_row(3, 10, 20).tolist() == [12, 15, 18]
    assert every_kth_row(1, 4, 7).tolist() == [4, 5, 6]


def test_query_windows_never_reach_below_the_cached_prefix():
    """C5: a radix hit inside the query window left fewer captured queries than the window's rows."""
    assert query_window("last", 64, 1000, 900) == (936, 1000)
    assert query_window("last", 64, 1000, 900, start=950) == (950, 1000)
    assert query_window("before_tail", 64, 1000, 900, start=880) == (880, 900)
    lo, hi = query_window("before_tail", 64, 1000, 900, start=950)
    assert hi <= lo  # the whole window was cached: no queries, an empty statistic
    assert torch.arange(lo, hi).numel() == 0


def test_watched_rows_count_the_new_prefix_only():
    exact = torch.tensor([0, 7, 14, 21])
    # 3 is filled, 7 and 14 exact; 2 is below the cached start, 40 in the tail: neither is counted.
    assert watched_rows((2, 3, 7, 14, 40), exact, 3, 30) == {"watched": 3, "watched_exact": 2}
    assert watched_rows((), exact, 0, 30) == {"watched": 0, "watched_exact": 0}
    assert watched_rows((5,), torch.empty(0, dtype=torch.long), 0, 30) == {"watched": 1, "watched_exact": 0}


def test_a_reselecting_plan_chooses_among_the_cached_rows_too():
    """A namespace plan with a selection chooses over the whole prefix on a cache hit (a fresh fill's rows);
    the same selection without reuse of its choice (no_insert) chooses among the new rows only."""
    from sgl_ridgefill.runtime.plan import RequestPlan
    from sgl_ridgefill.runtime.selection import select_rows
    from sgl_ridgefill.runtime.state import RequestState

    def chosen(cache_mode: str, **plan) -> list[int]:
        st = RequestState(RequestPlan(arm="ridgefill", split=2, tail=10, cache_mode=cache_mode, **plan))
        st.bind(range(50), None)
        st.start = 25
        return select_rows(st, {}, {}).tolist()

    assert chosen("namespace", exact_every=7) == [6, 13, 20, 27, 34]
    assert chosen("no_insert", exact_every=7) == [31, 38]  # every 7th row from the cached start
    assert chosen("namespace", exact_rows=(3, 30, 45)) == [3, 30]
    assert chosen("namespace", exact_every=7, value_rescale=8) == [31, 38]  # the rescale does not reselect


def _statistics_fixture(n: int, layers=(1, 3), heads: int = 4, kv_heads: int = 2, d: int = 8):
    from types import SimpleNamespace

    g = torch.Generator().manual_seed(0)
    keys = {l: torch.randn(n + 5, kv_heads, d, generator=g) for l in layers}  # pool rows, shuffled by the slots
    queries = {l: torch.randn(n, heads * d, generator=g) for l in layers}  # every prompt row's lower-layer query
    pool = SimpleNamespace(get_key_buffer=lambda layer_id: keys[layer_id])
    adapter = SimpleNamespace(shape=SimpleNamespace(head_dim=d), attention=lambda layer_id: SimpleNamespace(scaling=0.3))
    slots = torch.randperm(n + 5, generator=g)[:n]
    ctx = SimpleNamespace(adapter=adapter, pool=pool)
    return ctx, keys, queries, slots


def test_the_statistics_summed_chunk_by_chunk_equal_the_whole_window_at_once():
    """Each chunk adds its own queries' share in its own forward: whatever the chunking, the statistic is the
    attention the whole window gives every prefix row (reference: one call over every query of the window)."""
    from types import SimpleNamespace

    from sgl_ridgefill.runtime.selection import accumulate_statistics, attention_received, attention_statistics
    from sgl_ridgefill.selectors.base import AttentionRequirement

    n, boundary = 300, 200
    ctx, keys, queries, slots = _statistics_fixture(n)
    last = AttentionRequirement(query="last", q=130, layers=(1, 3))  # reaches into the prefix: rows 170..299
    blind = AttentionRequirement(query="before_tail", q=40, layers=(3,))  # rows 160..199, all before the tail
    reqs = [last, blind]
    expected = {}
    for req in reqs:
        lo, hi = query_window(req.query, req.q, n, boundary)
        expected[req] = sum(
            attention_received(queries[l][lo:hi].reshape(hi - lo, -1, 8), keys[l][slots[:hi]], torch.arange(lo, hi),
                               0.3)[:boundary]
            for l in req.layers)
    for cuts in ((0, 300), (0, 100, 175, 190, 260, 300), (0, 299, 300)):
        st = SimpleNamespace(num_tokens=n, boundary=boundary, start=0, queries={}, attention={})
        for first, stop in zip(cuts, cuts[1:]):
            for req in reqs:  # what the lower pass captures of the chunk's rows in each window
                lo, hi = query_window(req.query, req.q, n, boundary)
                a, b = max(lo, first), min(hi, stop)
                if a < b:
                    for l in req.layers:
                        st.queries.setdefault((req, l), []).append(queries[l][a:b])
            accumulate_statistics(ctx, st, reqs, slots[:stop], first, stop - first)
            assert not st.queries  # the captures go once they are counted
        got = attention_statistics(st, reqs, torch.device("cpu"))
        for req in reqs:
            assert got[req].shape == (boundary,)
            torch.testing.assert_close(got[req], expected[req], rtol=1e-5, atol=1e-6)
    st = SimpleNamespace(num_tokens=n, boundary=boundary, start=0, queries={}, attention={})
    assert all(v.abs().sum() == 0 for v in attention_statistics(st, reqs, torch.device("cpu")).values())
