"""Property tests of ``sgl_ridgefill.attention.planner``, ``metadata`` and ``steps``: every backend convention
admits exactly the pairs ``{(p, k): k <= p, visible[k]}`` and, through an emulator of that backend, gives the
reference attention; runs carry no mask and groups a device-built one of ``rows x (keys + rows)`` entries."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sgl_ridgefill import ledger
from sgl_ridgefill.attention.metadata import (
    decode_kv_lists,
    fa3_args,
    flashinfer_paged_args,
    triton_group_args,
    triton_run_args,
)
from sgl_ridgefill.attention.planner import VirtualRequests, plan_groups, plan_virtual_requests, runs_of
from sgl_ridgefill.attention.steps import plan_steps
from tests.support.attention_emulators import (
    decode_emulator,
    fa3_kvcache_emulator,
    flashinfer_paged_emulator,
    ragged_order_emulator,
    reference_attention,
    triton_extend_emulator,
)

PROPS = dict(deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(autouse=True)
def _one_thread():
    """Run on one intra-op thread: every tensor here is tiny, and on a busy machine the thread pool's
    synchronisation made these tests several times slower (62 s against 8 s for one test)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)

Q_HEADS, KV_HEADS, HEAD_DIM = 4, 2, 8
SCALE = HEAD_DIM**-0.5


# ------------------------------------------------------------------------------------------- inputs


@dataclass(frozen=True)
class SubPass:
    """One drawn sub-pass: query positions [n], optional visible mask [seq_len], group size, rng seed."""

    seq_len: int
    positions: torch.Tensor
    visible: torch.Tensor | None
    group_size: int | None
    seed: int
    runs_from: int | None = None  # with group_size: rows from here on are runs (a RidgeFill tail)

    def plan(self) -> VirtualRequests:
        """Every row in runs."""
        return plan_virtual_requests(self.positions, self.visible)

    def parts(self) -> list[tuple[VirtualRequests, torch.Tensor]]:
        """(plan, its rows of the sub-pass): the rows below ``runs_from`` in groups of ``group_size`` (every
        row when ``runs_from`` is None), the rest in runs; without ``group_size`` every row in runs."""
        if self.group_size is None:
            return [(self.plan(), torch.arange(self.positions.numel()))]
        cut = self.positions.numel() if self.runs_from is None else int((self.positions < self.runs_from).sum())
        out = []
        if cut:
            out.append((plan_groups(self.positions[:cut], self.visible, group_size=self.group_size), torch.arange(cut)))
        if cut < self.positions.numel():
            rows = torch.arange(cut, self.positions.numel())
            out.append((plan_virtual_requests(self.positions[cut:], self.visible), rows))
        return out

    def expected_pairs(self) -> torch.Tensor:
        """[n, seq_len] int: 1 where the query row may attend to the key position."""
        keys = torch.arange(self.seq_len)
        allowed = keys[None, :] <= self.positions[:, None]
        if self.visible is not None:
            allowed &= self.visible[None, :]
        return allowed.int()


@st.composite
def subpasses(draw, *, groups: bool = True, masks: bool = True) -> SubPass:
    seq_len = draw(st.integers(1, 300))
    seed = draw(st.integers(0, 2**31 - 1))
    g = torch.Generator().manual_seed(seed)
    chosen = torch.rand(seq_len, generator=g) < draw(st.sampled_from([0.0, 0.02, 0.1, 0.3, 0.7, 1.0]))
    for _ in range(draw(st.integers(0, 3))):  # windows of consecutive rows
        start = draw(st.integers(0, seq_len - 1))
        chosen[start : start + draw(st.integers(1, 40))] = True
    tail = draw(st.integers(0, seq_len))
    chosen[seq_len - tail :] = True
    if not chosen.any():
        chosen[draw(st.integers(0, seq_len - 1))] = True
    visible = None
    if masks and draw(st.booleans()):
        visible = (torch.rand(seq_len, generator=g) < draw(st.sampled_from([0.0, 0.3, 0.8, 1.0]))) | chosen
    group_size = draw(st.sampled_from([None, 1, 2, 3, 5, 8, 16])) if groups else None
    runs_from = seq_len - tail if group_size is not None and draw(st.booleans()) else None
    return SubPass(seq_len, torch.nonzero(chosen).flatten(), visible, group_size, seed, runs_from)


