"""``sgl_kernel.mamba`` of the CPU stand-in: the Python wrappers SGLang's GDN backend imports on a CPU
(``from sgl_kernel.mamba import causal_conv1d_fn_cpu, ...``), with the signatures SGLang 0.5.23 calls,
over the pure-PyTorch ops of ``sgl_ridgefill.gdn_ops``."""

from sgl_ridgefill import gdn_ops


def causal_conv1d_fn_cpu(mixed_qkv_transposed, conv_weights, bias, activation, conv_states, has_initial_state,
                         cache_indices, query_start_loc, seq_lens_cpu=None, **_):
    return gdn_ops.causal_conv1d_fn(mixed_qkv_transposed, conv_weights, bias, conv_states, query_start_loc,
                                    cache_indices, has_initial_state, activation)


def causal_conv1d_update_cpu(mixed_qkv, conv_states, conv_weights, bias, activation, conv_state_indices, **_):
    return gdn_ops.causal_conv1d_update(mixed_qkv, conv_states, conv_weights, bias, activation, conv_state_indices)


def chunk_gated_delta_rule_cpu(q, k, v, g, beta, initial_state, cu_seqlens, head_first=False,
                               use_qk_l2norm_in_kernel=True, initial_state_indices=None, **_):
    return gdn_ops.chunk_gated_delta_rule(q, k, v, g, beta, initial_state, cu_seqlens, head_first,
                                          use_qk_l2norm_in_kernel, initial_state_indices)
