"""Sub-batches of an EXTEND ``ForwardBatch``: a subset of its requests, or chosen rows of one request.

RidgeFill runs a chunk in several passes (lower layers, fill, exact rows and tail), each over a
``dataclasses.replace`` copy of SGLang's batch with the per-request fields narrowed. The copy gets its own
``residual_stream``; the attention backend is planned for it by the caller. The narrowed fields are computed
on the host (from the batch's host lists and the caller's host plans) and sent in one non-blocking copy
(``attention/staging.py``), so building a sub-batch never waits for the device.

Rows of one request at arbitrary positions are described as *virtual requests* of that request
(``sgl_ridgefill.attention.planner``): virtual request ``j`` has ``lens[j]`` query rows and a context of
``seq_lens[j]`` positions, like an extend with prefix ``seq_lens[j] - lens[j]``. For a run of consecutive
positions that is exactly SGLang's extend of those rows; for a group the backend plans a custom mask.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import torch

from ..attention.staging import to_device

if TYPE_CHECKING:
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch


def request_row_starts(fb: ForwardBatch) -> list[int]:
    """Row offset of every request's extend rows inside the batch's flat token axis."""
    starts, acc = [], 0
    for n in fb.extend_seq_lens_cpu:
        starts.append(acc)
        acc += int(n)
    return starts


def _row_count_fields(fb: ForwardBatch, n: int) -> dict:
    """SGLang reads the number of real rows from these (attention runs only on the first ones), so a
    sub-batch must carry its own count, not its parent's."""
    out: dict = {"global_num_token_non_padded_cpu": n}
    for name in ("global_num_token_non_padded", "num_token_non_padded"):
        value = getattr(fb, name, None)
        if value is not None:
            out[name] = torch.full_like(value, n)
    return out


# SGLang's mamba-state tracking of a batch (radix snapshots, deferred copy-on-write and clears of hybrid
# models' state slots): per request of the parent batch, so a sub-batch of virtual requests carries none.
_MAMBA_TRACKING = ("mamba_track_indices", "mamba_track_mask", "mamba_track_seqlens", "mamba_prefill_track_mask_cpu",
                   "mamba_track_seqlens_cpu", "mamba_cow_src_indices", "mamba_cow_dst_indices", "mamba_clear_indices")


def _no_mamba_tracking(fb: ForwardBatch) -> dict:
    return {name: None for name in _MAMBA_TRACKING if getattr(fb, name, None) is not None}


def _pick_mamba_tracking(fb: ForwardBatch, idx: list[int], index: torch.Tensor) -> dict:
    """The tracking of the requests ``idx`` (the copy-on-write and clears already ran before the forward);
    ``index``: ``idx`` on the device."""
    out = _no_mamba_tracking(fb)
    for name in ("mamba_track_indices", "mamba_track_mask", "mamba_track_seqlens"):
        if getattr(fb, name, None) is not None:
            out[name] = getattr(fb, name)[index]
    for name in ("mamba_prefill_track_mask_cpu", "mamba_track_seqlens_cpu"):
        if getattr(fb, name, None) is not None:
            out[name] = _pick(getattr(fb, name), idx)
    return out


def _pick(seq, idx: list[int]):
    return None if seq is None else [seq[i] for i in idx]


def _pick_host(t: torch.Tensor | None, idx: list[int]) -> torch.Tensor | None:
    return None if t is None else t[idx]


