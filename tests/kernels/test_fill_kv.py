"""Keys and values of filled rows: RMSNorm and fill_kv_reference against float64 math and HF's own modules."""

from __future__ import annotations

import pytest
import torch

from sgl_ridgefill.kernels.fill_kv import fill_kv, fill_kv_reference
from sgl_ridgefill.kernels.rms_norm import rms_norm, rms_norm_reference


def _rms_norm64(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    x = x.double()
    return x / torch.sqrt((x * x).mean(dim=-1, keepdim=True) + eps) * w.double()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows,d", [(1, 96), (7, 200), (111, 80)])
def test_rms_norm_reference_matches_float64(rows: int, d: int, dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(0)
    x = (torch.randn(rows, d, generator=gen) * 3).to(dtype)
    w = torch.rand(d, generator=gen).to(dtype) + 0.5
    got = rms_norm_reference(x, w, 1e-5)
    assert got.dtype == dtype
    # One rounding of the output: half an ulp, 2^-9 relative for bf16.
    rel = 1e-6 if dtype == torch.float32 else 2.0**-8
    want = _rms_norm64(x, w, 1e-5)
    assert bool(((got.double() - want).abs() <= rel * want.abs() + 1e-12).all())


def test_rms_norm_with_zero_row_and_eps() -> None:
    x = torch.zeros(2, 4)
    x[1] = torch.tensor([1.0, -1.0, 1.0, -1.0])
    got = rms_norm_reference(x, torch.full((4,), 2.0), 0.0)
    assert torch.equal(got[1], torch.tensor([2.0, -2.0, 2.0, -2.0]))
    assert bool(torch.isnan(got[0]).all())  # eps=0 on a zero row: 0 * inf, as in SGLang; real models use eps > 0
    assert torch.equal(rms_norm_reference(x, torch.ones(4), 1e-6)[0], torch.zeros(4))


def _hf_layer(family: str, d: int, n_heads: int, n_kv: int, head_dim: int, seed: int):
    """One decoder layer's input norm and attention module from transformers, random weights in float32."""
    torch.manual_seed(seed)
    if family == "qwen3":
        from transformers.models.qwen3.modeling_qwen3 import Qwen3Attention as Attention, Qwen3Config as Config
    elif family == "qwen2":
        from transformers.models.qwen2.modeling_qwen2 import Qwen2Attention as Attention, Qwen2Config as Config
    else:
        from transformers.models.llama.modeling_llama import LlamaAttention as Attention, LlamaConfig as Config
    config = Config(
        hidden_size=d, num_attention_heads=n_heads, num_key_value_heads=n_kv, head_dim=head_dim,
        intermediate_size=64, num_hidden_layers=1, vocab_size=32, rms_norm_eps=1e-5,
    )
    attention = Attention(config, layer_idx=0)
    with torch.no_grad():
        for p in attention.parameters():
            p.normal_(0.0, 0.05)  # the init leaves biases and norm weights at 0 / 1, which would hide them
    norm_weight = torch.rand(d) + 0.5
    return attention, norm_weight, config.rms_norm_eps


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
def test_reference_matches_the_models_own_modules(family: str) -> None:
    rows, d, n_heads, n_kv, head_dim = 7, 200, 4, 2, 40
    attention, norm_weight, eps = _hf_layer(family, d, n_heads, n_kv, head_dim, seed=1)
    x_hat = torch.randn(rows, d) * 2
    with torch.no_grad():
        normed = x_hat / torch.sqrt(x_hat.pow(2).mean(-1, keepdim=True) + eps) * norm_weight
        k_hf = attention.k_proj(normed).view(rows, n_kv, head_dim)
        if family == "qwen3":
            k_hf = attention.k_norm(k_hf)
        v_hf = attention.v_proj(normed).view(rows, n_kv, head_dim)
    k, v = fill_kv_reference(
        x_hat, norm_weight, eps, attention.k_proj.weight.detach(), attention.v_proj.weight.detach(),
        None if attention.k_proj.bias is None else attention.k_proj.bias.detach(),
        None if attention.v_proj.bias is None else attention.v_proj.bias.detach(),
        attention.k_norm.weight.detach() if family == "qwen3" else None,
        head_dim=head_dim,
    )
    assert k.shape == v.shape == (rows, n_kv, head_dim)
    torch.testing.assert_close(k, k_hf, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(v, v_hf, rtol=1e-5, atol=1e-5)


def test_bf16_rounds_where_the_engine_does() -> None:
    gen = torch.Generator().manual_seed(2)
    rows, d, n_kv, head_dim = 111, 96, 2, 48
    x_hat = torch.randn(rows, d, generator=gen).bfloat16()
    norm_w = (torch.rand(d, generator=gen) + 0.5).bfloat16()
    w_k = (torch.randn(n_kv * head_dim, d, generator=gen) * 0.1).bfloat16()
    w_v = (torch.randn(n_kv * head_dim, d, generator=gen) * 0.1).bfloat16()
    b_v = torch.randn(n_kv * head_dim, generator=gen).bfloat16()
    k_norm = (torch.rand(head_dim, generator=gen) + 0.5).bfloat16()
    k, v = fill_kv_reference(x_hat, norm_w, 1e-6, w_k, w_v, None, b_v, k_norm)
    assert k.dtype == v.dtype == torch.bfloat16
    # Float64 with the engine's roundings to bf16: after the norm, after each projection, after the K norm.
    h = _rms_norm64(x_hat, norm_w, 1e-6).bfloat16().double()
    k64 = (h @ w_k.double().T).bfloat16()
    v64 = h @ w_v.double().T + b_v.double()
    k64 = _rms_norm64(k64.reshape(-1, head_dim), k_norm, 1e-6).reshape(rows, n_kv, head_dim)
    # Leftover differences are float32-vs-float64 accumulation flipping a rounding: one bf16 ulp at most.
    for got, want in ((k, k64), (v, v64.reshape(rows, n_kv, head_dim))):
        ulp = 2.0 ** (torch.floor(torch.log2(want.abs().clamp_min(1e-3))) - 7)
        assert bool(((got.double() - want).abs() <= ulp * 1.01).all())


def test_auto_backend_on_cpu_is_the_reference() -> None:
    gen = torch.Generator().manual_seed(3)
    x_hat, norm_w = torch.randn(7, 96, generator=gen), torch.rand(96, generator=gen)
    w_k, w_v = torch.randn(64, 96, generator=gen), torch.randn(64, 96, generator=gen)
    k_norm = torch.rand(32, generator=gen)
    want = fill_kv_reference(x_hat, norm_w, 1e-6, w_k, w_v, k_norm_weight=k_norm)
    got = fill_kv(x_hat, norm_w, 1e-6, w_k, w_v, k_norm_weight=k_norm)
    assert got[0].shape == (7, 2, 32)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert torch.equal(rms_norm(x_hat, norm_w, 1e-6), rms_norm_reference(x_hat, norm_w, 1e-6))


def test_argument_errors_name_the_values() -> None:
    x_hat, norm_w = torch.randn(7, 96), torch.rand(96)
    w_k, w_v = torch.randn(64, 96), torch.randn(64, 96)
    with pytest.raises(ValueError) as info:
        fill_kv_reference(x_hat, norm_w, 1e-6, w_k, w_v)
    assert str(info.value) == "fill_kv: head_dim is required when there is no k_norm_weight to read it from"
    with pytest.raises(ValueError) as info:
        fill_kv_reference(x_hat, norm_w, 1e-6, w_k, w_v, head_dim=48)
    assert str(info.value) == "fill_kv: w_k must be [n_kv_heads * head_dim, d] with head_dim=48, got (64, 96)"
    with pytest.raises(ValueError) as info:
        fill_kv_reference(x_hat, norm_w, 1e-6, w_k, w_v[:32], head_dim=32)
    assert str(info.value) == "fill_kv: w_v must have the shape of w_k (64, 96), got (32, 96)"
    with pytest.raises(ValueError) as info:
        fill_kv_reference(x_hat[:, :80], norm_w, 1e-6, w_k, w_v, head_dim=32)
    assert str(info.value) == "fill_kv: x_hat must be [rows, 96] to match w_k, got (7, 80)"
    with pytest.raises(ValueError) as info:
        rms_norm_reference(x_hat, norm_w[:95], 1e-6)
    assert str(info.value) == "rms_norm_reference: weight must have shape (96,), got (95,)"
    with pytest.raises(ValueError) as info:
        rms_norm(x_hat, norm_w, -1.0)
    assert str(info.value) == "rms_norm: eps must be a finite number >= 0, got -1.0"