@dataclass(frozen=True)
class Pool:
    """A token pool holding the sub-pass's K/V at ``slots`` (written before attention), and its queries."""

    slots: torch.Tensor  # [seq_len] int64, a shuffled placement of the positions among the pool's slots
    k: torch.Tensor  # [num_slots, KV_HEADS, HEAD_DIM]
    v: torch.Tensor
    q: torch.Tensor  # [n, Q_HEADS, HEAD_DIM]

    @property
    def position_of_slot(self) -> torch.Tensor:
        inverse = torch.full((self.k.shape[0],), -1, dtype=torch.int64)
        inverse[self.slots] = torch.arange(self.slots.numel())
        return inverse


def make_pool(sp: SubPass, *, page_size: int = 1) -> Pool:
    """Random K/V/Q; slots shuffled page by page (token ``i`` of a page stays token ``i``), as a paged
    allocator places them; at ``page_size=1`` this is any permutation. Spare slots hold unrelated K/V."""
    g = torch.Generator().manual_seed(sp.seed)
    pages = -(-sp.seq_len // page_size) + 3
    page_of = torch.randperm(pages, generator=g)
    position = torch.arange(sp.seq_len)
    slots = page_of[position // page_size] * page_size + position % page_size
    num_slots = pages * page_size
    k = torch.randn(num_slots, KV_HEADS, HEAD_DIM, generator=g)
    v = torch.randn(num_slots, KV_HEADS, HEAD_DIM, generator=g)
    q = torch.randn(sp.positions.numel(), Q_HEADS, HEAD_DIM, generator=g)
    return Pool(slots, k, v, q)


# ------------------------------------------------------------------------- admitted (query, key) pairs


def triton_pairs(args, positions: torch.Tensor, pool: Pool) -> torch.Tensor:
    """[n, seq_len] int: how often each (query row, key position) pair enters the Triton kernel's softmax."""
    counts = torch.zeros(positions.numel(), pool.slots.numel(), dtype=torch.int64)
    key_position = pool.position_of_slot
    for b in range(args.qo_indptr.numel() - 1):
        q0, q1 = int(args.qo_indptr[b]), int(args.qo_indptr[b + 1])
        prefix = key_position[args.kv_indices[int(args.kv_indptr[b]) : int(args.kv_indptr[b + 1])]]
        m, p = q1 - q0, prefix.numel()
        assert bool((prefix >= 0).all()), "a prefix key is not a slot of this request"
        mask = None
        if args.custom_mask is not None:
            start = int(args.mask_indptr[b])
            mask = args.custom_mask[start : start + m * (p + m)].view(m, p + m).bool()
        prefix_allowed = mask[:, :p] if mask is not None and not args.skip_prefix_custom_mask else torch.ones(m, p)
        extend_allowed = mask[:, p:] if mask is not None else torch.ones(m, m).tril()
        if args.skip_extend:
            extend_allowed = torch.zeros(m, m)
        counts[q0:q1].index_add_(1, prefix, prefix_allowed.long())
        counts[q0:q1].index_add_(1, positions[q0:q1], extend_allowed.long())
    return counts


def flashinfer_pairs(args, pool: Pool) -> torch.Tensor:
    n = int(args.qo_indptr[-1])
    counts = torch.zeros(n, pool.slots.numel(), dtype=torch.int64)
    key_position = pool.position_of_slot
    for b in range(args.qo_indptr.numel() - 1):
        q0, q1 = int(args.qo_indptr[b]), int(args.qo_indptr[b + 1])
        keys = key_position[args.kv_indices[int(args.kv_indptr[b]) : int(args.kv_indptr[b + 1])].long()]
        m, kv = q1 - q0, keys.numel()
        allowed = torch.ones(m, kv).tril(diagonal=kv - m)  # bottom-right causal
        counts[q0:q1].index_add_(1, keys, allowed.long())
    return counts


def fa3_pairs(args, pool: Pool, page_size: int) -> torch.Tensor:
    n = int(args.cu_seqlens_q[-1])
    counts = torch.zeros(n, pool.slots.numel(), dtype=torch.int64)
    key_position = pool.position_of_slot
    for b in range(args.cu_seqlens_q.numel() - 1):
        q0, q1 = int(args.cu_seqlens_q[b]), int(args.cu_seqlens_q[b + 1])
        c = torch.arange(int(args.cache_seqlens[b]))
        keys = key_position[args.page_table[b, c // page_size].long() * page_size + c % page_size]
        allowed = torch.ones(q1 - q0, c.numel()).tril(diagonal=c.numel() - (q1 - q0))
        counts[q0:q1].index_add_(1, keys, allowed.long())
    return counts


def scatter_rows(parts: list[tuple[torch.Tensor, torch.Tensor]], n: int) -> torch.Tensor:
    """Per-part results ([m, ...]) placed back at their sub-pass rows ([m] int64)."""
    first = parts[0][0]
    out = first.new_zeros((n, *first.shape[1:]))
    for value, rows in parts:
        out[rows] = value
    return out


def part_args(vr: VirtualRequests, slots: torch.Tensor):
    """The Triton arguments the runtime uses for a part: groups masked, runs as a stock extend."""
    return triton_group_args(vr, slots) if vr.has_groups else triton_run_args(vr, slots)


def triton_parts_pairs(sp: SubPass, pool: Pool) -> torch.Tensor:
    parts = [(triton_pairs(part_args(vr, pool.slots), vr.positions, pool), rows) for vr, rows in sp.parts()]
    return scatter_rows(parts, sp.positions.numel())


def uncompacted(sp: SubPass) -> bool:
    last = int(sp.positions[-1])
    return sp.visible is None or bool(sp.visible[: last + 1].all())


@settings(max_examples=300, **PROPS)
@given(subpasses())
def test_every_convention_admits_exactly_the_reference_pairs(sp: SubPass) -> None:
    vr, pool, want = sp.plan(), make_pool(sp), sp.expected_pairs()
    assert torch.equal(triton_pairs(triton_run_args(vr, pool.slots), sp.positions, pool), want)
    assert torch.equal(triton_parts_pairs(sp, pool), want)
    assert torch.equal(flashinfer_pairs(flashinfer_paged_args(vr, pool.slots), pool), want)
    assert torch.equal(fa3_pairs(fa3_args(vr, pool.slots), pool, 1), want)
    groups = plan_groups(sp.positions, sp.visible, group_size=sp.group_size or 4)
    assert torch.equal(triton_pairs(triton_group_args(groups, pool.slots), sp.positions, pool), want)


@settings(max_examples=150, **PROPS)
@given(subpasses(groups=False), st.sampled_from([1, 4]), st.booleans())
def test_fa3_page_table_admits_exactly_the_reference_pairs(sp: SubPass, page_size: int, fixed_width: bool) -> None:
    if page_size > 1 and not uncompacted(sp):
        sp = SubPass(sp.seq_len, sp.positions, None, None, sp.seed)
    vr, pool = sp.plan(), make_pool(sp, page_size=page_size)
    args = fa3_args(vr, pool.slots, page_size=page_size, max_context_len=sp.seq_len + 5 if fixed_width else None)
    assert torch.equal(fa3_pairs(args, pool, page_size), sp.expected_pairs())
    assert args.page_table.shape[1] == -(-(sp.seq_len + 5 if fixed_width else args.max_seqlen_k) // page_size)


# -------------------------------------------------------------------------------- emulated attention


def check_close(got: torch.Tensor, want: torch.Tensor) -> None:
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@settings(max_examples=250, **PROPS)
@given(subpasses())
def test_emulated_backends_match_reference_attention(sp: SubPass) -> None:
    vr, pool = sp.plan(), make_pool(sp)
    want = reference_attention(pool.q, pool.k, pool.v, pool.slots, sp.positions, sp.visible, SCALE)
    k_new, v_new = pool.k[pool.slots[sp.positions]], pool.v[pool.slots[sp.positions]]

    def triton(part: VirtualRequests, rows: torch.Tensor) -> torch.Tensor:
        a = part_args(part, pool.slots)
        return triton_extend_emulator(
            pool.q[rows], k_new[rows], v_new[rows], pool.k, pool.v, a.qo_indptr, a.kv_indptr, a.kv_indices,
            a.custom_mask, a.mask_indptr, SCALE, skip_prefix_custom_mask=a.skip_prefix_custom_mask,
            skip_extend=a.skip_extend,
        )

    check_close(triton(vr, torch.arange(vr.num_rows)), want)
    check_close(scatter_rows([(triton(p, rows), rows) for p, rows in sp.parts()], vr.num_rows), want)

    f = flashinfer_paged_args(vr, pool.slots)
    got = flashinfer_paged_emulator(
        pool.q, pool.k, pool.v, f.qo_indptr, f.kv_indptr, f.kv_indices, f.kv_last_page_len, None, SCALE
    )
    check_close(got, want)
    a = fa3_args(vr, pool.slots)
    cache = (pool.k[:, None], pool.v[:, None])  # page size 1: [slots, 1, heads, d]
    check_close(fa3_kvcache_emulator(pool.q, *cache, a.page_table, a.cache_seqlens, a.cu_seqlens_q, SCALE), want)


@settings(max_examples=100, **PROPS)
@given(subpasses(groups=False, masks=False))
def test_fa3_with_pages_matches_reference_attention(sp: SubPass) -> None:
    page_size = 4
    vr, pool = sp.plan(), make_pool(sp, page_size=page_size)
    want = reference_attention(pool.q, pool.k, pool.v, pool.slots, sp.positions, None, SCALE)
    a = fa3_args(vr, pool.slots, page_size=page_size)
    k_cache = pool.k.view(-1, page_size, KV_HEADS, HEAD_DIM)
    v_cache = pool.v.view(-1, page_size, KV_HEADS, HEAD_DIM)
    got = fa3_kvcache_emulator(pool.q, k_cache, v_cache, a.page_table, a.cache_seqlens, a.cu_seqlens_q, SCALE)
    check_close(got, want)


@st.composite
def decode_batches(draw) -> tuple[list[torch.Tensor], list[torch.Tensor | None], int]:
    seed = draw(st.integers(0, 2**31 - 1))
    g = torch.Generator().manual_seed(seed)
    lens = draw(st.lists(st.integers(1, 120), min_size=1, max_size=4))
    perm = torch.randperm(sum(lens) + 7, generator=g)
    slots = list(torch.split(perm[: sum(lens)], lens))
    visible = []
    for n in lens:
        if draw(st.booleans()):
            visible.append(None)
        else:
            mask = torch.rand(n, generator=g) < draw(st.sampled_from([0.0, 0.5, 0.9]))
            mask[-1] = True
            visible.append(mask)
    return slots, visible, seed


@settings(max_examples=150, **PROPS)
@given(decode_batches())
def test_decode_lists_match_reference_attention(batch) -> None:
    slots, visible, seed = batch
    g = torch.Generator().manual_seed(seed)
    num_slots = sum(s.numel() for s in slots) + 7
    k = torch.randn(num_slots, KV_HEADS, HEAD_DIM, generator=g)
    v = torch.randn(num_slots, KV_HEADS, HEAD_DIM, generator=g)
    q = torch.randn(len(slots), Q_HEADS, HEAD_DIM, generator=g)
    kv_indptr, kv_indices = decode_kv_lists(slots, visible)
    assert kv_indptr.dtype == torch.int32 and kv_indices.dtype == torch.int64
    want = torch.cat([
        reference_attention(q[b : b + 1], k, v, s, torch.tensor([s.numel() - 1]), visible[b], SCALE)
        for b, s in enumerate(slots)
    ])
    check_close(decode_emulator(q, k, v, kv_indptr, kv_indices, SCALE), want)


# -------------------------------------------------------------------------------------- plan shape


@settings(max_examples=300, **PROPS)
@given(subpasses(masks=False), st.integers(1, 16))
def test_groups_pack_rows_in_sorted_order(sp: SubPass, group_size: int) -> None:
    vr = plan_groups(sp.positions, group_size=group_size)
    n = sp.positions.numel()
    assert vr.num_requests == math.ceil(n / group_size) and bool(vr.is_group.all())
    assert vr.qo_indptr.tolist() == [*range(0, n, group_size), n]
    last = sp.positions[vr.qo_indptr[1:] - 1]
    assert torch.equal(vr.keys_per_request, last + 1)  # every key up to the group's last row


def test_groups_of_a_worked_example() -> None:
    vr = plan_groups(torch.tensor([1, 3, 5, 7, 9, 20, 21, 22, 23, 30, 32]), group_size=3)
    assert vr.qo_indptr.tolist() == [0, 3, 6, 9, 11]
    assert vr.keys_per_request.tolist() == [6, 21, 24, 33]


@settings(max_examples=200, **PROPS)
@given(subpasses(), st.integers(1, 40), st.integers(1, 16))
def test_steps_cover_the_rows_in_order(sp: SubPass, chunk_rows: int, group_size: int) -> None:
    """The runtime's upper pass: at most ``chunk_rows`` rows a step, the rows below ``runs_from`` in groups of
    ``group_size`` (the step's first rows), the rest in runs; every step planned alone."""
    steps = plan_steps(sp.positions, sp.visible, chunk_rows=chunk_rows, group_size=group_size, runs_from=sp.runs_from)
    assert [s.index for s in steps] == list(range(len(steps))) and {s.count for s in steps} == {len(steps)}
    assert torch.equal(torch.cat([s.positions for s in steps]), sp.positions)
    for s in steps:
        assert 1 <= s.num_rows <= chunk_rows and torch.equal(s.positions, sp.positions[s.rows])
        below = int((s.positions < sp.runs_from).sum()) if sp.runs_from is not None else 0
        assert s.group_rows == below
        if s.groups is not None:
            assert torch.equal(s.groups.positions, s.positions[:below]) and bool(s.groups.is_group.all())
            assert int(s.groups.rows_per_request.max()) <= group_size
        if s.runs is not None:
            assert torch.equal(s.runs.positions, s.positions[below:]) and not s.runs.has_groups
        assert sum(s.lens) == s.num_rows and len(s.lens) == len(s.seq_lens) == s.num_requests
        assert s.seq_lens == [int(p.seq_lens[j]) for p in s.parts for j in range(p.num_requests)]


@settings(max_examples=150, **PROPS)
@given(subpasses())
def test_group_masks_are_built_on_the_device_and_sized_by_their_groups(sp: SubPass) -> None:
    """No builder makes a mask on the host; a group's mask holds ``rows x (keys + rows)`` entries, never the
    whole request's ``[rows, seq_len]`` per row of the sub-pass."""
    pool = make_pool(sp)
    counts = ledger.Counts()
    with ledger.record(counts):
        runs = sp.plan()
        assert triton_run_args(runs, pool.slots).custom_mask is None
        flashinfer_paged_args(runs, pool.slots)
        fa3_args(runs, pool.slots)
        groups = plan_groups(sp.positions, sp.visible, group_size=sp.group_size or 4)
        a = triton_group_args(groups, pool.slots)
    rows, widths = groups.rows_per_request, groups.keys_per_request
    assert a.custom_mask.numel() == int((rows * (widths + rows)).sum())
    assert a.custom_mask.numel() <= groups.num_rows * (int(widths.max()) + int(rows.max()))
    assert counts.values[ledger.HOST_MASK_BYTES] == 0
    assert counts.values[ledger.DEVICE_MASK_BYTES] == a.custom_mask.numel()
    assert counts.values[ledger.PLANNER_CALLS] == 2



def test_a_mask_too_large_to_keep_is_built_for_each_launch(monkeypatch) -> None:
    import sgl_ridgefill.attention.metadata as metadata

    groups = plan_groups(torch.tensor([3, 9, 30, 31, 47]), group_size=2)
    slots = torch.randperm(64)
    kept = metadata.triton_group_args(groups, slots)
    monkeypatch.setattr(metadata, "MASK_CACHE_BYTES", 0)
    counts = ledger.Counts()
    with ledger.record(counts):
        lazy = metadata.triton_group_args(groups, slots)
        assert lazy.custom_mask is None and counts.values[ledger.DEVICE_MASK_BYTES] == 0
        assert torch.equal(lazy.mask(), kept.mask()) and torch.equal(lazy.mask(), kept.custom_mask)
    assert counts.values[ledger.DEVICE_MASK_BYTES] == 2 * kept.custom_mask.numel()  # built once per launch


@settings(max_examples=100, **PROPS)
@given(subpasses())
def test_plan_fields(sp: SubPass) -> None:
    vr = sp.plan()
    starts, lengths = runs_of(sp.positions)
    assert torch.equal(torch.repeat_interleave(starts, lengths) + _offsets(lengths), sp.positions)
    assert bool((starts[1:] > starts[:-1] + lengths[:-1]).all()), "runs are maximal"
    assert torch.equal(vr.rows_per_request, lengths) and not vr.has_groups
    for name in ("positions", "qo_indptr", "key_indptr", "key_positions", "visible_positions"):
        assert getattr(vr, name).dtype == torch.int64, name
    assert vr.is_group.dtype == torch.bool
    last = sp.positions[vr.qo_indptr[1:] - 1]
    assert torch.equal(vr.seq_lens, last + 1)
    for j in range(vr.num_requests):
        keys = vr.key_positions[int(vr.key_indptr[j]) : int(vr.key_indptr[j + 1])]
        want = torch.arange(int(last[j]) + 1)
        if sp.visible is not None:
            want = want[sp.visible[: int(last[j]) + 1]]
        assert torch.equal(keys, want)
    assert vr.max_rows == int(vr.rows_per_request.max()) and vr.num_rows == sp.positions.numel()


def _offsets(lengths: torch.Tensor) -> torch.Tensor:
    return torch.cat([torch.arange(int(n)) for n in lengths])


def test_argument_dtypes() -> None:
    positions = torch.tensor([2, 3, 7, 9, 10, 11])
    slots = torch.randperm(16)[:12]
    vr = plan_virtual_requests(positions)
    t = triton_run_args(vr, slots)
    assert (t.qo_indptr.dtype, t.kv_indptr.dtype, t.kv_indices.dtype) == (torch.int64, torch.int32, torch.int64)
    assert t.custom_mask is None and t.mask_indptr is None
    assert (t.skip_prefix_custom_mask, t.skip_extend) == (True, False) and t.max_extend_len == vr.max_rows
    g = triton_group_args(plan_groups(positions, group_size=4), slots)
    assert (g.qo_indptr.dtype, g.kv_indptr.dtype, g.kv_indices.dtype) == (torch.int64, torch.int32, torch.int64)
    assert g.custom_mask.dtype == torch.uint8 and g.mask_indptr.dtype == torch.int64
    assert (g.skip_prefix_custom_mask, g.skip_extend) == (False, True) and g.max_extend_len == 4
    f = flashinfer_paged_args(vr, slots)
    assert {x.dtype for x in (f.qo_indptr, f.kv_indptr, f.kv_indices, f.kv_last_page_len)} == {torch.int32}
    a = fa3_args(vr, slots)
    assert {x.dtype for x in (a.cu_seqlens_q, a.cache_seqlens, a.page_table)} == {torch.int32}
    assert (a.max_seqlen_q, a.max_seqlen_k) == (3, 12)


# -------------------------------------------------------------------- FlashInfer's ragged path is wrong


def test_ragged_order_reads_stale_rows_of_earlier_runs() -> None:
    """Why FlashInfer sub-passes must be planned on the paged path.

    SGLang's default (ragged) FlashInfer extend reads a request's prefix from the pool *before* this
    forward's K/V are written. With runs {5, 6}, {20} and the tail 30..39, the later runs' prefixes hold
    rows 5, 6 and 20, whose slots still carry their filled (stale) K/V: their outputs are wrong, while the
    first run (its prefix holds no query row) and the paged path (K/V written first) are exact.
    """
    sp = SubPass(40, torch.tensor([5, 6, 20, *range(30, 40)]), None, None, seed=11)
    vr, pool = sp.plan(), make_pool(sp)
    rows = pool.slots[sp.positions]
    k_stale, v_stale = pool.k.clone(), pool.v.clone()
    k_stale[rows] = torch.randn_like(k_stale[rows])  # what the fill wrote for these rows
    v_stale[rows] = torch.randn_like(v_stale[rows])
    want = reference_attention(pool.q, pool.k, pool.v, pool.slots, sp.positions, None, SCALE)
    a = triton_run_args(vr, pool.slots)  # prefix lists = SGLang's ragged plan (keys before each run)
    got = ragged_order_emulator(
        pool.q, pool.k[rows], pool.v[rows], k_stale, v_stale, rows, a.qo_indptr, a.kv_indptr, a.kv_indices, SCALE
    )
    error = (got - want).abs().amax(dim=(1, 2))
    assert float(error[:2].max()) < 1e-5  # first run: exact
    assert float(error[2:].min()) > 1e-3  # every later row read a stale earlier row
    assert torch.equal(k_stale, pool.k) and torch.equal(v_stale, pool.v)  # written only afterwards
    f = flashinfer_paged_args(vr, pool.slots)
    paged = flashinfer_paged_emulator(
        pool.q, pool.k, pool.v, f.qo_indptr, f.kv_indptr, f.kv_indices, f.kv_last_page_len, None, SCALE
    )
    check_close(paged, want)


@settings(max_examples=100, **PROPS)
@given(subpasses(groups=False))
def test_ragged_order_is_wrong_whenever_a_later_run_sees_an_earlier_one(sp: SubPass) -> None:
    vr, pool = sp.plan(), make_pool(sp)
    rows = pool.slots[sp.positions]
    k_stale, v_stale = pool.k.clone(), pool.v.clone()
    k_stale[rows] += 1.0 + torch.rand_like(k_stale[rows])
    v_stale[rows] += 1.0 + torch.rand_like(v_stale[rows])
    want = reference_attention(pool.q, pool.k, pool.v, pool.slots, sp.positions, sp.visible, SCALE)
    a = triton_run_args(vr, pool.slots)
    got = ragged_order_emulator(
        pool.q, pool.k[rows], pool.v[rows], k_stale, v_stale, rows, a.qo_indptr, a.kv_indptr, a.kv_indices, SCALE
    )
    first = int(vr.qo_indptr[1])
    check_close(got[:first], want[:first])
    if vr.num_requests >= 2:
        assert float((got[first:] - want[first:]).abs().max()) > 1e-4


# -------------------------------------------------------------------------------------------- errors


def _raises(message: str):
    return pytest.raises(ValueError, match=f"^{re.escape(message)}$")


@pytest.mark.parametrize("builder", [triton_run_args, flashinfer_paged_args, fa3_args], ids=lambda f: f.__name__)
def test_run_builders_refuse_groups(builder) -> None:
    vr = plan_groups(torch.tensor([1, 3, 5]), group_size=4)
    with _raises(f"{builder.__name__} takes runs only; groups go through triton_group_args"):
        builder(vr, torch.arange(8))


def test_fa3_with_pages_refuses_hidden_keys() -> None:
    visible = torch.ones(8, dtype=torch.bool)
    visible[2] = False
    vr = plan_virtual_requests(torch.tensor([6, 7]), visible)
    fa3_args(vr, torch.arange(8), page_size=1)  # fine at page size 1
    fa3_args(plan_virtual_requests(torch.tensor([6, 7]), torch.ones(8, dtype=torch.bool)), torch.arange(8), page_size=4)
    with _raises(
        "fa3 with page_size=4 cannot hide keys: its page table names whole pages, so a plan with a visible mask "
        "that hides keys needs page_size=1"
    ):
        fa3_args(vr, torch.arange(8), page_size=4)


def test_fa3_argument_errors() -> None:
    vr = plan_virtual_requests(torch.tensor([6, 7]))
    with _raises("page_size must be an int >= 1, got 0"):
        fa3_args(vr, torch.arange(8), page_size=0)
    with _raises("max_context_len=6 is below the longest key list (8 keys)"):
        fa3_args(vr, torch.arange(8), max_context_len=6)


@pytest.mark.parametrize(
    ("positions", "message"),
    [
        (torch.tensor([3, 1]), "positions must be sorted and unique: positions[0]=3 is followed by 1"),
        (torch.tensor([0, 4, 4]), "positions must be sorted and unique: positions[1]=4 is followed by 4"),
        (torch.tensor([-1, 2]), "positions must be >= 0, got -1"),
        (torch.tensor([], dtype=torch.int64), "positions is empty: a sub-pass needs at least one query row"),
        (torch.tensor([0.0, 1.0]), "positions must be a 1-D integer tensor, got (2,) of dtype torch.float32"),
        (torch.tensor([[0, 1]]), "positions must be a 1-D integer tensor, got (1, 2) of dtype torch.int64"),
        ([0, 1], "positions must be a 1-D integer tensor, got list of dtype None"),
    ],
)
def test_invalid_positions(positions, message: str) -> None:
    with _raises(message):
        plan_virtual_requests(positions)


@pytest.mark.parametrize("group_size", [0, -2, True, 2.0, "4", None])
def test_invalid_group_size(group_size) -> None:
    with _raises(f"group_size must be an int >= 1, got {group_size!r}"):
        plan_groups(torch.tensor([1, 2]), group_size=group_size)


@pytest.mark.parametrize("chunk_rows", [0, -1, 1.5, None])
def test_invalid_chunk_rows(chunk_rows) -> None:
    with _raises(f"chunk_rows must be an int >= 1, got {chunk_rows!r}"):
        plan_steps(torch.tensor([1, 2]), chunk_rows=chunk_rows, group_size=4)


def test_invalid_visible() -> None:
    positions = torch.tensor([1, 5, 9])
    with _raises("visible has 9 entries but the last query position is 9: it needs at least 10"):
        plan_virtual_requests(positions, torch.ones(9, dtype=torch.bool))
    with _raises("visible must be a 1-D bool tensor, got (10,) of dtype torch.int64"):
        plan_virtual_requests(positions, torch.ones(10, dtype=torch.int64))
    hidden = torch.ones(10, dtype=torch.bool)
    hidden[[1, 9]] = False
    with _raises("query positions must be visible, but visible is False at positions [1, 9]"):
        plan_virtual_requests(positions, hidden)
    many = torch.zeros(40, dtype=torch.bool)
    with _raises(
        "query positions must be visible, but visible is False at positions [0, 1, 2, 3, 4, 5, 6, 7] and 2 more"
    ):
        plan_virtual_requests(torch.arange(10), many)


def test_invalid_decode_lists() -> None:
    with _raises("decode_kv_lists needs at least one decode request"):
        decode_kv_lists([], [])
    with _raises("got 1 slot rows but 2 visible masks"):
        decode_kv_lists([torch.arange(3)], [None, None])
    with _raises("visible[0] has 2 entries but slots_rows[0] has 3"):
        decode_kv_lists([torch.arange(3)], [torch.ones(2, dtype=torch.bool)])
    with _raises("visible[0] hides the decode token (its last position 2)"):
        decode_kv_lists([torch.arange(3)], [torch.tensor([True, True, False])])
    with _raises("slots_rows[0] must be a non-empty 1-D tensor, got shape (0,)"):
        decode_kv_lists([torch.arange(0)], [None])


def test_runs_of_empty_and_single() -> None:
    starts, lengths = runs_of(torch.tensor([], dtype=torch.int64))
    assert starts.numel() == 0 and lengths.numel() == 0
    starts, lengths = runs_of(torch.tensor([4, 5, 6, 9, 11, 12]))
    assert starts.tolist() == [4, 9, 11] and lengths.tolist() == [3, 1, 2]
