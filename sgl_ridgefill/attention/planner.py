"""Row queries of one request as virtual extend requests, and the metadata each SGLang backend needs for them.

A sub-pass runs query rows at sorted unique positions ``P`` of one request's context ``[0, seq_len)``; the row
at ``p`` attends to the keys ``{k <= p : visible[k]}``, the other rows' K/V included (they are written to the pool
before attention). Stock extend kernels run it as several extend requests of the same request: one per maximal
run of consecutive positions, or in grouped mode up to ``G`` scattered rows under a custom mask
``key_pos <= q_pos``. Engine-free: imports torch and the standard library only.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

_I64 = torch.int64
_I32 = torch.int32


# ------------------------------------------------------------------------------------------------- plan


@dataclass(frozen=True)
class VirtualRequests:
    """How the query rows of one sub-pass over one request split into virtual extend requests (CPU tensors).

    positions:         [n] int64, sorted unique query positions (row ``i`` of the sub-pass is ``positions[i]``)
    qo_indptr:         [R+1] int64, request ``j`` owns query rows ``qo_indptr[j]:qo_indptr[j+1]``
    is_group:          [R] bool, True = a group (custom mask ``key_pos <= q_pos``), False = a run (consecutive
                       positions, causal)
    key_indptr:        [R+1] int64
    visible_positions: [v] int64, the visible positions up to the last query position, ascending; the keys of
                       request ``j`` are its first ``key_indptr[j+1] - key_indptr[j]`` entries
    key_positions:     [key_indptr[-1]] int64 (property, built on first use), for request ``j`` the visible key
                       positions ``<=`` its last query position, ascending, its own query positions included
    """

    positions: torch.Tensor
    qo_indptr: torch.Tensor
    is_group: torch.Tensor
    key_indptr: torch.Tensor
    visible_positions: torch.Tensor

    def __post_init__(self) -> None:
        r = self.is_group.numel()
        assert self.qo_indptr.shape == (r + 1,) and self.key_indptr.shape == (r + 1,)
        assert int(self.qo_indptr[-1]) == self.positions.numel()

    @functools.cached_property
    def key_positions(self) -> torch.Tensor:
        # Built on demand: R key lists can hold R * seq_len entries, which the backends never need on the host.
        return _concat_prefixes(self.visible_positions, self.keys_per_request)

    @property
    def num_requests(self) -> int:
        return self.is_group.numel()

    @property
    def num_rows(self) -> int:
        return self.positions.numel()

    @property
    def rows_per_request(self) -> torch.Tensor:
        """[R] int64, query rows of each request."""
        return torch.diff(self.qo_indptr)

    @property
    def keys_per_request(self) -> torch.Tensor:
        """[R] int64, keys of each request (its own rows included)."""
        return torch.diff(self.key_indptr)

    @property
    def max_rows(self) -> int:
        return int(self.rows_per_request.max()) if self.num_requests else 0

    @property
    def seq_lens(self) -> torch.Tensor:
        """[R] int64, last query position + 1 of each request."""
        return self.positions[self.qo_indptr[1:] - 1] + 1

    @property
    def has_groups(self) -> bool:
        return bool(self.is_group.any())


def runs_of(positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """positions: [n] int64 CPU, sorted unique -> (starts [R], lengths [R]) of maximal consecutive runs."""
    positions = _checked_positions(positions, allow_empty=True)
    first = _run_first_rows(positions)
    return positions[first], torch.diff(first, append=first.new_tensor([positions.numel()]))


def plan_virtual_requests(
    positions: torch.Tensor,
    visible: torch.Tensor | None = None,
    *,
    group_size: int | None = None,
    runs_from: int | None = None,
) -> VirtualRequests:
    """Split the query rows at ``positions`` into virtual extend requests.

    positions: [n] int64 CPU, sorted unique; visible: [seq_len] bool CPU or None (all keys visible), with
    ``seq_len > positions[-1]`` and every query position visible. Without ``group_size`` each maximal run of
    consecutive positions is one request. With ``group_size=G``, runs of at least ``G`` rows stay runs and the
    other rows are packed in sorted order into groups of up to ``G`` rows; a group closes where a long run
    starts, and a group whose rows are consecutive positions is emitted as a run. With ``runs_from`` as
    well, the rows at positions below it are packed into groups whatever their runs, and the rows from it on
    (a RidgeFill tail) form runs: at most ``ceil(rows below / G)`` groups plus the runs from ``runs_from`` on.
    """
    positions = _checked_positions(positions, allow_empty=False)
    if group_size is not None and (type(group_size) is not int or group_size < 1):
        raise ValueError(f"group_size must be an int >= 1 or None, got {group_size!r}")
    visible_positions = _visible_positions(positions, visible)
    n = positions.numel()
    if group_size is None:
        first = _run_first_rows(positions)
    elif runs_from is None:
        first = _group_first_rows(positions, group_size)
    else:
        first = _split_first_rows(positions, group_size, runs_from)
    qo_indptr = torch.cat([first, first.new_tensor([n])])
    last = positions[qo_indptr[1:] - 1]
    is_group = last - positions[first] + 1 != torch.diff(qo_indptr)
    # Every request's keys are a prefix of the visible positions: those <= its last query position.
    key_indptr = _indptr(torch.searchsorted(visible_positions, last, right=True))
    return VirtualRequests(positions, qo_indptr, is_group, key_indptr, visible_positions)


def split_by_kind(
    vr: VirtualRequests,
) -> tuple[VirtualRequests | None, torch.Tensor, VirtualRequests | None, torch.Tensor]:
    """(runs, run_rows, groups, group_rows): the runs and the groups of ``vr`` as two plans of their own.

    run_rows / group_rows: [n_runs] / [n_groups] int64, the sub-pass rows (indices into ``vr.positions``) of
    each part, in the part's row order; a part without requests is None with empty rows. A backend whose one
    launch cannot mix masked and causal requests runs the two parts as two launches.
    """
    runs, run_rows = _select_requests(vr, ~vr.is_group)
    groups, group_rows = _select_requests(vr, vr.is_group)
    return runs, run_rows, groups, group_rows


# ------------------------------------------------------------------------------------------ backends


@dataclass(frozen=True)
class TritonExtendArgs:
    """Arguments of SGLang's Triton ``extend_attention_fwd`` for one plan; tensors on the slots' device.

    qo_indptr:   [R+1] int64
    kv_indptr:   [R+1] int32, the prefix keys read from the pool by stage 1
    kv_indices:  [kv_indptr[-1]] int64, pool slots of the prefix keys
    custom_mask: flat uint8 (row-major ``[qo_len, prefix_len + qo_len]`` per request) or None
    mask_indptr: [R+1] int64 or None
    max_extend_len: most query rows of one request
    skip_prefix_custom_mask / skip_extend: the launcher's flags of the same names
    """

    qo_indptr: torch.Tensor
    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor
    custom_mask: torch.Tensor | None
    mask_indptr: torch.Tensor | None
    max_extend_len: int
    skip_prefix_custom_mask: bool
    skip_extend: bool


def triton_extend_args(vr: VirtualRequests, slots: torch.Tensor) -> TritonExtendArgs:
    """SGLang Triton extend metadata for ``vr``; slots: [seq_len] int pool slots of the request's positions.

    Without groups: each run reads the keys before it from the pool (stage 1, unmasked) and its own rows
    from ``k_extend``/``v_extend`` (stage 2, causal by index), as a stock extend does. With any group, one
    launch cannot mix masked and unmasked requests, so every request reads all its keys from the pool (its
    own rows are already written) under a custom mask ``key_pos <= q_pos``, with stage 2 dropped
    (``skip_prefix_custom_mask=False``, ``skip_extend=True``); use :func:`split_by_kind` for two launches.
    """
    device = slots.device
    rows = vr.rows_per_request
    custom_mask = mask_indptr = None
    if not vr.has_groups:
        # A run's own rows are the last ``rows`` entries of its key list (consecutive, all visible).
        prefix_lens = vr.keys_per_request - rows
    else:
        prefix_lens = vr.keys_per_request
        # [qo_len, kv_len + qo_len] per request: prefix columns key_pos <= q_pos, extend columns 0.
        widths = prefix_lens + rows
        custom_mask = _prefix_masks(vr, widths).to(torch.uint8).to(device)
        mask_indptr = _indptr(rows * widths).to(device)
    return TritonExtendArgs(
        qo_indptr=vr.qo_indptr.to(device),
        kv_indptr=_indptr(prefix_lens).to(_I32).to(device),
        kv_indices=_concat_prefixes(_visible_slots(vr, slots), prefix_lens).to(_I64),
        custom_mask=custom_mask,
        mask_indptr=mask_indptr,
        max_extend_len=vr.max_rows,
        skip_prefix_custom_mask=not vr.has_groups,
        skip_extend=vr.has_groups,
    )


@dataclass(frozen=True)
class FlashInferPagedArgs:
    """Arguments of FlashInfer's paged prefill ``plan()`` at page size 1 (SGLang's FlashInfer planning).

    qo_indptr:        [R+1] int32, host (``plan()`` reads it on the host and copies it to its buffers)
    kv_indptr:        [R+1] int32, host
    kv_indices:       [kv_indptr[-1]] int32, pool slots of every request's keys, own rows included; slots' device
    kv_last_page_len: [R] int32 ones, host
    custom_mask:      flat bool (row-major ``[qo_len, kv_len]`` per request) on the slots' device, or None
    """

    qo_indptr: torch.Tensor
    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor
    kv_last_page_len: torch.Tensor
    custom_mask: torch.Tensor | None


def flashinfer_paged_args(vr: VirtualRequests, slots: torch.Tensor) -> FlashInferPagedArgs:
    """FlashInfer paged-prefill metadata for ``vr``; slots: [seq_len] int pool slots of the request's positions.

    ``causal=True`` is bottom-right aligned (row ``i`` keeps key index ``<= i + kv_len - qo_len``), which for a
    run over its compacted key list is exactly ``key_pos <= q_pos``. With any group every request gets a
    custom mask (a planned custom mask applies to the whole batch); a run's mask is that causal mask.
    Must run on the paged path, which writes K/V before attention; the ragged path writes it after.
    """
    custom_mask = _prefix_masks(vr, vr.keys_per_request).to(slots.device) if vr.has_groups else None
    return FlashInferPagedArgs(
        qo_indptr=vr.qo_indptr.to(_I32),
        kv_indptr=vr.key_indptr.to(_I32),
        kv_indices=_concat_prefixes(_visible_slots(vr, slots), vr.keys_per_request).to(_I32),
        kv_last_page_len=torch.ones(vr.num_requests, dtype=_I32),
        custom_mask=custom_mask,
    )


@dataclass(frozen=True)
class Fa3Args:
    """Arguments of ``flash_attn_with_kvcache`` as SGLang's fa3 backend passes them; tensors on the slots' device.

    cu_seqlens_q:  [R+1] int32
    cache_seqlens: [R] int32, keys of each request
    page_table:    [R, max_k_pages] int32, key ``c`` of request ``j`` is token ``c % page_size`` of page
                   ``page_table[j, c // page_size]``; entries past a request's pages are 0
    max_seqlen_q / max_seqlen_k: most query rows / keys of one request
    """

    cu_seqlens_q: torch.Tensor
    cache_seqlens: torch.Tensor
    page_table: torch.Tensor
    max_seqlen_q: int
    max_seqlen_k: int


def fa3_args(
    vr: VirtualRequests, slots: torch.Tensor, *, page_size: int = 1, max_context_len: int | None = None
) -> Fa3Args:
    """fa3 metadata for ``vr``; slots: [seq_len] int pool slots, page-aligned when ``page_size > 1``.

    ``causal=True`` is bottom-right aligned as in FlashInfer, so runs over compacted key lists are exact at
    page size 1. fa3 has no custom mask (no groups), and with ``page_size > 1`` a page table can only name
    whole pages, so every request's keys must be all positions ``[0, last]`` (no hidden key).
    ``max_context_len`` fixes the page table's width (``ceil(max_context_len / page_size)`` columns).
    """
    if vr.has_groups:
        raise ValueError(
            "fa3 cannot run grouped requests: flash_attn_with_kvcache has no custom mask; plan without group_size"
        )
    if type(page_size) is not int or page_size < 1:
        raise ValueError(f"page_size must be an int >= 1, got {page_size!r}")
    key_lens = vr.keys_per_request
    if page_size > 1 and not torch.equal(key_lens, vr.seq_lens):
        raise ValueError(
            f"fa3 with page_size={page_size} cannot hide keys: its page table names whole pages, so a plan with a "
            "visible mask that hides keys needs page_size=1"
        )
    max_k = int(key_lens.max())
    width = max_k if max_context_len is None else max_context_len
    if width < max_k:
        raise ValueError(f"max_context_len={max_context_len} is below the longest key list ({max_k} keys)")
    # Key lists are prefixes of one list, so every row of the table is a prefix of one row: column m holds
    # key m * page_size (the first token of a page; keys are [0, last] when page_size > 1).
    device = slots.device
    visible_slots = _visible_slots(vr, slots)  # [v]
    first_key = torch.arange(0, -(-width // page_size) * page_size, page_size, device=device)  # [pages]
    row = visible_slots[first_key.clamp_max(visible_slots.numel() - 1)] // page_size
    valid = first_key[None, :] < key_lens.to(device)[:, None]  # [R, pages]
    table = torch.where(valid, row[None, :], 0).to(_I32)
    return Fa3Args(
        cu_seqlens_q=vr.qo_indptr.to(_I32).to(device),
        cache_seqlens=key_lens.to(_I32).to(device),
        page_table=table,
        max_seqlen_q=vr.max_rows,
        max_seqlen_k=max_k,
    )


def decode_kv_lists(
    slots_rows: list[torch.Tensor], visible: list[torch.Tensor | None]
) -> tuple[torch.Tensor, torch.Tensor]:
    """(kv_indptr [B+1] int32, kv_indices [kv_indptr[-1]] int64) on the slots' device for one decode step.

    slots_rows[b]: [seq_len_b] int pool slots of decode request ``b`` (its new token last); visible[b]:
    [seq_len_b] bool CPU or None (all visible). Hidden keys are left out of the lists, the layout of SGLang's
    Triton ``decode_attention_fwd`` (FlashInfer's decode plan takes the same lists at page size 1).
    """
    if not slots_rows:
        raise ValueError("decode_kv_lists needs at least one decode request")
    if len(visible) != len(slots_rows):
        raise ValueError(f"got {len(slots_rows)} slot rows but {len(visible)} visible masks")
    device = slots_rows[0].device
    lens = torch.tensor([s.numel() for s in slots_rows], dtype=_I64)
    picks = []
    for b, (row, mask) in enumerate(zip(slots_rows, visible)):
        if row.ndim != 1 or row.numel() == 0:
            raise ValueError(f"slots_rows[{b}] must be a non-empty 1-D tensor, got shape {tuple(row.shape)}")
        if mask is None:
            picks.append(torch.arange(row.numel()))
            continue
        _check_mask(mask, f"visible[{b}]")
        if mask.numel() != row.numel():
            raise ValueError(f"visible[{b}] has {mask.numel()} entries but slots_rows[{b}] has {row.numel()}")
        if not bool(mask[-1]):
            raise ValueError(f"visible[{b}] hides the decode token (its last position {row.numel() - 1})")
        picks.append(torch.nonzero(mask).flatten())
    counts = torch.tensor([p.numel() for p in picks], dtype=_I64)
    kv_indptr = _indptr(counts).to(_I32).to(device)
    flat = torch.cat(slots_rows)
    if all(m is None for m in visible):
        return kv_indptr, flat.to(_I64)
    index = torch.cat(picks) + torch.repeat_interleave(_indptr(lens)[:-1], counts)
    return kv_indptr, flat[index.to(device)].to(_I64)


# ------------------------------------------------------------------------------------------- helpers


def _indptr(lengths: torch.Tensor) -> torch.Tensor:
    """[R] -> [R+1] int64 exclusive prefix sums."""
    return torch.cat([torch.zeros(1, dtype=_I64), torch.cumsum(lengths, 0)])


def _offsets_within(lengths: torch.Tensor, total: int) -> torch.Tensor:
    """[total] int64, each element's index within its segment, for segments of ``lengths`` laid end to end."""
    starts = _indptr(lengths)[:-1]
    return torch.arange(total, dtype=_I64) - torch.repeat_interleave(starts, lengths, output_size=total)


def _run_first_rows(positions: torch.Tensor) -> torch.Tensor:
    """[R] int64, the row where each maximal run of consecutive positions starts."""
    if positions.numel() == 0:
        return positions.new_zeros(0)
    breaks = torch.nonzero(positions[1:] != positions[:-1] + 1).flatten() + 1
    return torch.cat([breaks.new_zeros(1), breaks])


def _group_first_rows(positions: torch.Tensor, group_size: int) -> torch.Tensor:
    """[R] int64, the row where each request of the grouped mode starts.

    Runs of >= ``group_size`` rows are requests of their own; the other ("loose") rows form segments between
    them, each cut into groups of ``group_size`` rows counted from the segment's first row.
    """
    n = positions.numel()
    run_first = _run_first_rows(positions)
    run_len = torch.diff(run_first, append=run_first.new_tensor([n]))
    long_run = run_len >= group_size
    loose = ~torch.repeat_interleave(long_run, run_len, output_size=n)  # [n]
    row = torch.arange(n, dtype=_I64)
    segment_first = loose & torch.cat([loose.new_ones(1), ~loose[:-1]])
    segment_start = torch.cummax(torch.where(segment_first, row, 0), 0).values
    first = loose & ((row - segment_start) % group_size == 0)
    first[run_first[long_run]] = True
    return torch.nonzero(first).flatten()


def _split_first_rows(positions: torch.Tensor, group_size: int, runs_from: int) -> torch.Tensor:
    """[R] int64 request starts: rows below ``runs_from`` (a prefix of the sorted rows) in groups of
    ``group_size`` rows, every maximal run from ``runs_from`` on a request of its own."""
    n = positions.numel()
    row = torch.arange(n, dtype=_I64)
    grouped = positions < runs_from
    first = grouped & (row % group_size == 0)
    starts_run = torch.ones(n, dtype=torch.bool)
    starts_run[1:] = (positions[1:] != positions[:-1] + 1) | grouped[:-1]
    first |= ~grouped & starts_run
    return torch.nonzero(first).flatten()


def _visible_slots(vr: VirtualRequests, slots: torch.Tensor) -> torch.Tensor:
    """[v] pool slots of the visible positions every key list draws from (the one gather on the device).

    The last request has the longest key list (requests ascend), and every other list is a prefix of it.
    """
    longest = int(vr.key_indptr[-1] - vr.key_indptr[-2])
    return slots[vr.visible_positions[:longest].to(slots.device)]


def _concat_prefixes(values: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """[sum(lengths)]: ``values[:lengths[0]]``, ``values[:lengths[1]]``, ... end to end.

    One slice per request, copied by one ``cat``: the output can hold R * seq_len entries, and this copies
    each once (several times faster on CPU than building an index of that size and gathering through it).
    """
    if lengths.numel() == 0:
        return values[:0]
    return torch.cat([values[:k] for k in lengths.tolist()])


def _prefix_masks(vr: VirtualRequests, widths: torch.Tensor) -> torch.Tensor:
    """Flat bool, row-major ``[qo_len_j, widths[j]]`` per request ``j``: column ``c`` of query row ``i`` is True
    iff key ``c`` of its request has position <= ``positions[i]``.

    Key lists ascend, so each mask row is ``admitted[i]`` Trues then Falses: a window of ``widths[j]`` entries
    into ``[True] * L + [False] * L`` starting at ``L - admitted[i]``.
    """
    admitted = torch.searchsorted(vr.visible_positions, vr.positions, right=True)  # [n] keys <= q_pos
    longest = int(widths.max())
    pattern = torch.cat([torch.ones(longest, dtype=torch.bool), torch.zeros(longest, dtype=torch.bool)])
    bounds = vr.qo_indptr.tolist()
    blocks = []
    for j, width in enumerate(widths.tolist()):
        windows = pattern.unfold(0, width, 1)  # [2 * longest - width + 1, width], window s = pattern[s : s + width]
        blocks.append(windows[longest - admitted[bounds[j] : bounds[j + 1]]].reshape(-1))
    return torch.cat(blocks)


def _select_requests(vr: VirtualRequests, keep: torch.Tensor) -> tuple[VirtualRequests | None, torch.Tensor]:
    """The requests where ``keep`` ([R] bool) holds, as a plan over their rows; and those rows [m] int64."""
    rows = vr.rows_per_request[keep]
    if rows.numel() == 0:
        return None, torch.zeros(0, dtype=_I64)
    row_index = vr.qo_indptr[:-1][keep].repeat_interleave(rows) + _offsets_within(rows, int(rows.sum()))
    plan = VirtualRequests(
        positions=vr.positions[row_index],
        qo_indptr=_indptr(rows),
        is_group=vr.is_group[keep],
        key_indptr=_indptr(vr.keys_per_request[keep]),
        visible_positions=vr.visible_positions,
    )
    return plan, row_index


_INTEGER_DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)


def _checked_positions(positions: torch.Tensor, *, allow_empty: bool) -> torch.Tensor:
    """positions as [n] int64, or ValueError naming what is wrong with them."""
    if not isinstance(positions, torch.Tensor) or positions.ndim != 1 or positions.dtype not in _INTEGER_DTYPES:
        shape = tuple(positions.shape) if isinstance(positions, torch.Tensor) else type(positions).__name__
        raise ValueError(
            f"positions must be a 1-D integer tensor, got {shape} of dtype {getattr(positions, 'dtype', None)}"
        )
    if positions.device.type != "cpu":
        raise ValueError(f"positions must be a CPU tensor (plans are computed on the host), got {positions.device}")
    if positions.numel() == 0:
        if allow_empty:
            return positions.to(_I64)
        raise ValueError("positions is empty: a sub-pass needs at least one query row")
    positions = positions.to(_I64)
    if int(positions[0]) < 0:
        raise ValueError(f"positions must be >= 0, got {int(positions[0])}")
    bad = torch.nonzero(positions[1:] <= positions[:-1]).flatten()
    if bad.numel():
        i = int(bad[0])
        raise ValueError(
            f"positions must be sorted and unique: positions[{i}]={int(positions[i])} is followed by "
            f"{int(positions[i + 1])}"
        )
    return positions


def _check_mask(mask: torch.Tensor, name: str) -> None:
    if not isinstance(mask, torch.Tensor) or mask.ndim != 1 or mask.dtype != torch.bool:
        shape = tuple(mask.shape) if isinstance(mask, torch.Tensor) else type(mask).__name__
        raise ValueError(f"{name} must be a 1-D bool tensor, got {shape} of dtype {getattr(mask, 'dtype', None)}")
    if mask.device.type != "cpu":
        raise ValueError(f"{name} must be a CPU tensor (plans are computed on the host), got {mask.device}")


def _visible_positions(positions: torch.Tensor, visible: torch.Tensor | None) -> torch.Tensor:
    """[v] int64, the visible positions <= the last query position."""
    last = int(positions[-1])
    if visible is None:
        return torch.arange(last + 1, dtype=_I64)
    _check_mask(visible, "visible")
    if visible.numel() <= last:
        raise ValueError(
            f"visible has {visible.numel()} entries but the last query position is {last}: it needs at least "
            f"{last + 1}"
        )
    hidden = positions[~visible[positions]]
    if hidden.numel():
        shown = hidden[:8].tolist()
        more = f" and {hidden.numel() - 8} more" if hidden.numel() > 8 else ""
        raise ValueError(f"query positions must be visible, but visible is False at positions {shown}{more}")
    return torch.nonzero(visible[: last + 1]).flatten()
