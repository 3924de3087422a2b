"""The speed bounds against hand-worked numbers (the arithmetic is in the comments, not in the code)."""

from __future__ import annotations

import pytest

from sgl_ridgefill.tools.flops import (
    ModelDims,
    RidgeFillShape,
    attention_selector_flops,
    causal_pairs,
    exact_prefill_flops,
    flop_bound,
    layer_pass_bound,
    layer_pass_fraction,
    ridgefill_prefill_flops,
)

# L=2, d=4, 2 heads of 2, 1 KV head, MLP 8, vocab 10.
TOY = ModelDims(num_layers=2, hidden_size=4, num_heads=2, num_kv_heads=1, head_dim=2, intermediate_size=8, vocab_size=10)

QWEN2_05B_CONFIG = {
    "num_hidden_layers": 24,
    "hidden_size": 896,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "intermediate_size": 4864,
    "vocab_size": 151936,
}


def test_layer_pass_bound_paper_setting():
    # S=12 of L=24, T=1024, N=8192: r = 1/2 + 1/2 * 1024/8192 = 0.5625, 1/r = 16/9.
    shape = RidgeFillShape(num_tokens=8192, split=12, tail=1024)
    assert layer_pass_fraction(shape, 24) == pytest.approx(0.5625)
    assert layer_pass_bound(shape, 24) == pytest.approx(16 / 9)


def test_layer_pass_bound_seed_table():
    # Qwen3.8-27B: S=16 of 64, T=4096, N=16384: r = 1/4 + 3/4 * 1/4 = 0.4375, bound 1/0.4375 = 2.2857.
    assert layer_pass_bound(RidgeFillShape(16384, 16, 4096), 64) == pytest.approx(1 / 0.4375)


def test_layer_pass_exact_rows_add_their_share():
    # E=716 exact rows: r = 1/2 + 1/2 * (1024 + 716)/8192 = 0.5 + 0.10620117 = 0.60620117.
    shape = RidgeFillShape(8192, 12, 1024, exact_rows=716)
    assert layer_pass_fraction(shape, 24) == pytest.approx(0.60620117, rel=1e-7)


def test_prompt_no_longer_than_tail_runs_exactly():
    assert layer_pass_fraction(RidgeFillShape(1024, 12, 1024), 24) == pytest.approx(1.0)
    assert layer_pass_fraction(RidgeFillShape(500, 12, 1024), 24) == pytest.approx(1.0)
    assert flop_bound(TOY, RidgeFillShape(3, 1, 8)) == pytest.approx(1.0)


def test_causal_pairs():
    assert causal_pairs(0, 4) == 10  # 1 + 2 + 3 + 4
    assert causal_pairs(3, 2) == 9  # rows at positions 3 and 4 see 4 and 5 keys


def test_layer_params_qwen2_05b():
    dims = ModelDims.from_hf_config(QWEN2_05B_CONFIG)
    assert dims.head_dim == 64 and dims.kv_size == 128
    # Q and O: 2 * 896*896 = 1,605,632; K and V: 2 * 896*128 = 229,376; MLP: 3 * 896*4864 = 13,074,432.
    assert dims.layer_params == 14_909_440


def test_flops_toy_exact():
    # layer params: Q 4*4 + K,V 2*4*2 + O 4*4 + MLP 3*4*8 = 16 + 16 + 16 + 96 = 144.
    assert TOY.layer_params == 144
    f = exact_prefill_flops(TOY, 4)
    assert f.linear == 2 * 4 * 2 * 144  # layers * rows * 2 * params = 2304
    assert f.attention == 2 * 16 * 10  # layers * (4 * head_dim 2 * heads 2) * pairs(4 rows)=10 = 320
    assert f.lm_head == 80  # 2 * d 4 * vocab 10
    assert f.total == 2704


