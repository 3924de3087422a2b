"""Triton kernels against their references, run by ``test_triton_interpreter.py`` in a subprocess.

``python -m tests.kernels.interpreter_cases`` with ``TRITON_INTERPRET=1`` runs every case in
:data:`CASES` on CPU under Triton's interpreter and prints one JSON line: per case the output dtype,
the worst error relative to the reference's largest entry and in units of the output format's
spacing, how many kernel launches happened and whether the launched kernels were interpreted.
Importing this module does not import triton, so the test can collect the case names without
switching its own process to the interpreter.
"""

from __future__ import annotations

from typing import Callable

import torch

from sgl_ridgefill.kernels.attention_stats import attention_received, attention_received_reference
from sgl_ridgefill.kernels.map_apply import apply_map, apply_map_int8, apply_map_int8_reference, apply_map_reference
from sgl_ridgefill.kernels.quant import quantize_int8_groupwise
from tests.support.interpreter import main

T = "triton"
Case = Callable[[], tuple[torch.Tensor, torch.Tensor]]
CASES: dict[str, Case] = {}


def case(fn: Case) -> Case:
    CASES[fn.__name__] = fn
    return fn


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _map_inputs(rows: int, d_in: int, d_out: int, dtype: torch.dtype, seed: int = 0):
    g = _gen(seed)
    x = torch.randn(rows, d_in, generator=g).to(dtype)
    A = (torch.randn(d_out, d_in, generator=g) / d_in**0.5).to(dtype)
    return x, A, torch.randn(d_out, generator=g).to(dtype)


# ------------------------------------------------------------------------------------------ float maps


@case
def map_fp32_rows37_d96() -> tuple[torch.Tensor, torch.Tensor]:
    x, A, b = _map_inputs(37, 96, 80, torch.float32)
    return apply_map(x, A, b, backend=T), apply_map_reference(x, A, b)


@case
def map_bf16_rows37_d96() -> tuple[torch.Tensor, torch.Tensor]:
    x, A, b = _map_inputs(37, 96, 80, torch.bfloat16)
    return apply_map(x, A, b, backend=T), apply_map_reference(x, A, b)


@case
def map_fp16_rows1_d200() -> tuple[torch.Tensor, torch.Tensor]:
    x, A, b = _map_inputs(1, 200, 96, torch.float16)
    return apply_map(x, A, b, backend=T), apply_map_reference(x, A, b)


@case
def map_bf16_strided_views_and_out() -> tuple[torch.Tensor, torch.Tensor]:
    x_buf, A, b = _map_inputs(74, 300, 80, torch.bfloat16)
    x = x_buf[::2, 50:250]  # [37, 200], row stride 600
    A_cols = A.t().contiguous().t()[:, 50:250]  # column-major map [80, 200]
    out = torch.full((37, 160), float("nan"), dtype=torch.bfloat16)[:, ::2]  # strided output [37, 80]
    apply_map(x, A_cols, b, backend=T, out=out)
    return out, apply_map_reference(x, A_cols, b)


@case
def map_mixed_fp32_x_bf16_map() -> tuple[torch.Tensor, torch.Tensor]:
    x, A, b = _map_inputs(37, 96, 80, torch.float32)
    return apply_map(x, A.bfloat16(), b, backend=T), apply_map_reference(x, A.bfloat16(), b)



# ------------------------------------------------------------------------------------------- int8 maps


def _int8_case(rows: int, d_in: int, group_size: int, dtype: torch.dtype):
    x, A, b = _map_inputs(rows, d_in, 80, dtype, seed=group_size)
    q, scale = quantize_int8_groupwise(A, group_size)
    return apply_map_int8(x, q, scale, b, group_size, backend=T), apply_map_int8_reference(x, q, scale, b, group_size)


@case
def int8_group32_tile_scaled_bf16() -> tuple[torch.Tensor, torch.Tensor]:
    return _int8_case(37, 96, 32, torch.bfloat16)


