"""The map application's reference and torch backends against float64 arithmetic, and the argument checks."""

from __future__ import annotations

import pytest
import torch

from sgl_ridgefill.kernels.backend import interpreter_active, triton_available
from sgl_ridgefill.kernels.map_apply import (
    apply_map,
    apply_map_int8,
    apply_map_int8_reference,
    apply_map_reference,
)
from sgl_ridgefill.kernels.quant import quantize_int8_groupwise

# Worst |error| allowed, relative to the largest |expected| entry: float32 accumulation for fp32, and one
# final rounding (2^-8 relative for bf16) plus accumulation for bf16.
TOL = {torch.float32: 1e-5, torch.bfloat16: 8e-3}


def _inputs(rows: int, d_in: int, d_out: int, dtype: torch.dtype, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, d_in, generator=gen).to(dtype)
    A = (torch.randn(d_out, d_in, generator=gen) / d_in**0.5).to(dtype)
    b = torch.randn(d_out, generator=gen).to(dtype)
    return x, A, b


def _naive(x: torch.Tensor, A: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``x @ A.T + b`` as float64 elementwise products and sums (no BLAS call shared with the code under test)."""
    return (x.double()[:, None, :] * A.double()[None, :, :]).sum(-1) + b.double()


def _rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.double() - want).abs().max() / want.abs().max().clamp_min(1e-30))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 7, 111])
@pytest.mark.parametrize("d_in", [96, 200])
def test_reference_matches_float64(rows: int, d_in: int, dtype: torch.dtype) -> None:
    x, A, b = _inputs(rows, d_in, 80, dtype)
    got = apply_map_reference(x, A, b)
    assert got.dtype == dtype and got.shape == (rows, 80)
    assert _rel_err(got, _naive(x, A, b)) <= TOL[dtype]


def test_reference_accepts_strided_views_and_out() -> None:
    x_buf, A, b = _inputs(222, 400, 96, torch.float32)
    x = x_buf[::2, 100:300]  # every other row and a column window: neither stride is dense
    A_t = A[:, 100:300].t().contiguous().t()  # column-major map
    assert not x.is_contiguous() and not A_t.is_contiguous()
    want = _naive(x, A_t, b)
    out = torch.full((111, 96), float("nan"))
    got = apply_map_reference(x, A_t, b, out=out)
    assert got.data_ptr() == out.data_ptr()
    assert _rel_err(out, want) <= TOL[torch.float32]
    out_bf16 = torch.empty(111, 96, dtype=torch.bfloat16)
    apply_map_reference(x.bfloat16(), A_t.bfloat16(), b.bfloat16(), out=out_bf16)
    assert _rel_err(out_bf16, _naive(x.bfloat16(), A_t.bfloat16(), b.bfloat16())) <= TOL[torch.bfloat16]


def test_mixed_dtypes_accumulate_in_float32() -> None:
    x, A, b = _inputs(7, 200, 96, torch.float32)
    got = apply_map_reference(x, A.bfloat16(), b)
    assert got.dtype == torch.float32
    assert _rel_err(got, _naive(x, A.bfloat16(), b)) <= TOL[torch.float32]



def _dequantise_float64(q: torch.Tensor, scale: torch.Tensor, group_size: int) -> torch.Tensor:
    """The layout contract of quant.py written out column by column: ``A[o, i] = q[o, i] * scale[o, i // g]``."""
    columns = torch.arange(q.shape[-1]) // group_size
    return q.double() * scale.double()[..., columns]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("group_size", [32, 40, 128])
@pytest.mark.parametrize("rows,d_in", [(1, 96), (7, 200), (111, 200)])
def test_int8_reference_matches_dequantised_float64(rows: int, d_in: int, group_size: int, dtype) -> None:
    x, A, b = _inputs(rows, d_in, 96, dtype)
    q, scale = quantize_int8_groupwise(A, group_size)
    got = apply_map_int8_reference(x, q, scale, b, group_size)
    assert got.dtype == dtype
    assert _rel_err(got, _naive(x, _dequantise_float64(q, scale, group_size), b)) <= TOL[dtype]



def test_int8_error_is_within_half_a_step_of_the_group_scale() -> None:
    gen = torch.Generator().manual_seed(5)
    A = torch.randn(896, 896, generator=gen)
    q, scale = quantize_int8_groupwise(A, 128)
    err = (_dequantise_float64(q, scale, 128) - A.double()).abs()
    half_step = scale.double().repeat_interleave(128, dim=1)[:, :896] / 2
    assert bool((err <= half_step * (1 + 1e-6)).all())
    # Gaussian groups of 128 have max|A| near 2.6-3 sigma, so the error is far from the whole matrix's scale.
    assert float(err.norm() / A.double().norm()) < 0.01


def test_auto_backend_on_cpu_is_the_reference() -> None:
    x, A, b = _inputs(7, 96, 80, torch.bfloat16)
    assert torch.equal(apply_map(x, A, b), apply_map_reference(x, A, b))
    q, scale = quantize_int8_groupwise(A, 32)
    assert torch.equal(apply_map_int8(x, q, scale, b, 32), apply_map_int8_reference(x, q, scale, b, 32))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_torch_backend_matches_float64(dtype: torch.dtype) -> None:
    x_buf, A, b = _inputs(222, 200, 96, dtype)
    x = x_buf[::2]  # a strided view, as the runtime passes rows of a hidden-state buffer
    got = apply_map(x, A, b, backend="torch")
    assert got.dtype == dtype and got.shape == (111, 96)
    assert _rel_err(got, _naive(x, A, b)) <= TOL[dtype]
    out = torch.full((111, 192), float("nan"), dtype=dtype)[:, ::2]
    assert apply_map(x, A, b, backend="torch", out=out).data_ptr() == out.data_ptr()
    assert _rel_err(out, _naive(x, A, b)) <= TOL[dtype]


def test_torch_backend_with_mixed_dtypes_is_the_reference() -> None:
    x, A, b = _inputs(7, 96, 80, torch.bfloat16)
    assert torch.equal(apply_map(x, A.float(), b, backend="torch"), apply_map_reference(x, A.float(), b))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("group_size", [40, 128])
def test_int8_torch_backend_matches_dequantised_float64(group_size: int, dtype: torch.dtype) -> None:
    x, A, b = _inputs(111, 200, 96, dtype)
    q, scale = quantize_int8_groupwise(A, group_size)
    got = apply_map_int8(x, q, scale, b, group_size, backend="torch")
    assert got.dtype == dtype
    # The map is rounded to x's dtype before the product: one more rounding than the reference's.
    assert _rel_err(got, _naive(x, _dequantise_float64(q, scale, group_size), b)) <= TOL[dtype]


def test_unknown_backend_is_named() -> None:
    x, A, b = _inputs(7, 96, 80, torch.float32)
    with pytest.raises(ValueError) as info:
        apply_map(x, A, b, backend="cuda")
    assert str(info.value) == "apply_map: backend must be one of ('auto', 'triton', 'torch', 'reference'), got 'cuda'"


@pytest.mark.skipif(not triton_available() or interpreter_active(), reason="needs triton without the interpreter")
def test_triton_backend_on_cpu_tensors_without_interpreter_is_refused() -> None:
    x, A, b = _inputs(7, 96, 80, torch.float32)
    with pytest.raises(ValueError) as info:
        apply_map(x, A, b, backend="triton")
    assert str(info.value) == (
        "apply_map: backend='triton' needs CUDA tensors or TRITON_INTERPRET=1 set before triton is imported; "
        "got tensors on ['cpu']"
    )


def test_shape_errors_name_the_values() -> None:
    x, A, b = _inputs(7, 96, 80, torch.float32)
    with pytest.raises(ValueError) as info:
        apply_map(x[:, :95], A, b)
    assert str(info.value) == (
        "apply_map: the map takes d_in=96 columns but x_split has 95 (shapes (80, 96) and (7, 95))"
    )
    with pytest.raises(ValueError) as info:
        apply_map(x, A, b[:79])
    assert str(info.value) == "apply_map: b must have shape (80,), got (79,)"
    with pytest.raises(ValueError) as info:
        apply_map(x, A[None], b)
    assert str(info.value) == "apply_map: the map must be [d_out, d_in], got shape (1, 80, 96)"
    with pytest.raises(ValueError) as info:
        apply_map(x.long(), A, b)
    assert str(info.value) == "apply_map: x_split must be bf16, fp16 or fp32, got torch.int64"
    with pytest.raises(ValueError) as info:
        apply_map_reference(x, A, b, out=torch.empty(7, 80, dtype=torch.bfloat16))
    assert str(info.value) == (
        "apply_map_reference: out must be (7, 80) torch.float32 on cpu, got (7, 80) torch.bfloat16 on cpu"
    )


def test_int8_argument_errors_name_the_values() -> None:
    x, A, b = _inputs(7, 200, 96, torch.float32)
    q, scale = quantize_int8_groupwise(A, 64)
    with pytest.raises(ValueError) as info:
        apply_map_int8(x, q, scale, b, 128)
    assert str(info.value) == (
        "apply_map_int8: scale has shape (96, 4), expected (96, 2) for q (96, 200) and group_size 128"
    )
    with pytest.raises(ValueError) as info:
        apply_map_int8(x, q.to(torch.int16), scale, b, 64)
    assert str(info.value) == "apply_map_int8: q must be int8, got torch.int16"
    with pytest.raises(ValueError) as info:
        apply_map_int8(x, q, scale.double(), b, 64)
    assert str(info.value) == "apply_map_int8: scale must be float32, got torch.float64"
    with pytest.raises(ValueError) as info:
        apply_map_int8(x, q, scale, b, 0)
    assert str(info.value) == "group_size must be a positive integer, got 0"
