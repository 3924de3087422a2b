"""Each stand-in of the CPU shim against an independent PyTorch reference of the op (no engine).

References: transformers' Qwen3.5 functions and modules (its per-token gated delta rule, its chunked one,
its causal conv, its norms), or the op written out by hand. Cases cover variable-length batches
(``cu_seqlens``), initial states read from and written back to pool slots, padding slots, more value heads
than key heads, and sequences shorter than the conv window.
"""

from __future__ import annotations

import importlib

import pytest
import torch
import torch.nn.functional as F

from sgl_ridgefill import gdn_ops

tq = pytest.importorskip("transformers.models.qwen3_5.modeling_qwen3_5")

HK, HV, K, V = 2, 4, 16, 8  # key heads, value heads, head dims
CONV_DIM, WIDTH = 12, 4


def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


def _gdn_inputs(lens, seed=0):
    gen = _gen(seed)
    t = sum(lens)
    q = torch.randn(1, t, HK, K, generator=gen)
    k = torch.randn(1, t, HK, K, generator=gen)
    v = torch.randn(1, t, HV, V, generator=gen)
    g = -torch.rand(1, t, HV, generator=gen) * 0.3  # decays in (0.74, 1]: long memory
    beta = torch.rand(1, t, HV, generator=gen)
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()])
    return q, k, v, g, beta, cu


def _hf_recurrent(q, k, v, g, beta, state):
    """transformers' per-token gated delta rule for one sequence; ``state`` ``[HV, V, K]`` (SGLang layout)."""
    rep = HV // HK
    o, last = tq.torch_recurrent_gated_delta_rule(
        q.repeat_interleave(rep, dim=2), k.repeat_interleave(rep, dim=2), v, g=g, beta=beta,
        initial_state=state.transpose(-1, -2)[None], output_final_state=True, use_qk_l2norm_in_kernel=True,
    )
    return o[0], last[0].transpose(-1, -2)


@pytest.mark.parametrize("lens", [[1], [37], [64], [130, 5, 64, 2]])
def test_chunk_gated_delta_rule_matches_the_per_token_recurrence(lens):
    q, k, v, g, beta, cu = _gdn_inputs(lens)
    slots = torch.tensor([3, 0, 5, 1][: len(lens)])
    pool = torch.randn(6, HV, V, K, generator=_gen(1)) * 0.1
    before = pool.clone()
    out, _, _ = gdn_ops.chunk_gated_delta_rule(q, k, v, g, beta, pool, cu, initial_state_indices=slots)
    for i, slot in enumerate(slots.tolist()):
        lo, hi = cu[i].item(), cu[i + 1].item()
        o, last = _hf_recurrent(q[:, lo:hi], k[:, lo:hi], v[:, lo:hi], g[:, lo:hi], beta[:, lo:hi], before[slot])
        torch.testing.assert_close(out[0, lo:hi], o, atol=2e-5, rtol=1e-4)
        torch.testing.assert_close(pool[slot], last, atol=2e-5, rtol=1e-4)
    untouched = [s for s in range(6) if s not in slots.tolist()]
    assert torch.equal(pool[untouched], before[untouched])


