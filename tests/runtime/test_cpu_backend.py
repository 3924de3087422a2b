"""``ridgefill_cpu`` on its own: hidden keys of a finished nofill request hold in extends too (no engine)."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from sgl_ridgefill.attention.cpu import RidgeFillCpuAttnBackend
from sgl_ridgefill.runtime.plan import RequestPlan
from sgl_ridgefill.runtime.state import ATTR, LiveRequests, RequestState

HEADS, KV_HEADS, D, SEQ = 4, 2, 8, 12


class _Pool:
    def __init__(self, slots: int):
        gen = torch.Generator().manual_seed(0)
        self.k = torch.randn(slots, KV_HEADS, D, generator=gen)
        self.v = torch.randn(slots, KV_HEADS, D, generator=gen)

    def set_kv_buffer(self, layer, loc, k, v, *args, **kwargs):
        self.k[loc.loc], self.v[loc.loc] = k.view(-1, KV_HEADS, D), v.view(-1, KV_HEADS, D)

    def get_key_buffer(self, layer_id):
        return self.k

    def get_value_buffer(self, layer_id):
        return self.v


class _Req(SimpleNamespace):
    """A stand-in for SGLang's Req (a plain class, so it can be weakly referenced)."""


def _backend(pool, req_to_token):
    backend = RidgeFillCpuAttnBackend.__new__(RidgeFillCpuAttnBackend)
    backend.token_to_kv_pool = pool
    backend.req_to_token_pool = SimpleNamespace(req_to_token=req_to_token)
    backend.swa_out_cache_loc = None
    return backend


def _layer(layer_id):
    return SimpleNamespace(is_cross_attention=False, attn_type=None, sliding_window_size=None, tp_q_head_num=HEADS,
                           tp_k_head_num=KV_HEADS, qk_head_dim=D, v_head_dim=D, layer_id=layer_id, scaling=D**-0.5)


