"""The metadata each SGLang attention kernel needs for a plan of virtual requests (``planner.py``).

Every builder takes a host plan and the request's pool slots (``[seq_len]`` on the device) and returns the
kernel's arguments on the device, sent through ``staging.to_device`` (pinned, non-blocking), gathered from
the slots on the device, or, for the lists the host reads itself, on the host. No builder synchronises with
the device or builds a dense mask on the host:

- runs go without a mask: SGLang's Triton extend (:func:`triton_run_args`), FlashInfer's paged prefill
  (:func:`flashinfer_paged_args`) and fa3's ``flash_attn_with_kvcache`` (:func:`fa3_args`), as a stock extend;
- groups go through SGLang's Triton extend kernel on every backend (:func:`triton_group_args`): every key from
  the pool, own rows included, under a ``key_pos <= q_pos`` mask built on the device from the rows'
  positions, ``group rows x (keys + rows)`` entries per group.

Engine-free: imports torch and the standard library only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from .. import ledger
from .planner import VirtualRequests, check_mask, concat_prefixes, indptr
from .staging import to_device

_I64 = torch.int64
_I32 = torch.int32
# A step's group masks up to this size are built once and kept for every layer; larger ones (long contexts
# with many exact rows) are built again for each layer's launch, so they never all sit in memory at once.
MASK_CACHE_BYTES = 256 * 2**20


def visible_slots(vr: VirtualRequests, slots: torch.Tensor) -> torch.Tensor:
    """[v] pool slots of the visible positions every key list draws from, on the slots' device.

    The last request has the longest key list (requests ascend), and every other list is a prefix of it."""
    longest = int(vr.key_indptr[-1] - vr.key_indptr[-2])
    if vr.all_visible:
        return slots[:longest]
    (where,) = to_device(slots.device, vr.visible_positions[:longest])
    return slots[where]


# ------------------------------------------------------------------------------------------- Triton


@dataclass(frozen=True)
class TritonExtendArgs:
    """Arguments of SGLang's Triton ``extend_attention_fwd`` for one plan; tensors on the slots' device.

    qo_indptr:   [R+1] int64
    kv_indptr:   [R+1] int32, the keys read from the pool by stage 1
    kv_indices:  [kv_indptr[-1]] int64, pool slots of those keys
    custom_mask: flat uint8 (row-major ``[qo_len, prefix_len + qo_len]`` per request) or None
    mask_indptr: [R+1] int64 or None
    max_extend_len: most query rows of one request
    skip_prefix_custom_mask / skip_extend: the launcher's flags of the same names
    build_mask: builds ``custom_mask`` where it is too large to keep (:data:`MASK_CACHE_BYTES`), or None
    """

    qo_indptr: torch.Tensor
    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor
    custom_mask: torch.Tensor | None
    mask_indptr: torch.Tensor | None
    max_extend_len: int
    skip_prefix_custom_mask: bool
    skip_extend: bool
    build_mask: Callable[[], torch.Tensor] | None = None

    def mask(self) -> torch.Tensor | None:
        """The custom mask for one launch (kept, or built for it)."""
        return self.custom_mask if self.build_mask is None else self.build_mask()


def triton_run_args(runs: VirtualRequests, slots: torch.Tensor) -> TritonExtendArgs:
    """A stock extend per run: stage 1 reads the visible keys before the run from the pool (unmasked), stage 2
    the run's own rows from ``k_extend``/``v_extend``, causally by index. ``runs``: a plan without groups."""
    _no_groups(runs, "triton_run_args")
    prefix_lens = runs.keys_per_request - runs.rows_per_request  # a run's own rows end its key list
    kv_indices = concat_prefixes(visible_slots(runs, slots), prefix_lens).to(_I64)
    qo_indptr, kv_indptr = to_device(slots.device, runs.qo_indptr, indptr(prefix_lens).to(_I32))
    return TritonExtendArgs(qo_indptr, kv_indptr, kv_indices, None, None, runs.max_rows, True, False)


