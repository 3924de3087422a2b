"""RMSNorm over the last dimension, with the rounding SGLang's ``RMSNorm.forward_native`` uses.

``y = x * rsqrt(mean(x²) + eps) * weight`` computed in float32 and rounded once to ``x.dtype``. It is
the input norm of every Llama/Qwen layer and Qwen3's per-head K norm, so a filled row's keys and values
go through the same arithmetic as an exact row's (:mod:`sgl_ridgefill.kernels.fill_kv`). Gemma's
``(1 + weight)`` variant is not covered.
"""

from __future__ import annotations

import math

import torch

from sgl_ridgefill.kernels.backend import check_same_device, use_triton

_FLOAT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _check(where: str, x: torch.Tensor, weight: torch.Tensor, eps: float) -> None:
    if x.dim() != 2:
        raise ValueError(f"{where}: x must be [rows, d], got shape {tuple(x.shape)}")
    if tuple(weight.shape) != (x.shape[1],):
        raise ValueError(f"{where}: weight must have shape ({x.shape[1]},), got {tuple(weight.shape)}")
    for name, t in (("x", x), ("weight", weight)):
        if t.dtype not in _FLOAT_DTYPES:
            raise ValueError(f"{where}: {name} must be bf16, fp16 or fp32, got {t.dtype}")
    if not (isinstance(eps, (int, float)) and math.isfinite(eps) and eps >= 0):
        raise ValueError(f"{where}: eps must be a finite number >= 0, got {eps!r}")
    check_same_device(where, x=x, weight=weight)


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``x: [rows, d]``, ``weight: [d]`` -> ``[rows, d]`` in ``x.dtype``."""
    _check("rms_norm_reference", x, weight, eps)
    xf = x.float()
    inv_rms = torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps)
    return (xf * inv_rms * weight.float()).to(x.dtype)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, *, backend: str = "auto") -> torch.Tensor:
    """``x: [rows, d]`` (any strides), ``weight: [d]`` -> ``[rows, d]`` in ``x.dtype``; Triton on CUDA or
    ``backend="triton"``, :func:`rms_norm_reference` otherwise."""
    where = "rms_norm"
    _check(where, x, weight, eps)
    if not use_triton(backend, x, weight, where=where):
        return rms_norm_reference(x, weight, eps)
    import triton

    from sgl_ridgefill.kernels import rms_norm_triton as kernels

    rows, d = x.shape
    out = torch.empty(rows, d, dtype=x.dtype, device=x.device)
    assert all(s >= 0 for s in x.stride()), "negative strides are not supported"
    if rows == 0 or d == 0:
        return out
    kernels._rms_norm_kernel[(rows,)](
        x, weight, out, d, float(eps),
        x.stride(0), x.stride(1), weight.stride(0), out.stride(0), out.stride(1),
        BLOCK_D=triton.next_power_of_2(d),
    )
    return out
