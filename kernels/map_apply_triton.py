"""Triton kernels for the map application ``out = X · Aᵀ + b`` (bf16/fp16/fp32 and int8 maps).

This module imports ``triton`` at the top: load it only through the launchers in
:mod:`sgl_ridgefill.kernels.map_apply`, which own the layout contract and check every shape, stride and
dtype before a launch.

Both kernels are one tiled GEMM with float32 accumulation. The grid walks the output tiles, grouped so
that ``GROUP_M`` row tiles reuse a column panel of ``A`` from L2.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _tile_ids(rows, d_out, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    pid = tl.program_id(0)
    n_tiles_m = tl.cdiv(rows, BLOCK_M)
    n_tiles_n = tl.cdiv(d_out, BLOCK_N)
    per_group = GROUP_M * n_tiles_n
    first_m = (pid // per_group) * GROUP_M
    group_rows = tl.minimum(n_tiles_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % group_rows
    pid_n = (pid % per_group) // group_rows
    return pid_m, pid_n


@triton.jit
def _dot(x, a, DOT_FP32: tl.constexpr):
    """``x: [BM, BK]``, ``a: [BK, BN]`` (any float or int8) -> ``[BM, BN]`` float32."""
    if DOT_FP32:
        return tl.dot(x.to(tl.float32), a.to(tl.float32), input_precision="ieee")
    else:
        # The launcher only clears DOT_FP32 when x is bf16/fp16, so ``a`` goes to the tensor cores in
        # x's dtype: exact for int8 codes, one rounding for a dequantised or float32 tile.
        return tl.dot(x, a.to(x.dtype))


@triton.jit
def _store_tile(out_ptr, acc, b_ptr, offs_m, offs_n, m_ok, n_ok, stride_bn, stride_om, stride_on):
    bias = tl.load(b_ptr + offs_n * stride_bn, mask=n_ok, other=0).to(tl.float32)
    acc += bias[None, :]
    out_ptrs = out_ptr + offs_m[:, None] * stride_om + offs_n[None, :] * stride_on
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


@triton.jit
def _map_kernel(
    x_ptr, a_ptr, b_ptr, out_ptr,
    rows, d_in, d_out,
    stride_xm, stride_xk,
    stride_an, stride_ak,
    stride_bn,
    stride_om, stride_on,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    DOT_FP32: tl.constexpr,
):
    """``x: [rows, d_in]``, ``a: [d_out, d_in]`` float, ``b: [d_out]`` -> ``out: [rows, d_out]``."""
    pid_m, pid_n = _tile_ids(rows, d_out, BLOCK_M, BLOCK_N, GROUP_M)
    # int64 so that row * stride cannot wrap at 512K rows x d=4096.
    offs_m = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    offs_n = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
    offs_k = tl.arange(0, BLOCK_K)
    m_ok = offs_m < rows
    n_ok = offs_n < d_out

    x_ptrs = x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :] * stride_xk
    # A is read transposed, as a [BLOCK_K, BLOCK_N] tile of Aᵀ.
    a_ptrs = a_ptr + offs_n[None, :] * stride_an + offs_k[:, None] * stride_ak
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, d_in, BLOCK_K):
        k_ok = offs_k + k0 < d_in
        x = tl.load(x_ptrs, mask=m_ok[:, None] & k_ok[None, :], other=0)
        a = tl.load(a_ptrs, mask=k_ok[:, None] & n_ok[None, :], other=0)
        acc += _dot(x, a, DOT_FP32)
        x_ptrs += BLOCK_K * stride_xk
        a_ptrs += BLOCK_K * stride_ak
    _store_tile(out_ptr, acc, b_ptr, offs_m, offs_n, m_ok, n_ok, stride_bn, stride_om, stride_on)


@triton.jit
def _map_int8_kernel(
    x_ptr, q_ptr, scale_ptr, b_ptr, out_ptr,
    rows, d_in, d_out,
    stride_xm, stride_xk,
    stride_qn, stride_qk,
    stride_sn, stride_sg,
    stride_bn,
    stride_om, stride_on,
    GROUP_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    DOT_FP32: tl.constexpr,
):
    """``x: [rows, d_in]``, ``q: [d_out, d_in]`` int8, ``scale: [d_out, n_groups]`` f32, ``b: [d_out]``
    -> ``out: [rows, d_out]``, with ``A = q * scale`` dequantised in registers."""
    pid_m, pid_n = _tile_ids(rows, d_out, BLOCK_M, BLOCK_N, GROUP_M)
    offs_m = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    offs_n = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
    offs_k = tl.arange(0, BLOCK_K)
    m_ok = offs_m < rows
    n_ok = offs_n < d_out

    x_ptrs = x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :] * stride_xk
    q_ptrs = q_ptr + offs_n[None, :] * stride_qn + offs_k[:, None] * stride_qk
    s_row = scale_ptr + offs_n * stride_sn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, d_in, BLOCK_K):
        k_ok = offs_k + k0 < d_in
        x = tl.load(x_ptrs, mask=m_ok[:, None] & k_ok[None, :], other=0)
        q = tl.load(q_ptrs, mask=k_ok[:, None] & n_ok[None, :], other=0)
        if GROUP_SIZE % BLOCK_K == 0:
            # The whole K tile lies in one group: multiply the int8 codes exactly (they fit in bf16) and
            # scale the partial sums once per output column, instead of per element.
            s = tl.load(s_row + (k0 // GROUP_SIZE) * stride_sg, mask=n_ok, other=0)
            acc += _dot(x, q, DOT_FP32) * s[None, :]
        else:
            g = (offs_k + k0) // GROUP_SIZE
            s = tl.load(s_row[None, :] + g[:, None] * stride_sg, mask=k_ok[:, None] & n_ok[None, :], other=0)
            acc += _dot(x, q.to(tl.float32) * s, DOT_FP32)
        x_ptrs += BLOCK_K * stride_xk
        q_ptrs += BLOCK_K * stride_qk
    _store_tile(out_ptr, acc, b_ptr, offs_m, offs_n, m_ok, n_ok, stride_bn, stride_om, stride_on)
