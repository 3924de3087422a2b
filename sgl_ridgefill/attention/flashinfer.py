"""RidgeFill on SGLang's FlashInfer attention backend (``--attention-backend flashinfer``).

Under a :class:`~sgl_ridgefill.attention.contract.RowQueries` scope, ``init_forward_metadata`` plans the
paged prefill wrapper itself from the sub-pass's virtual requests (``planner.flashinfer_paged_args``):
each request's keys are its visible positions up to its last row, its own rows included, and FlashInfer's
causal mask is aligned bottom-right (query ``i`` of ``qo_len`` rows over ``kv_len`` keys keeps key index
``<= i + kv_len - qo_len``), so a run sees exactly the visible keys at or before each row; with groups,
every request carries a custom mask. The **paged** path is mandatory: SGLang's default ragged path reads
the prefix from the pool before this forward's new K/V are written, so a later run would read the
filled K/V of earlier exact rows; the paged path writes first (``forward_extend``'s paged branch, which
runs unchanged). The lower pass and plain requests keep SGLang's own plan.

Decode steps of nofill requests are not re-planned here: the nofill arm is refused on this backend.
"""

from __future__ import annotations

from sglang.srt.layers.attention.flashinfer_backend import FlashInferAttnBackend, PrefillMetadata

from .contract import current_row_queries
from .planner import flashinfer_paged_args


class RidgeFillFlashInferBackend(FlashInferAttnBackend):
    ridgefill_row_queries = True
    ridgefill_visible_keys = True
    ridgefill_groups = True
    ridgefill_hidden_keys = False

    def init_forward_metadata(self, forward_batch):
        scope = current_row_queries()
        if scope is None or not forward_batch.forward_mode.is_extend():
            return super().init_forward_metadata(forward_batch)
        args = flashinfer_paged_args(scope.plan, scope.slots)
        updater = self.indices_updater_prefill
        wrapper = self.prefill_wrappers_paged[0]
        wrapper.begin_forward(
            args.qo_indptr,
            args.kv_indptr,
            args.kv_indices,
            args.kv_last_page_len,
            updater.num_qo_heads,
            updater.num_kv_heads,
            updater.head_dim,
            1,  # page size: SGLang plans FlashInfer over token slots
            q_data_type=updater.q_data_type,
            kv_data_type=updater.data_type,
            custom_mask=args.custom_mask,
            non_blocking=True,
        )
        self.forward_metadata = PrefillMetadata(self.prefill_wrappers_paged, False, False)
