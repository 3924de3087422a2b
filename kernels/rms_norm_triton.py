"""Triton kernel for RMSNorm over the last dimension (see :mod:`sgl_ridgefill.kernels.rms_norm`).

This module imports ``triton`` at the top: load it only through the launcher in
:mod:`sgl_ridgefill.kernels.rms_norm`. One program normalises one row held whole in registers
(``BLOCK_D = next_power_of_2(d)``), the usual shape of a norm kernel for hidden sizes up to ~16K.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _rms_norm_kernel(
    x_ptr, w_ptr, out_ptr,
    d, eps,
    stride_xm, stride_xd, stride_w, stride_om, stride_od,
    BLOCK_D: tl.constexpr,
):
    """``x: [rows, d]``, ``w: [d]`` -> ``out: [rows, d]`` = ``x * rsqrt(mean(x²) + eps) * w`` in float32,
    rounded once."""
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_D)
    ok = offs < d
    x = tl.load(x_ptr + row * stride_xm + offs * stride_xd, mask=ok, other=0).to(tl.float32)
    inv_rms = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / d + eps)
    w = tl.load(w_ptr + offs * stride_w, mask=ok, other=0).to(tl.float32)
    y = x * inv_rms * w
    tl.store(out_ptr + row * stride_om + offs * stride_od, y.to(out_ptr.dtype.element_ty), mask=ok)