def test_flops_toy_ridgefill():
    # S=1, T=1, N=4: 3 filled rows, 1 upper layer.
    f = ridgefill_prefill_flops(TOY, RidgeFillShape(4, 1, 1))
    assert f.linear == 2 * 144 * (1 * 4 + 1 * 1)  # lower: 4 rows, upper: 1 tail row = 1440
    assert f.attention == 16 * (10 + 4)  # lower: 10 pairs; upper: the tail row at position 3 sees 4 keys = 224
    assert f.fill == 1 * 3 * (2 * 4 * 4 + 2 * 4 * 2 * 2)  # map 32 + K/V 32, per filled row and upper layer = 192
    assert f.total == 1440 + 224 + 192 + 80
    assert flop_bound(TOY, RidgeFillShape(4, 1, 1)) == pytest.approx(2704 / 1936)


def test_fill_priced_by_map_kind():
    # TOY: d 4, K/V 2*2. kv: u (4) -> K,V (4) = 32; kv+context: [u, u_prev, mean] (12) -> K,V (4) = 96;
    # normalised: the residual's map and projections = 64.
    fill = {kind: ridgefill_prefill_flops(TOY, RidgeFillShape(4, 1, 1, map_kind=kind)).fill
            for kind in (None, "residual", "normalised", "kv", "kv+context")}
    assert fill == {None: 192, "residual": 192, "normalised": 192, "kv": 3 * 32, "kv+context": 3 * 96}
    assert flop_bound(TOY, RidgeFillShape(4, 1, 1, map_kind="kv")) == pytest.approx(2704 / (1936 - 192 + 96))
    with pytest.raises(ValueError, match="unknown map kind 'linear'"):
        ridgefill_prefill_flops(TOY, RidgeFillShape(4, 1, 1, map_kind="linear"))


def test_flops_toy_exact_rows_and_selector():
    # N=8, S=1, T=2, E=2: prefix 6, filled 4; exact rows at the prefix's mean see (6 + 1)/2 = 3.5 keys each.
    f = ridgefill_prefill_flops(TOY, RidgeFillShape(8, 1, 2, exact_rows=2), selector_flops=100.0)
    assert f.linear == 2 * 144 * (8 + 4)  # lower 8 rows + upper (2 tail + 2 exact) = 3456
    assert f.attention == 16 * (36 + 15 + 7)  # lower pairs(8) = 36; tail rows at 6, 7 see 7 + 8 = 15; exact 2 * 3.5 = 7
    assert f.fill == 4 * 64
    assert f.selector == 100.0
    # 64 query rows capped at N=8: 1 layer * 2 * head_dim 2 * heads 2 * 8 * 8 = 512.
    assert attention_selector_flops(TOY, 8, layers=1) == 512


def test_split_at_the_top_is_exact():
    shape = RidgeFillShape(4096, 24, 1024)
    assert layer_pass_bound(shape, 24) == pytest.approx(1.0)
    dims = ModelDims.from_hf_config(QWEN2_05B_CONFIG)
    assert flop_bound(dims, shape) == pytest.approx(1.0)


def test_qwen2_bound_counts_attention_and_maps():
    # The FLOP bound sits below 1/r here: the tail's attention over the whole context and the maps cost extra.
    dims = ModelDims.from_hf_config(QWEN2_05B_CONFIG)
    shape = RidgeFillShape(8192, 12, 1024)
    assert 1.0 < flop_bound(dims, shape) < layer_pass_bound(shape, 24)


def test_shape_errors_name_the_value():
    with pytest.raises(ValueError, match=r"^num_tokens must be a positive integer, got 0$"):
        RidgeFillShape(0, 12, 1024)
    with pytest.raises(ValueError, match=r"^exact_rows 8000 exceeds the prefix of 7168 rows \(N=8192, T=1024\)$"):
        RidgeFillShape(8192, 12, 1024, exact_rows=8000)
    with pytest.raises(ValueError, match=r"^split 30 is outside 1\.\.24 for a 24-layer model$"):
        layer_pass_fraction(RidgeFillShape(8192, 30, 1024), 24)