def triton_group_args(groups: VirtualRequests, slots: torch.Tensor) -> TritonExtendArgs:
    """Groups: stage 1 reads every key of a group's list from the pool (its rows' K/V are written before
    attention) under a mask ``key_pos <= q_pos`` built on the device; stage 2 is skipped. Triton skips the key
    tiles a mask hides for every row, so a group reads its keys up to its last row once."""
    device = slots.device
    widths, rows = groups.keys_per_request, groups.rows_per_request
    kv_indices = concat_prefixes(visible_slots(groups, slots), widths).to(_I64)
    row_lens = widths + rows  # the launcher's mask layout: [rows, prefix + rows], extend columns unused
    mask_indptr = indptr(rows * row_lens)
    qo_indptr, kv_indptr, mask_indptr_d, admitted = to_device(
        device, groups.qo_indptr, indptr(widths).to(_I32), mask_indptr, groups.admitted.to(_I32)
    )
    size = int(mask_indptr[-1])
    bounds, lengths, starts = groups.qo_indptr.tolist(), row_lens.tolist(), mask_indptr.tolist()

    def build() -> torch.Tensor:
        mask = torch.empty(size, dtype=torch.bool, device=device)
        columns = torch.arange(max(lengths), dtype=_I32, device=device)
        for j, length in enumerate(lengths):
            q0, q1 = bounds[j], bounds[j + 1]
            block = mask[starts[j] : starts[j] + (q1 - q0) * length].view(q1 - q0, length)
            torch.lt(columns[None, :length], admitted[q0:q1, None], out=block)
        ledger.count(ledger.DEVICE_MASK_BYTES, size)
        return mask.view(torch.uint8)

    keep = size <= MASK_CACHE_BYTES
    return TritonExtendArgs(qo_indptr, kv_indptr, kv_indices, build() if keep else None, mask_indptr_d,
                            groups.max_rows, False, True, None if keep else build)


# ----------------------------------------------------------------------------------------- FlashInfer


@dataclass(frozen=True)
class FlashInferPagedArgs:
    """Arguments of FlashInfer's paged prefill ``plan()`` at page size 1 (SGLang's FlashInfer planning).

    qo_indptr:        [R+1] int32, host (``plan()`` reads it on the host and copies it to its buffers)
    kv_indptr:        [R+1] int32, host
    kv_indices:       [kv_indptr[-1]] int32, pool slots of every request's keys, own rows included; slots' device
    kv_last_page_len: [R] int32 ones, host
    """

    qo_indptr: torch.Tensor
    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor
    kv_last_page_len: torch.Tensor


def flashinfer_paged_args(runs: VirtualRequests, slots: torch.Tensor) -> FlashInferPagedArgs:
    """Runs on FlashInfer's paged prefill: ``causal=True`` is bottom-right aligned (row ``i`` keeps key index
    ``<= i + kv_len - qo_len``), which for a run over its compacted key list is exactly ``key_pos <= q_pos``.
    Must run on the paged path, which writes K/V before attention; the ragged path writes it after."""
    _no_groups(runs, "flashinfer_paged_args")
    return FlashInferPagedArgs(
        qo_indptr=runs.qo_indptr.to(_I32),
        kv_indptr=runs.key_indptr.to(_I32),
        kv_indices=concat_prefixes(visible_slots(runs, slots), runs.keys_per_request).to(_I32),
        kv_last_page_len=torch.ones(runs.num_requests, dtype=_I32),
    )


