"""RidgeFill on SGLang's FlashInfer attention backend (``--attention-backend flashinfer``).

A sub-pass step (``rowquery.py``) runs its groups through SGLang's Triton extend kernel and its runs on
FlashInfer's paged prefill (``metadata.flashinfer_paged_args``): each run's keys are its visible positions up
to its last row, its own rows included, and FlashInfer's causal mask is aligned bottom-right (query ``i`` of
``qo_len`` rows over ``kv_len`` keys keeps key index ``<= i + kv_len - qo_len``), so a run sees exactly the
visible keys at or before each row, with no custom mask. The **paged** path is mandatory: SGLang's default
ragged path reads the prefix from the pool before this forward's new K/V are written, so a later run would
read the filled K/V of earlier exact rows; the paged path writes first (``forward_extend``'s paged branch,
which runs unchanged). Each step of a pass is planned once on a paged wrapper of its own (they share
SGLang's float workspace: their kernels run one after another on one stream), so a pass of several steps
is not re-planned per layer; passes take the wrappers of a small pool in turn (a pass's steps distinct ones). ``plan()`` writes a
wrapper's pinned host buffer and copies it to the device without waiting; before a wrapper is planned again,
an event recorded after its previous plan is waited on, so the new plan cannot overwrite the buffer before
the earlier copy has run (with the pool's turn that plan is several steps old: the wait returns at once).
The lower pass and plain requests keep SGLang's own plan.

Decode steps of nofill requests are not re-planned here: the nofill arm is refused on this backend.
"""

from __future__ import annotations

import torch

from sglang.srt.layers.attention.flashinfer_backend import FlashInferAttnBackend, PrefillMetadata

from .metadata import RUN_ARGS
from .rowquery import RowQueryExtend


WRAPPER_POOL = 4  # paged prefill wrappers RidgeFill plans in turn (each holds an 8 MiB plan buffer)


class RidgeFillFlashInferBackend(RowQueryExtend, FlashInferAttnBackend):
    ridgefill_visible_keys = True
    ridgefill_hidden_keys = False

    def _rf_prepare_runs(self, runs, scope, sub_batch) -> PrefillMetadata:
        args = RUN_ARGS["flashinfer"](runs, scope.slots)
        updater = self.indices_updater_prefill
        index = self._rf_base + scope.step.index
        wrapper = self._rf_wrapper(index)
        planned = self.__dict__.setdefault("_rf_planned", {})
        if planned.get(index) is not None:
            planned[index].synchronize()  # the wrapper's previous plan has reached the device
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
            non_blocking=True,
        )
        planned[index] = _plan_done(args.kv_indices)
        return PrefillMetadata([wrapper], False, False)

    def _rf_begin_pass(self, steps: int) -> None:
        """The pass's steps take consecutive wrappers of the pool, after the previous pass's."""
        base = self.__dict__.get("_rf_base", 0) + self.__dict__.get("_rf_steps", 0)
        self._rf_base = base if base + steps <= max(WRAPPER_POOL, steps) else 0
        self._rf_steps = steps

    def _rf_wrapper(self, index: int):
        """Paged prefill wrapper ``index`` of the pool, made on first use and kept."""
        wrappers = self.__dict__.setdefault("_rf_wrappers", [])
        while len(wrappers) <= index:
            wrappers.append(self._rf_new_wrapper())
        return wrappers[index]

    def _rf_new_wrapper(self):  # a stand-in in the tests
        from flashinfer import BatchPrefillWithPagedKVCacheWrapper

        return BatchPrefillWithPagedKVCacheWrapper(self.workspace_buffer, "NHD", backend=self.prefill_backend)


def _plan_done(on: torch.Tensor):
    """An event after the plan's copies on CUDA (``None`` elsewhere: nothing is in flight)."""
    if not on.is_cuda:
        return None
    event = torch.cuda.Event()
    event.record()
    return event
