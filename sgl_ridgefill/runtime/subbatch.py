"""Sub-batches of an EXTEND ``ForwardBatch``: a subset of its requests, or chosen rows of one request.

RidgeFill runs a chunk in several passes (lower layers, fill, exact rows and tail), each over a
``dataclasses.replace`` copy of SGLang's batch with the per-request fields narrowed. The copy gets its own
``residual_stream``; the attention backend is re-planned for it by the caller.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import torch

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


def _pick(seq, idx: list[int]):
    return None if seq is None else [seq[i] for i in idx]


def _pick_tensor(t: torch.Tensor | None, idx: list[int]) -> torch.Tensor | None:
    if t is None:
        return None
    return t[torch.tensor(idx, dtype=torch.long, device=t.device)]


def requests_subbatch(fb: ForwardBatch, idx: list[int]) -> tuple[ForwardBatch, torch.Tensor]:
    """The requests ``idx`` of ``fb`` as a batch of their own; also returns their row indices in ``fb``."""
    starts = request_row_starts(fb)
    rows = torch.cat(
        [torch.arange(starts[i], starts[i] + int(fb.extend_seq_lens_cpu[i]), dtype=torch.long) for i in idx]
    ).to(fb.input_ids.device)
    ext_lens = [int(fb.extend_seq_lens_cpu[i]) for i in idx]
    dev = fb.seq_lens.device
    ext_lens_t = torch.tensor(ext_lens, dtype=fb.extend_seq_lens.dtype, device=dev)
    start_loc = torch.zeros_like(ext_lens_t)
    if len(ext_lens) > 1:
        start_loc[1:] = torch.cumsum(ext_lens_t, 0)[:-1]
    seq_lens = _pick_tensor(fb.seq_lens, idx)
    sub = dataclasses.replace(
        fb,
        batch_size=len(idx),
        input_ids=fb.input_ids[rows],
        positions=fb.positions[rows],
        out_cache_loc=fb.out_cache_loc[rows],
        req_pool_indices=_pick_tensor(fb.req_pool_indices, idx),
        req_pool_indices_cpu=_pick_tensor(fb.req_pool_indices_cpu, idx),
        seq_lens=seq_lens,
        seq_lens_cpu=_pick_tensor(fb.seq_lens_cpu, idx),
        seq_lens_sum=int(seq_lens.sum().item()),
        orig_seq_lens=_pick_tensor(fb.orig_seq_lens, idx),
        extend_num_tokens=sum(ext_lens),
        extend_seq_lens=ext_lens_t,
        extend_seq_lens_cpu=ext_lens,
        extend_prefix_lens=_pick_tensor(fb.extend_prefix_lens, idx),
        extend_prefix_lens_cpu=_pick(fb.extend_prefix_lens_cpu, idx),
        extend_start_loc=start_loc,
        extend_logprob_start_lens_cpu=_pick(fb.extend_logprob_start_lens_cpu, idx),
        top_logprobs_nums=_pick(fb.top_logprobs_nums, idx),
        token_ids_logprobs=_pick(fb.token_ids_logprobs, idx),
        rids=_pick(fb.rids, idx),
        lora_ids=_pick(fb.lora_ids, idx),
        residual_stream=None,
        **_row_count_fields(fb, sum(ext_lens)),
    )
    return sub, rows


def rows_subbatch(
    fb: ForwardBatch,
    req: int,
    *,
    input_ids: torch.Tensor,
    positions: torch.Tensor,
    out_cache_loc: torch.Tensor,
    seq_len: int,
) -> ForwardBatch:
    """Rows of request ``req`` at ``positions`` (ascending) over its context ``[0, seq_len)``.

    For contiguous rows ending at ``seq_len - 1`` this is an ordinary extend; otherwise only a backend with
    row-query support (``ridgefill_row_queries = True``, see ``attention_scope``) attends correctly.
    """
    n = int(positions.numel())
    dev = fb.seq_lens.device
    prefix = seq_len - n

    def one(value: int, like: torch.Tensor | None) -> torch.Tensor:
        dtype = like.dtype if like is not None else torch.int64
        return torch.tensor([value], dtype=dtype, device=dev)

    return dataclasses.replace(
        fb,
        batch_size=1,
        input_ids=input_ids,
        positions=positions,
        out_cache_loc=out_cache_loc,
        req_pool_indices=fb.req_pool_indices[req : req + 1],
        req_pool_indices_cpu=None if fb.req_pool_indices_cpu is None else fb.req_pool_indices_cpu[req : req + 1],
        seq_lens=one(seq_len, fb.seq_lens),
        seq_lens_cpu=torch.tensor([seq_len], dtype=torch.int64),
        seq_lens_sum=seq_len,
        orig_seq_lens=None if fb.orig_seq_lens is None else fb.orig_seq_lens[req : req + 1],
        extend_num_tokens=n,
        extend_seq_lens=one(n, fb.extend_seq_lens),
        extend_seq_lens_cpu=[n],
        extend_prefix_lens=one(prefix, fb.extend_prefix_lens),
        extend_prefix_lens_cpu=[prefix],
        extend_start_loc=one(0, fb.extend_start_loc),
        extend_logprob_start_lens_cpu=[n],
        return_logprob=False,
        top_logprobs_nums=None if fb.top_logprobs_nums is None else [0],
        token_ids_logprobs=None if fb.token_ids_logprobs is None else [None],
        rids=None if fb.rids is None else [fb.rids[req]],
        lora_ids=None if fb.lora_ids is None else [fb.lora_ids[req]],
        residual_stream=None,
        **_row_count_fields(fb, n),
    )