# ----------------------------------------------------------------------------------------------- fa3


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
    runs: VirtualRequests, slots: torch.Tensor, *, page_size: int = 1, max_context_len: int | None = None
) -> Fa3Args:
    """Runs on fa3; slots: [seq_len] int pool slots, page-aligned when ``page_size > 1``.

    ``causal=True`` is bottom-right aligned as in FlashInfer, so runs over compacted key lists are exact at
    page size 1. With ``page_size > 1`` a page table can only name whole pages, so every request's keys must be
    all positions ``[0, last]`` (no hidden key). ``max_context_len`` fixes the page table's width
    (``ceil(max_context_len / page_size)`` columns).
    """
    _no_groups(runs, "fa3_args")
    if type(page_size) is not int or page_size < 1:
        raise ValueError(f"page_size must be an int >= 1, got {page_size!r}")
    key_lens = runs.keys_per_request
    if page_size > 1 and not torch.equal(key_lens, runs.seq_lens):
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
    shown = visible_slots(runs, slots)  # [v]
    first_key = torch.arange(0, -(-width // page_size) * page_size, page_size, device=device)  # [pages]
    row = shown[first_key.clamp_max(shown.numel() - 1)] // page_size
    cu_seqlens_q, cache_seqlens = to_device(device, runs.qo_indptr.to(_I32), key_lens.to(_I32))
    valid = first_key[None, :] < cache_seqlens[:, None]  # [R, pages]
    table = torch.where(valid, row[None, :], 0).to(_I32)
    return Fa3Args(cu_seqlens_q, cache_seqlens, table, runs.max_rows, max_k)


# -------------------------------------------------------------------------------------------- decode


def decode_kv_lists(
    slots_rows: list[torch.Tensor], visible: list[torch.Tensor | None]
) -> tuple[torch.Tensor, torch.Tensor]:
    """(kv_indptr [B+1] int32, kv_indices [kv_indptr[-1]] int64) on the slots' device for one decode step.

    slots_rows[b]: [seq_len_b] int pool slots of decode request ``b`` (its new token last), on the device;
    visible[b]: [seq_len_b] bool CPU or None (all visible). Hidden keys are left out of the lists, the layout of
    SGLang's Triton ``decode_attention_fwd`` (FlashInfer's decode plan takes the same lists at page size 1).
    """
    if not slots_rows:
        raise ValueError("decode_kv_lists needs at least one decode request")
    if len(visible) != len(slots_rows):
        raise ValueError(f"got {len(slots_rows)} slot rows but {len(visible)} visible masks")
    device = slots_rows[0].device
    lens = [s.numel() for s in slots_rows]
    picks = []
    for b, (row, mask) in enumerate(zip(slots_rows, visible)):
        if row.ndim != 1 or row.numel() == 0:
            raise ValueError(f"slots_rows[{b}] must be a non-empty 1-D tensor, got shape {tuple(row.shape)}")
        if mask is None:
            picks.append(torch.arange(row.numel()))
            continue
        check_mask(mask, f"visible[{b}]")
        if mask.numel() != row.numel():
            raise ValueError(f"visible[{b}] has {mask.numel()} entries but slots_rows[{b}] has {row.numel()}")
        if not bool(mask[-1]):
            raise ValueError(f"visible[{b}] hides the decode token (its last position {row.numel() - 1})")
        picks.append(torch.nonzero(mask).flatten())
    counts = torch.tensor([p.numel() for p in picks], dtype=_I64)
    flat = torch.cat(slots_rows)
    if all(m is None for m in visible):
        (kv_indptr,) = to_device(device, indptr(counts).to(_I32))
        return kv_indptr, flat.to(_I64)
    index = torch.cat(picks) + torch.repeat_interleave(indptr(torch.tensor(lens, dtype=_I64))[:-1], counts)
    kv_indptr, index = to_device(device, indptr(counts).to(_I32), index)
    return kv_indptr, flat[index].to(_I64)


# The builder of each GPU backend's runs (its groups all go through triton_group_args); the backends'
# subclasses and the engine-free planner benchmark both take it from here.
RUN_ARGS = {"triton": triton_run_args, "flashinfer": flashinfer_paged_args, "fa3": fa3_args}


def step_args(backend: str, step, slots: torch.Tensor, *, page_size: int = 1) -> tuple[TritonExtendArgs | None, object]:
    """(groups' Triton arguments or None, runs' arguments or None) that ``backend`` prepares for one step
    (``steps.Step``), as its ``ridgefill_prepare`` does, without SGLang's metadata classes around them."""
    groups = triton_group_args(step.groups, slots) if step.groups is not None else None
    runs = None
    if step.runs is not None:
        build = RUN_ARGS[backend]
        runs = build(step.runs, slots, page_size=page_size) if backend == "fa3" else build(step.runs, slots)
    return groups, runs


def _no_groups(vr: VirtualRequests, what: str) -> None:
    if vr.has_groups:
        raise ValueError(f"{what} takes runs only; groups go through triton_group_args")
