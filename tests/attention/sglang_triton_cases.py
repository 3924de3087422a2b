"""SGLang's own Triton attention kernels fed by the planner, run by ``test_sglang_triton_interpreter.py``.

``python -m tests.attention.sglang_triton_cases`` with ``TRITON_INTERPRET=1`` runs every case in
:data:`CASES` on CPU (float32; the interpreter's bfloat16 ``tl.dot`` is wrong) and prints one JSON line: per
case the worst ``|kernel - reference|``, the kernel launches and whether they were interpreted. Importing this
module imports neither triton nor sglang, so the test collects the case names without the interpreter.
"""

from __future__ import annotations

from typing import Callable

import torch

from sgl_ridgefill.attention.metadata import decode_kv_lists, triton_group_args, triton_run_args
from sgl_ridgefill.attention.planner import VirtualRequests, plan_groups, plan_virtual_requests
from tests.support.attention_emulators import reference_attention
from tests.support.interpreter import main

Q_HEADS, KV_HEADS, HEAD_DIM = 4, 2, 32
SCALE = HEAD_DIM**-0.5
SEQ_LEN = 96
# Exact rows scattered through the prefix (single rows, a pair, a window) and the tail [72, 96).
POSITIONS = torch.tensor([3, 9, 10, 27, 40, 41, 42, 43, 44, 45, 58, *range(72, SEQ_LEN)])

Case = Callable[[], tuple[torch.Tensor, torch.Tensor]]
CASES: dict[str, Case] = {}


def case(fn: Case) -> Case:
    CASES[fn.__name__] = fn
    return fn


