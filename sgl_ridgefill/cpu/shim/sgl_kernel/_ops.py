"""The ``torch.ops.sgl_kernel.*_cpu`` ops of SGLang's hybrid (Gated DeltaNet) models, registered with
``torch.library`` over the pure-PyTorch ``sgl_ridgefill.gdn_ops``.

SGLang's ``models/qwen3_5.py`` and ``models/qwen3_next.py`` read ``torch.ops.sgl_kernel.<op>`` when they are
imported, and the GDN backend when it is built, so the ops exist from the moment ``sgl_kernel`` is first
imported (this package's ``__init__``). Schemas follow the call sites of SGLang 0.5.23 (argument names
matter where SGLang passes keywords).
"""

import torch

from sgl_ridgefill import gdn_ops

_LIBRARY = None

_OPS = (
    ("fused_sigmoid_mul_cpu(Tensor(a!) x, Tensor gate) -> ()", lambda x, gate: gdn_ops.fused_sigmoid_mul_(x, gate)),
    ("fused_qk_gemma_rmsnorm_cpu(Tensor q, Tensor k, Tensor q_weight, Tensor k_weight, float eps, int head_dim)"
     " -> (Tensor, Tensor)", gdn_ops.fused_qk_gemma_rmsnorm),
    ("fused_qk_gemma_rmsnorm_with_gate_cpu(Tensor q_gate, Tensor k, Tensor q_weight, Tensor k_weight, float eps, "
     "int head_dim, int num_heads) -> (Tensor, Tensor, Tensor)", gdn_ops.fused_qk_gemma_rmsnorm_with_gate),
    ("fused_qkvzba_split_reshape_cat_contiguous_cpu(Tensor mixed_qkvz, Tensor mixed_ba, int num_heads_qk, "
     "int num_heads_v, int head_qk, int head_v) -> (Tensor, Tensor, Tensor, Tensor)",
     gdn_ops.fused_qkvzba_split_reshape_cat_contiguous),
    ("fused_gdn_gating_cpu(Tensor A_log, Tensor a, Tensor b, Tensor dt_bias) -> (Tensor, Tensor)",
     gdn_ops.fused_gdn_gating),
    ("fused_sigmoid_gating_delta_rule_update_cpu(Tensor A_log, Tensor dt_bias, Tensor q, Tensor k, Tensor v, "
     "Tensor a, Tensor b, Tensor(a!) initial_state_source, Tensor initial_state_indices, Tensor cu_seqlens, "
     "bool use_qk_l2norm_in_kernel, float softplus_beta=1.0, float softplus_threshold=20.0) -> Tensor",
     gdn_ops.fused_sigmoid_gating_delta_rule_update),
)


def register() -> None:
    """Define and implement the ops once per process (a second call, or ops already there, does nothing)."""
    global _LIBRARY
    if _LIBRARY is not None or hasattr(torch.ops.sgl_kernel, "fused_gdn_gating_cpu"):
        return
    lib = torch.library.Library("sgl_kernel", "FRAGMENT")
    for schema, fn in _OPS:
        name = schema.split("(", 1)[0]
        lib.define(schema)
        lib.impl(name, fn, "CompositeExplicitAutograd")
    _LIBRARY = lib