@case
def int8_group40_element_scaled_bf16() -> tuple[torch.Tensor, torch.Tensor]:
    return _int8_case(37, 200, 40, torch.bfloat16)


@case
def int8_group48_block16_fp32() -> tuple[torch.Tensor, torch.Tensor]:
    return _int8_case(7, 200, 48, torch.float32)


@case
def int8_group128_wider_than_d_fp32() -> tuple[torch.Tensor, torch.Tensor]:
    return _int8_case(37, 96, 128, torch.float32)



# ------------------------------------------------------------------------------------ attention stats


def _attention_case(n_q: int, n_k: int, heads: int, n_kv: int, head_dim: int, dtype: torch.dtype, shift: int):
    g = _gen(n_k)
    q = (torch.randn(n_q, heads, head_dim, generator=g) * 2).to(dtype)
    k = torch.randn(n_k, n_kv, head_dim, generator=g).to(dtype)
    k_pos = torch.arange(n_k)
    q_pos = torch.arange(n_k - n_q, n_k) - shift
    scale = head_dim**-0.5
    want = attention_received_reference(q, k, q_pos, k_pos, scale)
    return attention_received(q, k, q_pos, k_pos, scale, backend=T), want


@case
def attention_fp32_gqa7_d80() -> tuple[torch.Tensor, torch.Tensor]:
    return _attention_case(7, 333, 14, 2, 80, torch.float32, shift=100)


@case
def attention_bf16_gqa1_d96() -> tuple[torch.Tensor, torch.Tensor]:
    return _attention_case(5, 150, 2, 2, 96, torch.bfloat16, shift=40)


@case
def attention_fp16_one_query_gqa2_d64() -> tuple[torch.Tensor, torch.Tensor]:
    return _attention_case(1, 111, 4, 2, 64, torch.float16, shift=0)


@case
def attention_strided_unsorted_and_blind_queries() -> tuple[torch.Tensor, torch.Tensor]:
    g = _gen(7)
    qkv = torch.randn(3, 6 * 48 + 40, generator=g)
    q = qkv[:, : 6 * 48].view(3, 6, 48)  # a column window of a wider buffer
    k = torch.randn(140, 2, 48, generator=g)[::2]  # every other row
    k_pos = torch.randperm(70, generator=g)
    q_pos = torch.tensor([30, -1, 69])  # the second query sees no key
    return attention_received(q, k, q_pos, k_pos, 0.2, backend=T), attention_received_reference(q, k, q_pos, k_pos, 0.2)


# --------------------------------------------------------------------------------------------- runner


def _ulp(want: torch.Tensor) -> torch.Tensor:
    """Spacing of ``want.dtype`` at each entry of ``want`` (floored at 1 % of the largest entry)."""
    mantissa_bits = {torch.bfloat16: 7, torch.float16: 10, torch.float32: 23}[want.dtype]
    magnitude = want.double().abs().clamp_min(0.01 * float(want.double().abs().max()) + 1e-30)
    return 2.0 ** (torch.floor(torch.log2(magnitude)) - mantissa_bits)


def _kernels():
    from sgl_ridgefill.kernels import attention_stats_triton, map_apply_triton

    return (
        (map_apply_triton, ("_map_kernel", "_map_int8_kernel")),
        (attention_stats_triton, ("_lse_kernel", "_received_kernel")),
    )


def _measure(got: torch.Tensor, want: torch.Tensor) -> dict:
    diff = (got.double() - want.double()).abs()
    return {
        "dtype": str(got.dtype).removeprefix("torch."),
        "same_dtype": got.dtype == want.dtype and got.shape == want.shape,
        "err": float(diff.max() / want.double().abs().max().clamp_min(1e-30)),
        "ulps": float((diff / _ulp(want)).max()),
    }


if __name__ == "__main__":
    main(CASES, _kernels, _measure)
