"""bfloat16 matmuls through float32 on a CPU without bfloat16 instructions: the same sums, PyTorch's path
everywhere else."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from sgl_ridgefill import envs
from sgl_ridgefill.cpu import matmul
from sgl_ridgefill.cpu.dtype import CpuFeatures

AMX = CpuFeatures("AVX512", avx512_bf16=True, amx=True)
EPYC_AVX2 = CpuFeatures("AVX2", avx512_bf16=False, amx=False)


@pytest.fixture
def upcasting(monkeypatch):
    """This process as a CPU without native bfloat16 (whatever it has)."""
    monkeypatch.setattr(matmul, "_here", lambda: True)


def _operands(rows: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, 64, generator=g).bfloat16()
    w = (torch.randn(48, 64, generator=g) * 0.1).bfloat16()
    b = torch.randn(48, generator=g).bfloat16()
    return x, w, b


def test_the_choice_follows_the_cpu_and_the_variable(monkeypatch):
    monkeypatch.delenv(envs.BF16_MATMUL, raising=False)
    assert matmul.through_float32(EPYC_AVX2) and not matmul.through_float32(AMX)
    monkeypatch.setenv(envs.BF16_MATMUL, "native")
    assert not matmul.through_float32(EPYC_AVX2)
    monkeypatch.setenv(envs.BF16_MATMUL, "fast")
    with pytest.raises(ValueError, match="RIDGEFILL_BF16_MATMUL must be one of auto, native, got 'fast'"):
        matmul.through_float32(EPYC_AVX2)


def test_upcast_linear_computes_the_bfloat16_sums_in_float32(upcasting):
    x, w, b = _operands(64)
    assert matmul.upcasts(x, w)
    out = matmul.linear(x, w, b)
    assert out.dtype == torch.bfloat16 and out.shape == (64, 48)
    # bfloat16 products are exact in float32: the float32 GEMM's result rounded once to bfloat16
    expected = F.linear(x.float(), w.float(), b.float()).bfloat16()
    assert torch.equal(out, expected)
    exact = F.linear(x.double(), w.double(), b.double())
    assert (out.double() - exact).abs().max() <= exact.abs().max() * 2 ** -7  # within bfloat16's rounding


def test_other_calls_keep_pytorchs_path(upcasting, monkeypatch):
    calls = []
    real = F.linear
    monkeypatch.setattr(matmul.F, "linear", lambda *a: calls.append(a[0].dtype) or real(*a))
    x, w, b = _operands(matmul.MIN_ROWS - 1)  # a decode step's rows: converting the weight costs more
    assert not matmul.upcasts(x, w)
    matmul.linear(x, w, b)
    matmul.linear(x.float(), w.float(), b.float())
    assert calls == [torch.bfloat16, torch.float32]
    matmul.linear(*_operands(matmul.MIN_ROWS))
    assert calls[-1] == torch.float32


def test_nothing_changes_where_the_cpu_has_bfloat16(monkeypatch):
    monkeypatch.setattr(matmul, "_here", lambda: False)
    x, w, b = _operands(64)
    assert not matmul.upcasts(x, w)
    assert torch.equal(matmul.linear(x, w, b), F.linear(x, w, b))
    model = torch.nn.Sequential(torch.nn.Linear(64, 48))
    assert matmul.upcast_linears(model) == 0 and "forward" not in vars(model[0])


def test_upcast_linears_routes_a_models_projections(upcasting):
    class Sub(torch.nn.Linear):
        pass

    model = torch.nn.Sequential(torch.nn.Linear(64, 48), torch.nn.GELU(), Sub(48, 8)).bfloat16()
    assert matmul.upcast_linears(model) == 1  # a subclass (quantized, LoRA) keeps its own forward
    x, _, _ = _operands(32)
    hidden = F.linear(x.float(), model[0].weight.float(), model[0].bias.float()).bfloat16()
    assert torch.equal(model[0](x), hidden)


def test_sglangs_linear_and_lm_head_hooks_route_bfloat16_through_float32(upcasting):
    """The CPU recipe's hooks (``patches.py``): SGLang's own path only where nothing is upcast."""
    from types import SimpleNamespace

    from sgl_ridgefill import patches

    x, w, b = _operands(64)
    original = []
    layer = SimpleNamespace(weight=w)
    out = patches.around_linear_apply(lambda *a: original.append(a) or "sglang", "method", layer, x, b)
    assert torch.equal(out, F.linear(x.float(), w.float(), b.float()).bfloat16()) and not original
    assert patches.around_linear_apply(lambda *a: "sglang", "method", layer, x[:2], b) == "sglang"  # a decode step

    head = SimpleNamespace(weight=w, quant_method=None)
    processor = SimpleNamespace(use_fp32_lm_head=False)
    logits = patches.around_compute_lm_head(lambda *a, **k: "sglang", processor, x, head, None)
    assert torch.equal(logits, F.linear(x.float(), w.float()).bfloat16())
    assert patches.around_compute_lm_head(lambda *a, **k: "sglang", processor, x, head, b) == "sglang"  # a bias
    lora = SimpleNamespace(weight=w, quant_method=None, set_lora=None)
    assert patches.around_compute_lm_head(lambda *a, **k: "sglang", processor, x, lora, None) == "sglang"
    fp32_head = SimpleNamespace(use_fp32_lm_head=True)
    assert patches.around_compute_lm_head(lambda *a, **k: "sglang", fp32_head, x, head, None) == "sglang"