def test_dims_errors_name_the_source():
    with pytest.raises(ValueError, match=r"^x/config\.json: missing hidden_size, vocab_size; cannot count FLOPs for this model$"):
        ModelDims.from_hf_config({"num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 8}, source="x/config.json")
    with pytest.raises(ValueError, match=r"^ModelDims\.num_layers must be a positive integer, got 0$"):
        ModelDims(0, 4, 2, 1, 2, 8, 10)


def test_text_config_is_read():
    dims = ModelDims.from_hf_config({"text_config": QWEN2_05B_CONFIG, "model_type": "wrapper"})
    assert dims.num_layers == 24 and dims.num_kv_heads == 2


# Qwen3.5-9B's shape (transformers' defaults): d 4096, MLP 12288, 16 heads / 4 KV heads of 256 with an output
# gate; Gated DeltaNet 16 key heads and 32 value heads of 128, conv width 4; attention every 4th of 32 layers.
QWEN35_9B_CONFIG = {
    "model_type": "qwen3_5_text", "num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 16,
    "num_key_value_heads": 4, "head_dim": 256, "intermediate_size": 12288, "vocab_size": 248320,
    "layer_types": [("full_attention" if (l + 1) % 4 == 0 else "linear_attention") for l in range(32)],
    "linear_num_key_heads": 16, "linear_num_value_heads": 32, "linear_key_head_dim": 128,
    "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4,
}


def test_hybrid_rows_cost_what_the_layer_kind_costs():
    dims = ModelDims.from_hf_config(QWEN35_9B_CONFIG)
    assert dims.kinds().count("attention") == 8 and dims.linear.conv_dim == 8192 and dims.attn_output_gate
    mac = lambda flops: flops / 2 / 1e6  # noqa: E731 - millions of multiply-adds
    # Attention layer: Q+gate 4096*8192 + K,V 2*4096*1024 + O 4096*4096 + MLP 3*4096*12288 = 209.7M.
    assert mac(2 * dims.layer_params) == pytest.approx(209.7, abs=0.05)
    # GDN layer: qkvz 4096*12288 + ba 4096*64 + out 4096*4096 + MLP 150.99M = 218.4M, + conv 8192*4 and
    # recurrence 4*32*128*128 = 2.13M: 220.5M.
    assert mac(dims.gdn_row_flops) == pytest.approx(220.5, abs=0.05)
    # A filled row in an upper GDN layer: map 16.8M + [q|k|v] 33.6M + [b|a] 0.26M + conv/recurrence 2.13M = 52.7M.
    assert mac(2 * 4096 * 4096 + dims.gdn_fill_flops) == pytest.approx(52.7, abs=0.05)


def test_hybrid_bound_counts_what_filled_gdn_rows_still_cost():
    dims = ModelDims.from_hf_config(QWEN35_9B_CONFIG)
    # Split 12: lower 3 attention + 9 GDN, upper 5 attention + 15 GDN. A prefix row's cost relative to an exact
    # row (attention pairs aside): (3*209.7 + 9*220.5 + 5*25.2 + 15*52.7) / (8*209.7 + 24*220.5) = 0.507.
    long = RidgeFillShape(num_tokens=1_000_000, split=12, tail=1)
    exact, rf = exact_prefill_flops(dims, long.num_tokens), ridgefill_prefill_flops(dims, long)
    assert (rf.linear + rf.fill) / exact.linear == pytest.approx(0.507, abs=0.002)
    # The attention-only view (every layer like an attention layer, fill K/V only) would claim 0.375 + maps.
    dense = ModelDims(32, 4096, 16, 4, 256, 12288, 248320)
    rf_dense = ridgefill_prefill_flops(dense, long)
    assert (rf_dense.linear + rf_dense.fill) / exact_prefill_flops(dense, long.num_tokens).linear < 0.46
    # At 8K tokens and tail 1024 the FLOP bound sits below the layer-pass bound 1/r.
    shape = RidgeFillShape(8192, 12, 1024)
    assert flop_bound(dims, shape) < layer_pass_bound(shape, 32)