def requests_subbatch(fb: ForwardBatch, idx: list[int]) -> tuple[ForwardBatch, torch.Tensor]:
    """The requests ``idx`` of ``fb`` as a batch of their own; also returns their row indices in ``fb``."""
    starts = request_row_starts(fb)
    ext_lens = [int(fb.extend_seq_lens_cpu[i]) for i in idx]
    rows_host = torch.cat([torch.arange(starts[i], starts[i] + n, dtype=torch.long) for i, n in zip(idx, ext_lens)])
    ext_host = torch.tensor(ext_lens, dtype=fb.extend_seq_lens.dtype)
    start_host = torch.cumsum(ext_host, 0) - ext_host
    rows, index, ext_lens_t, start_loc = to_device(
        fb.input_ids.device, rows_host, torch.tensor(idx, dtype=torch.long), ext_host, start_host
    )

    def pick(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else t[index]

    seq_lens_cpu = _pick_host(fb.seq_lens_cpu, idx)
    sub = dataclasses.replace(
        fb,
        batch_size=len(idx),
        input_ids=fb.input_ids[rows],
        positions=fb.positions[rows],
        out_cache_loc=fb.out_cache_loc[rows],
        req_pool_indices=pick(fb.req_pool_indices),
        req_pool_indices_cpu=_pick_host(fb.req_pool_indices_cpu, idx),
        seq_lens=pick(fb.seq_lens),
        seq_lens_cpu=seq_lens_cpu,
        seq_lens_sum=int(seq_lens_cpu.sum()) if seq_lens_cpu is not None else int(fb.seq_lens[index].sum()),
        orig_seq_lens=pick(fb.orig_seq_lens),
        extend_num_tokens=sum(ext_lens),
        extend_seq_lens=ext_lens_t,
        extend_seq_lens_cpu=ext_lens,
        extend_prefix_lens=pick(fb.extend_prefix_lens),
        extend_prefix_lens_cpu=_pick(fb.extend_prefix_lens_cpu, idx),
        extend_start_loc=start_loc,
        extend_logprob_start_lens_cpu=_pick(fb.extend_logprob_start_lens_cpu, idx),
        top_logprobs_nums=_pick(fb.top_logprobs_nums, idx),
        token_ids_logprobs=_pick(fb.token_ids_logprobs, idx),
        rids=_pick(fb.rids, idx),
        lora_ids=_pick(fb.lora_ids, idx),
        residual_stream=None,
        **_row_count_fields(fb, sum(ext_lens)),
        **_pick_mamba_tracking(fb, idx, index),
    )
    return sub, rows


def virtual_subbatch(
    fb: ForwardBatch,
    req: int,
    *,
    lens: list[int],
    seq_lens: list[int],
    input_ids: torch.Tensor,
    positions: torch.Tensor,
    out_cache_loc: torch.Tensor,
) -> ForwardBatch:
    """Rows of request ``req`` of ``fb`` as ``len(lens)`` virtual extend requests of that request.

    ``lens``: rows of each virtual request (they partition the rows, in order); ``seq_lens``: the context
    length of each (its last position + 1); ``input_ids``, ``positions``, ``out_cache_loc``: ``[rows]``
    on the batch's device, positions ascending.
    """
    r, n = len(lens), int(positions.numel())
    assert r == len(seq_lens) and sum(lens) == n, (lens, seq_lens, n)
    prefix = [s - m for s, m in zip(seq_lens, lens)]

    def host(values: list[int], like: torch.Tensor | None) -> torch.Tensor:
        return torch.tensor(values, dtype=like.dtype if like is not None else torch.int64)

    lens_host = host(lens, fb.extend_seq_lens)
    seq_lens_t, lens_t, prefix_t, start_loc = to_device(
        fb.seq_lens.device, host(seq_lens, fb.seq_lens), lens_host, host(prefix, fb.extend_prefix_lens),
        torch.cumsum(lens_host, 0) - lens_host,
    )
    one = slice(req, req + 1)
    seq_cpu_dtype = fb.seq_lens_cpu.dtype if fb.seq_lens_cpu is not None else torch.int64
    return dataclasses.replace(
        fb,
        batch_size=r,
        input_ids=input_ids,
        positions=positions,
        out_cache_loc=out_cache_loc,
        req_pool_indices=fb.req_pool_indices[one].repeat(r),
        req_pool_indices_cpu=None if fb.req_pool_indices_cpu is None else fb.req_pool_indices_cpu[one].repeat(r),
        seq_lens=seq_lens_t,
        seq_lens_cpu=torch.tensor(seq_lens, dtype=seq_cpu_dtype),
        seq_lens_sum=sum(seq_lens),
        orig_seq_lens=None if fb.orig_seq_lens is None else fb.orig_seq_lens[one].repeat(r),
        extend_num_tokens=n,
        extend_seq_lens=lens_t,
        extend_seq_lens_cpu=list(lens),
        extend_prefix_lens=prefix_t,
        extend_prefix_lens_cpu=prefix,
        extend_start_loc=start_loc,
        extend_logprob_start_lens_cpu=list(lens),
        return_logprob=False,
        top_logprobs_nums=None if fb.top_logprobs_nums is None else [0] * r,
        token_ids_logprobs=None if fb.token_ids_logprobs is None else [None] * r,
        rids=None if fb.rids is None else [fb.rids[req]] * r,
        lora_ids=None if fb.lora_ids is None else [fb.lora_ids[req]] * r,
        residual_stream=None,
        **_row_count_fields(fb, n),
        **_no_mamba_tracking(fb),
    )