def _reference(q, k, v, visible):
    k = k[visible].repeat_interleave(HEADS // KV_HEADS, dim=1)
    v = v[visible].repeat_interleave(HEADS // KV_HEADS, dim=1)
    scores = torch.einsum("hd,khd->hk", q, k) * D**-0.5
    return torch.einsum("hk,khd->hd", scores.softmax(-1), v)


def test_a_nofill_decode_row_inside_an_extend_batch_skips_the_hidden_keys(monkeypatch):
    """C7: with --enable-mixed-chunk a nofill request's decode row runs as an extend; it must not read the
    filled rows its upper layers never wrote."""
    import sgl_ridgefill.attention.contract as contract

    live = LiveRequests()
    monkeypatch.setattr(contract, "_LIVE", live)  # the runtime's registry, as serve_requests hands it over
    slots = torch.randperm(32)[:SEQ]
    req_to_token = torch.zeros(2, 32, dtype=torch.long)
    req_to_token[1, :SEQ] = slots
    pool = _Pool(32)
    req = _Req(rid="n", origin_input_ids=list(range(SEQ - 1)), return_logprob=False, logprob_start_len=-1)
    st = RequestState(plan=RequestPlan(arm="nofill", split=2, tail=3))
    st.prompt_ids = torch.arange(SEQ - 1)
    st.prefill_done = True
    st.hidden_keys = torch.tensor([True, False, True, True, False, True, True, True])  # [B = 8]
    setattr(req, ATTR, st)
    live.publish([req])
    backend = _backend(pool, req_to_token)
    q = torch.randn(1, HEADS * D)
    k_new, v_new = torch.randn(1, KV_HEADS * D), torch.randn(1, KV_HEADS * D)
    fb = SimpleNamespace(
        encoder_lens=None, positions=torch.tensor([SEQ - 1]), out_cache_loc=slots[-1:], out_cache_loc_is_physical=True,
        seq_lens_cpu=torch.tensor([SEQ]), seq_lens=torch.tensor([SEQ]), extend_seq_lens_cpu=[1], batch_size=1,
        req_pool_indices=torch.tensor([1]), rids=["n"],
    )
    visible = torch.ones(SEQ, dtype=torch.bool)
    visible[:8] = ~st.hidden_keys
    for layer_id, expect_visible in ((2, visible), (1, torch.ones(SEQ, dtype=torch.bool))):
        out = backend.forward_extend(q, k_new, v_new, _layer(layer_id), fb)
        want = _reference(q.view(HEADS, D), pool.k[slots], pool.v[slots], expect_visible)
        torch.testing.assert_close(out.view(HEADS, D), want, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(
        backend.forward_extend(q, k_new, v_new, _layer(2), fb), backend.forward_extend(q, k_new, v_new, _layer(1), fb)
    )


def _dense(q, k, v, positions, visible=None):
    """Causal attention of rows at ``positions`` over keys ``0..``, plain PyTorch: ``[n, heads, d]``."""
    kk = k.repeat_interleave(HEADS // KV_HEADS, dim=1)
    vv = v.repeat_interleave(HEADS // KV_HEADS, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.float(), kk.float()) * D**-0.5
    mask = torch.arange(k.shape[0])[None, :] <= positions[:, None]
    if visible is not None:
        mask &= visible[None, :]
    scores = scores.masked_fill(~mask[None], float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), vv.float())


def test_row_segments_match_dense_attention():
    """Runs of consecutive rows (split into a causal diagonal and an unmasked prefix merged by log-sum-exp),
    scattered rows and a run from position 0 each equal dense causal attention, in float32 and bfloat16."""
    import sgl_ridgefill.attention.cpu as cpu

    seq = 300
    pool = _Pool(seq)
    backend = _backend(pool, None)
    slots = torch.randperm(seq, generator=torch.Generator().manual_seed(1))
    cases = {
        "tail after a prefix": list(range(200, 300)),
        "exact rows then the tail": [3, 17, 40, 41, 150, *range(240, 300)],
        "from position 0": list(range(0, 120)),
        "short runs only": [5, 6, 7, 90, 91, 299],
        # A pooled selection's windows, more than one masked query block of them.
        "windows over several blocks": [p for start in range(0, 290, 12) for p in range(start, start + 5)],
    }
    for dtype, atol in ((torch.float32, 1e-5), (torch.bfloat16, 3e-2)):
        pool.k, pool.v = pool.k.to(dtype), pool.v.to(dtype)
        for name, rows in cases.items():
            positions = torch.tensor(rows)
            q = torch.randn(len(rows), HEADS, D, generator=torch.Generator().manual_seed(len(rows))).to(dtype)
            out = torch.empty_like(q)
            backend._attend_rows(q, out, slots, positions, None, _layer(0))
            want = _dense(q, pool.k[slots], pool.v[slots], positions)
            assert torch.allclose(out.float(), want, atol=atol), (name, dtype, (out.float() - want).abs().max())
    assert [whole for *_, whole in cpu._segments(cases["exact rows then the tail"], all_visible=True)] == [False, True]
    assert len(cases["windows over several blocks"]) > cpu.QUERY_BLOCK
    # Hidden keys: every row through the masked path, which honours them.
    visible = torch.rand(seq, generator=torch.Generator().manual_seed(2)) > 0.3
    visible[0] = True
    positions = torch.arange(200, 300)
    q = torch.randn(100, HEADS, D).to(pool.k.dtype)
    out = torch.empty_like(q)
    backend._attend_rows(q, out, slots, positions, visible, _layer(0))  # visible: by position
    want = _dense(q, pool.k[slots], pool.v[slots], positions, visible)
    assert torch.allclose(out.float(), want, atol=3e-2)


def test_the_backends_ask_the_runtime_through_the_attention_contract():
    """The attention contract answers hidden keys and ``Req`` objects from the registry the runtime serves
    (``runtime.state`` hands ``LIVE`` over on import); without one, no request hides anything."""
    import sgl_ridgefill.attention.contract as contract
    from sgl_ridgefill.runtime.state import LIVE

    assert contract._LIVE is LIVE
    blank = contract._NoRequests()
    assert blank.hidden_keys("r", 3) is None and blank.req("r") is None
    live = LiveRequests()
    req = _Req(rid="h", origin_input_ids=[1, 2, 3], return_logprob=False, logprob_start_len=-1)
    st = RequestState(plan=RequestPlan(arm="nofill", split=2, tail=1))
    st.hidden_keys = torch.tensor([True, False])
    setattr(req, ATTR, st)
    live.publish([req])
    try:
        contract.serve_requests(live)
        assert contract.request("h") is req and contract.request("other") is None
        assert contract.hidden_keys("h", 1) is None  # below the split nothing is hidden
        assert torch.equal(contract.hidden_keys("h", 2), st.hidden_keys)
    finally:
        contract.serve_requests(LIVE)