def test_strongly_decaying_heads_match_the_recurrence():
    """Decays of up to e^-8 per row (where the chunk's products would be subnormal and are flushed)."""
    q, k, v, _, beta, cu = _gdn_inputs([150])
    g = -torch.rand(1, 150, HV, generator=_gen(9)) * 8
    g[..., 0] = -0.01  # one long-memory head beside them
    pool = torch.randn(1, HV, V, K, generator=_gen(1))
    before = pool.clone()
    out, _, _ = gdn_ops.chunk_gated_delta_rule(q, k, v, g, beta, pool, cu, initial_state_indices=torch.tensor([0]))
    o, last = _hf_recurrent(q, k, v, g, beta, before[0])
    torch.testing.assert_close(out[0], o, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(pool[0], last, atol=2e-5, rtol=1e-4)


def test_unread_outputs_advance_the_same_states():
    q, k, v, g, beta, cu = _gdn_inputs([130, 5, 64])
    slots = torch.tensor([2, 0, 1])
    full = torch.randn(3, HV, V, K, generator=_gen(1))
    states_only = full.clone()
    out, _, _ = gdn_ops.chunk_gated_delta_rule(q, k, v, g, beta, full, cu, initial_state_indices=slots)
    with gdn_ops.outputs_unread():
        unread, _, _ = gdn_ops.chunk_gated_delta_rule(q, k, v, g, beta, states_only, cu, initial_state_indices=slots)
    torch.testing.assert_close(states_only, full, atol=2e-5, rtol=1e-4)
    assert unread.shape == out.shape and not unread.any()
    again, _, _ = gdn_ops.chunk_gated_delta_rule(q, k, v, g, beta, full.clone(), cu, initial_state_indices=slots)
    assert again.any()  # outside the block the outputs are computed again


def test_chunk_gated_delta_rule_matches_transformers_chunked_form():
    q, k, v, g, beta, cu = _gdn_inputs([200])
    pool = torch.zeros(1, HV, V, K)
    out, _, _ = gdn_ops.chunk_gated_delta_rule(q, k, v, g, beta, pool, cu, initial_state_indices=torch.tensor([0]))
    rep = HV // HK
    ref, last = tq.torch_chunk_gated_delta_rule(
        q.repeat_interleave(rep, dim=2), k.repeat_interleave(rep, dim=2), v, g=g, beta=beta,
        output_final_state=True, use_qk_l2norm_in_kernel=True,
    )
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(pool[0], last[0].transpose(-1, -2), atol=2e-5, rtol=1e-4)


def test_chunked_prefill_in_pieces_equals_one_call():
    q, k, v, g, beta, cu = _gdn_inputs([150])
    whole = torch.zeros(2, HV, V, K)
    out, _, _ = gdn_ops.chunk_gated_delta_rule(q, k, v, g, beta, whole, cu, initial_state_indices=torch.tensor([1]))
    pieces = torch.zeros(2, HV, V, K)
    outs = []
    for lo, hi in ((0, 48), (48, 96), (96, 150)):
        o, _, _ = gdn_ops.chunk_gated_delta_rule(
            q[:, lo:hi], k[:, lo:hi], v[:, lo:hi], g[:, lo:hi], beta[:, lo:hi], pieces, torch.tensor([0, hi - lo]),
            initial_state_indices=torch.tensor([1]),
        )
        outs.append(o)
    torch.testing.assert_close(torch.cat(outs, dim=1), out, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(pieces, whole, atol=2e-5, rtol=1e-4)


def test_decode_update_matches_the_recurrence_and_skips_padding():
    gen = _gen(3)
    bsz = 3
    q, k = torch.randn(1, bsz, HK, K, generator=gen), torch.randn(1, bsz, HK, K, generator=gen)
    v = torch.randn(1, bsz, HV, V, generator=gen)
    a, b = torch.randn(bsz, HV, generator=gen), torch.randn(bsz, HV, generator=gen)
    A_log, dt_bias = torch.randn(HV, generator=gen) * 0.5, torch.randn(HV, generator=gen)
    pool = torch.randn(4, HV, V, K, generator=gen) * 0.1
    before = pool.clone()
    slots = torch.tensor([2, -1, 0])
    out = gdn_ops.fused_sigmoid_gating_delta_rule_update(
        A_log, dt_bias, q, k, v, a, b, pool, slots, torch.arange(bsz + 1), use_qk_l2norm_in_kernel=True
    )
    g = -A_log.exp() * F.softplus(a + dt_bias)
    for i, slot in enumerate(slots.tolist()):
        if slot < 0:
            assert torch.equal(out[0, i], torch.zeros(HV, V))
            continue
        o, last = _hf_recurrent(q[:, i : i + 1], k[:, i : i + 1], v[:, i : i + 1], g[None, i : i + 1],
                                b.sigmoid()[None, i : i + 1], before[slot])
        torch.testing.assert_close(out[0, i], o[0], atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(pool[slot], last, atol=1e-5, rtol=1e-4)
    assert torch.equal(pool[[1, 3]], before[[1, 3]])


def test_gdn_gating():
    gen = _gen(4)
    a, b = torch.randn(7, HV, generator=gen) * 10, torch.randn(7, HV, generator=gen)
    A_log, dt_bias = torch.randn(HV, generator=gen), torch.randn(HV, generator=gen)
    g, beta = gdn_ops.fused_gdn_gating(A_log, a, b, dt_bias)
    assert g.shape == beta.shape == (1, 7, HV) and g.dtype == beta.dtype == torch.float32
    x = a + dt_bias
    softplus = torch.where(x <= 20, torch.log1p(torch.exp(x)), x)
    torch.testing.assert_close(g[0], -A_log.exp() * softplus)
    torch.testing.assert_close(beta[0], 1 / (1 + torch.exp(-b)))


def _conv_by_hand(x, weight, window):
    """``x`` ``[dim, L]`` after ``window`` ``[dim, W-1]``: out[c, t] = silu(sum_j w[c, j] xpad[c, t + j])."""
    xpad = torch.cat([window, x], dim=1)
    out = torch.zeros_like(x)
    for t in range(x.shape[1]):
        out[:, t] = (weight * xpad[:, t : t + weight.shape[1]]).sum(1)
    return F.silu(out), xpad[:, -(weight.shape[1] - 1) :]


@pytest.mark.parametrize("layout", ["dim-major", "row-major"])
def test_causal_conv_prefill_with_and_without_initial_state(layout):
    gen = _gen(5)
    lens = [2, 9, 5]  # 2 < W - 1: the window keeps part of the old one
    x = torch.randn(CONV_DIM, sum(lens), generator=gen)
    if layout == "row-major":  # what SGLang passes: the transpose of its [tokens, dim] rows
        x = x.t().contiguous().t()
    weight = torch.randn(CONV_DIM, WIDTH, generator=gen)
    states = torch.randn(4, CONV_DIM, WIDTH - 1, generator=gen)
    before = states.clone()
    slots, initial = torch.tensor([1, 3, -1]), torch.tensor([True, False, True])
    cu = torch.tensor([0, 2, 11, 16])
    out = gdn_ops.causal_conv1d_fn(x, weight, None, states, cu, slots, initial, "silu")
    for i, slot in enumerate(slots.tolist()):
        lo, hi = cu[i].item(), cu[i + 1].item()
        if slot < 0:
            continue
        window = before[slot] if initial[i] else torch.zeros(CONV_DIM, WIDTH - 1)
        ref, new_window = _conv_by_hand(x[:, lo:hi], weight, window)
        torch.testing.assert_close(out[:, lo:hi], ref)
        torch.testing.assert_close(states[slot], new_window)
    assert torch.equal(states[[0, 2]], before[[0, 2]])
    hf = tq.causal_conv1d_fn(x[None, :, 2:11], weight, None, activation="silu")[0]  # from an empty window
    torch.testing.assert_close(out[:, 2:11], hf)


def test_causal_conv_prefill_over_many_blocks_with_bias():
    gen = _gen(8)
    lens = [gdn_ops.CONV_BLOCK * 2 + 17, 3, gdn_ops.CONV_BLOCK]
    x = torch.randn(sum(lens), CONV_DIM, generator=gen).t()
    weight, bias = torch.randn(CONV_DIM, WIDTH, generator=gen), torch.randn(CONV_DIM, generator=gen)
    states = torch.zeros(3, CONV_DIM, WIDTH - 1)
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()])
    out = gdn_ops.causal_conv1d_fn(x, weight, bias, states, cu, torch.tensor([0, 1, 2]), torch.tensor([False] * 3), None)
    for i in range(3):
        lo, hi = cu[i].item(), cu[i + 1].item()
        ref = F.conv1d(F.pad(x[None, :, lo:hi], (WIDTH - 1, 0)), weight[:, None], bias, groups=CONV_DIM)[0]
        torch.testing.assert_close(out[:, lo:hi], ref, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(states[i], x[:, hi - (WIDTH - 1) : hi])


def test_causal_conv_decode_step():
    gen = _gen(6)
    x = torch.randn(2, CONV_DIM, generator=gen)
    weight = torch.randn(CONV_DIM, WIDTH, generator=gen)
    states = torch.randn(3, CONV_DIM, WIDTH - 1, generator=gen)
    hf_states = states[[2, 0]].clone()
    out = gdn_ops.causal_conv1d_update(x, states, weight, None, "silu", torch.tensor([2, 0]))
    ref = tq.causal_conv1d_update(x[:, :, None], hf_states, weight, None, "silu")[:, :, 0]
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(states[[2, 0]], hf_states)


def _hf_norm(dim, seed):
    norm = tq.Qwen3_5RMSNorm(dim, eps=1e-6)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(dim, generator=_gen(seed)) * 0.2)
    return norm


def test_qk_gemma_norm():
    gen = _gen(7)
    heads, kv_heads, d = 4, 2, 16
    q, k = torch.randn(5, heads * d, generator=gen), torch.randn(5, kv_heads * d, generator=gen)
    qn, kn = _hf_norm(d, 1), _hf_norm(d, 2)
    q_out, k_out = gdn_ops.fused_qk_gemma_rmsnorm(q, k, qn.weight, kn.weight, 1e-6, d)
    torch.testing.assert_close(q_out.view(5, -1), qn(q.view(5, heads, d)).view(5, -1))
    torch.testing.assert_close(k_out.view(5, -1), kn(k.view(5, kv_heads, d)).view(5, -1))


def test_qk_gemma_norm_with_gate_splits_per_head():
    gen = _gen(8)
    heads, kv_heads, d = 4, 2, 16
    q_gate, k = torch.randn(5, heads * 2 * d, generator=gen), torch.randn(5, kv_heads * d, generator=gen)
    qn, kn = _hf_norm(d, 3), _hf_norm(d, 4)
    q_out, k_out, gate = gdn_ops.fused_qk_gemma_rmsnorm_with_gate(q_gate, k, qn.weight, kn.weight, 1e-6, d, heads)
    q_ref, gate_ref = torch.chunk(q_gate.view(5, heads, 2 * d), 2, dim=-1)  # transformers' Qwen3.5 split
    torch.testing.assert_close(q_out, qn(q_ref).reshape(5, -1))
    torch.testing.assert_close(k_out, kn(k.view(5, kv_heads, d)).reshape(5, -1))
    torch.testing.assert_close(gate, gate_ref.reshape(5, -1))


def test_sigmoid_mul_in_place_with_a_strided_gate():
    gen = _gen(9)
    x = torch.randn(5, 4 * 16, generator=gen)
    q_gate = torch.randn(5, 4, 32, generator=gen)
    gate = q_gate[..., 16:]  # a strided [rows, heads, head_dim] view, as SGLang's native split leaves it
    expected = x * torch.sigmoid(gate.reshape(5, -1))
    gdn_ops.fused_sigmoid_mul_(x, gate)
    torch.testing.assert_close(x, expected)


def test_qkvzba_split():
    gen = _gen(10)
    qkvz = torch.randn(3, 2 * HK * K + 2 * HV * V, generator=gen)
    ba = torch.randn(3, 2 * HV, generator=gen)
    mixed, z, b, a = gdn_ops.fused_qkvzba_split_reshape_cat_contiguous(qkvz, ba, HK, HV, K, V)
    q, k, v, zz = qkvz.split([HK * K, HK * K, HV * V, HV * V], dim=-1)
    assert torch.equal(mixed, torch.cat([q, k, v], dim=-1))
    assert torch.equal(z, zz.view(3, HV, V)) and torch.equal(b, ba[:, :HV]) and torch.equal(a, ba[:, HV:])


def test_gated_output_norm():
    gen = _gen(11)
    x, z = torch.randn(6, V, generator=gen), torch.randn(6, V, generator=gen)
    norm = tq.Qwen3_5RMSNormGated(V, eps=1e-6)
    with torch.no_grad():
        norm.weight.copy_(1 + 0.3 * torch.randn(V, generator=gen))
    torch.testing.assert_close(gdn_ops.rmsnorm_gated(x, norm.weight, z, 1e-6), norm(x, z))
    sig = gdn_ops.rmsnorm_gated(x, norm.weight, z, 1e-6, activation="sigmoid")
    torch.testing.assert_close(sig, x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * norm.weight * z.sigmoid())


def test_registered_ops_are_the_stand_ins():
    """The shim registers the ``torch.ops.sgl_kernel.*_cpu`` ops SGLang's Qwen3.5 reads at import, with the
    keyword names its GDN backend passes."""
    importlib.import_module("sgl_ridgefill.cpu.shim.sgl_kernel")
    ops = torch.ops.sgl_kernel
    gen = _gen(12)
    A_log, dt_bias = torch.randn(HV, generator=gen), torch.randn(HV, generator=gen)
    a, b = torch.randn(3, HV, generator=gen), torch.randn(3, HV, generator=gen)
    for got, want in zip(ops.fused_gdn_gating_cpu(A_log, a, b, dt_bias), gdn_ops.fused_gdn_gating(A_log, a, b, dt_bias)):
        assert torch.equal(got, want)
    q, k = torch.randn(1, 3, HK, K, generator=gen), torch.randn(1, 3, HK, K, generator=gen)
    v = torch.randn(1, 3, HV, V, generator=gen)
    pool_a, pool_b = torch.zeros(2, HV, V, K), torch.zeros(2, HV, V, K)
    kw = dict(A_log=A_log, dt_bias=dt_bias, q=q, k=k, v=v, a=a, b=b, initial_state_indices=torch.tensor([1, 0, 1]),
              cu_seqlens=torch.arange(4), use_qk_l2norm_in_kernel=True, softplus_beta=1.0, softplus_threshold=20.0)
    out = ops.fused_sigmoid_gating_delta_rule_update_cpu(initial_state_source=pool_a, **kw)
    assert torch.equal(out, gdn_ops.fused_sigmoid_gating_delta_rule_update(initial_state_source=pool_b, **kw))
    assert torch.equal(pool_a, pool_b)
    x = torch.randn(2, 8, generator=gen)
    gate = torch.randn(2, 8, generator=gen)
    expected = x * gate.sigmoid()
    ops.fused_sigmoid_mul_cpu(x, gate)
    torch.testing.assert_close(x, expected)
    for name in ("fused_qk_gemma_rmsnorm_cpu", "fused_qk_gemma_rmsnorm_with_gate_cpu",
                 "fused_qkvzba_split_reshape_cat_contiguous_cpu"):
        assert hasattr(ops, name)
    mamba = importlib.import_module("sgl_ridgefill.cpu.shim.sgl_kernel.mamba")
    assert callable(mamba.causal_conv1d_fn_cpu) and callable(mamba.chunk_gated_delta_rule_cpu)