class Scene:
    """A pool with the sub-pass's K/V already written, slots shuffled page by page, and its queries."""

    def __init__(self, seed: int, *, page_size: int = 1, hide: float = 0.0) -> None:
        g = torch.Generator().manual_seed(seed)
        pages = -(-SEQ_LEN // page_size) + 5
        position = torch.arange(SEQ_LEN)
        self.slots = torch.randperm(pages, generator=g)[position // page_size] * page_size + position % page_size
        self.k = torch.randn(pages * page_size, KV_HEADS, HEAD_DIM, generator=g)
        self.v = torch.randn(pages * page_size, KV_HEADS, HEAD_DIM, generator=g)
        self.q = torch.randn(POSITIONS.numel(), Q_HEADS, HEAD_DIM, generator=g)
        self.visible = None
        if hide > 0:
            self.visible = torch.rand(SEQ_LEN, generator=g) >= hide
            self.visible[POSITIONS] = True
        self.page_size = page_size

    def reference(self) -> torch.Tensor:
        return reference_attention(self.q, self.k, self.v, self.slots, POSITIONS, self.visible, SCALE)

    def extend(self, vr: VirtualRequests, rows: torch.Tensor) -> torch.Tensor:
        """SGLang's ``extend_attention_fwd`` over the plan ``vr`` of the sub-pass rows ``rows``."""
        from sglang.kernels.ops.attention.extend_attention import extend_attention_fwd

        a = triton_group_args(vr, self.slots) if vr.has_groups else triton_run_args(vr, self.slots)
        own = self.slots[vr.positions]  # the rows' K/V, as k_extend / v_extend
        out = torch.zeros(rows.numel(), Q_HEADS, HEAD_DIM)
        extend_attention_fwd(
            self.q[rows].contiguous(), self.k[own].contiguous(), self.v[own].contiguous(), out, self.k, self.v,
            a.qo_indptr, a.kv_indptr, a.kv_indices, a.custom_mask, True, a.mask_indptr, a.max_extend_len,
            1.0, 1.0, sm_scale=SCALE, skip_prefix_custom_mask=a.skip_prefix_custom_mask,
            skip_extend=a.skip_extend, page_size=self.page_size,
            extend_seq_lens_cpu=vr.rows_per_request.tolist(),
        )
        return out

    def plan(self) -> VirtualRequests:
        return plan_virtual_requests(POSITIONS, self.visible)

    def groups(self, group_size: int, positions: torch.Tensor = POSITIONS) -> VirtualRequests:
        return plan_groups(positions, self.visible, group_size=group_size)


def _all_rows() -> torch.Tensor:
    return torch.arange(POSITIONS.numel())


@case
def extend_runs() -> tuple[torch.Tensor, torch.Tensor]:
    s = Scene(1)
    return s.extend(s.plan(), _all_rows()), s.reference()


@case
def extend_runs_compacted() -> tuple[torch.Tensor, torch.Tensor]:
    s = Scene(2, hide=0.5)
    return s.extend(s.plan(), _all_rows()), s.reference()


@case
def extend_groups_one_launch_compacted() -> tuple[torch.Tensor, torch.Tensor]:
    # G = 4: every row (scattered rows and the tail) in groups under the device-built mask, skip_extend.
    s = Scene(3, hide=0.3)
    return s.extend(s.groups(4), _all_rows()), s.reference()


@case
def extend_groups_and_runs_two_launches() -> tuple[torch.Tensor, torch.Tensor]:
    # The runtime's step: the rows before the tail in groups (masked), the tail as a run (no mask).
    s = Scene(4, hide=0.3)
    cut = int((POSITIONS < 72).sum())
    out = torch.zeros(POSITIONS.numel(), Q_HEADS, HEAD_DIM)
    out[:cut] = s.extend(s.groups(4, POSITIONS[:cut]), torch.arange(cut))
    out[cut:] = s.extend(plan_virtual_requests(POSITIONS[cut:], s.visible), torch.arange(cut, POSITIONS.numel()))
    return out, s.reference()


@case
def extend_runs_compacted_page_size_4() -> tuple[torch.Tensor, torch.Tensor]:
    s = Scene(5, page_size=4, hide=0.4)
    return s.extend(s.plan(), _all_rows()), s.reference()


@case
def extend_groups_page_size_4() -> tuple[torch.Tensor, torch.Tensor]:
    s = Scene(6, page_size=4)
    return s.extend(s.groups(8), _all_rows()), s.reference()


@case
def decode_compacted() -> tuple[torch.Tensor, torch.Tensor]:
    from sglang.kernels.ops.attention.decode_attention import decode_attention_fwd

    g = torch.Generator().manual_seed(7)
    lens = [37, 96, 5]
    perm = torch.randperm(sum(lens) + 11, generator=g)
    slots = list(torch.split(perm[: sum(lens)], lens))
    visible: list[torch.Tensor | None] = [torch.rand(n, generator=g) < 0.5 for n in lens]
    visible[1] = None
    for mask in visible:
        if mask is not None:
            mask[-1] = True  # the decode token
    k = torch.randn(perm.numel(), KV_HEADS, HEAD_DIM, generator=g)
    v = torch.randn(perm.numel(), KV_HEADS, HEAD_DIM, generator=g)
    q = torch.randn(len(lens), Q_HEADS, HEAD_DIM, generator=g)
    kv_indptr, kv_indices = decode_kv_lists(slots, visible)
    # As TritonAttnBackend.forward_decode: fp32 partials per kv split, static split count (the CPU path).
    max_kv_splits = 4
    attn_logits = torch.empty(len(lens), Q_HEADS, max_kv_splits, HEAD_DIM, dtype=torch.float32)
    attn_lse = torch.empty(len(lens), Q_HEADS, max_kv_splits, dtype=torch.float32)
    num_kv_splits = torch.full((len(lens),), max_kv_splits, dtype=torch.int32)
    out = torch.zeros(len(lens), Q_HEADS, HEAD_DIM)
    decode_attention_fwd(
        q, k, v, out, kv_indptr, kv_indices, attn_logits, attn_lse, num_kv_splits, max_kv_splits, SCALE, 1.0, 1.0
    )
    want = torch.cat([
        reference_attention(q[b : b + 1], k, v, s, torch.tensor([s.numel() - 1]), visible[b], SCALE)
        for b, s in enumerate(slots)
    ])
    return out, want


# --------------------------------------------------------------------------------------------- runner


def _kernels():
    from sglang.kernels.ops.attention import decode_attention, extend_attention

    return (
        (extend_attention, ("_fwd_kernel",)),
        (decode_attention, ("_fwd_kernel_stage1", "_fwd_grouped_kernel_stage1", "_fwd_kernel_stage2")),
    )


def _measure(got: torch.Tensor, want: torch.Tensor) -> dict:
    return {"err": float((got.double() - want.double()).abs().max()), "finite": bool(torch.isfinite(got).all())}


if __name__ == "__main__":
    main(CASES, _kernels, _measure)
