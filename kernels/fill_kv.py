"""Keys and values of filled rows: a layer's input norm, then its K and V projections (and K norm).

A filled row's predicted input ``x̂_l`` (from :mod:`sgl_ridgefill.kernels.map_apply`) goes through layer
``l``'s own arithmetic, unchanged (SPEC.md, "The fill"):

    h = RMSNorm(x̂; norm_weight, eps)                         rounded to x̂.dtype, as SGLang does
    k = h · w_kᵀ + b_k,  v = h · w_vᵀ + b_v                  float32 accumulation, rounded to x̂.dtype
    k = RMSNorm_per_head(k; k_norm_weight, k_norm_eps)       Qwen3's QK-norm, when given

Biases appear in Qwen2, the K norm in Qwen3; RoPE is left to the caller (it needs the rows' positions
and the model's rotary cache). The rounding points are those of an exact row in SGLang, so a filled
row differs from an exact one only through ``x̂``. The Triton path is the fused norm kernel of
:mod:`sgl_ridgefill.kernels.rms_norm` and the GEMM of :mod:`sgl_ridgefill.kernels.map_apply` (a
projection is a map with ``A = w_k``), so it rounds at the same points as the reference.
"""

from __future__ import annotations

import torch

from sgl_ridgefill.kernels.backend import use_triton
from sgl_ridgefill.kernels.map_apply import apply_map, apply_map_reference
from sgl_ridgefill.kernels.rms_norm import rms_norm, rms_norm_reference


def _resolve_head_dim(
    w_k: torch.Tensor, w_v: torch.Tensor, k_norm_weight: torch.Tensor | None, head_dim: int | None
) -> int:
    """Check the projection shapes and return ``head_dim`` (read from ``k_norm_weight`` when not given)."""
    if head_dim is None:
        if k_norm_weight is None:
            raise ValueError("fill_kv: head_dim is required when there is no k_norm_weight to read it from")
        head_dim = k_norm_weight.shape[0]
    if not isinstance(head_dim, int) or head_dim < 1:
        raise ValueError(f"fill_kv: head_dim must be a positive integer, got {head_dim!r}")
    if w_k.dim() != 2 or w_k.shape[0] % head_dim != 0:
        raise ValueError(
            f"fill_kv: w_k must be [n_kv_heads * head_dim, d] with head_dim={head_dim}, got {tuple(w_k.shape)}"
        )
    if tuple(w_v.shape) != tuple(w_k.shape):
        raise ValueError(f"fill_kv: w_v must have the shape of w_k {tuple(w_k.shape)}, got {tuple(w_v.shape)}")
    if k_norm_weight is not None and tuple(k_norm_weight.shape) != (head_dim,):
        raise ValueError(f"fill_kv: k_norm_weight must have shape ({head_dim},), got {tuple(k_norm_weight.shape)}")
    return head_dim


def _zeros_if_none(bias: torch.Tensor | None, w: torch.Tensor) -> torch.Tensor:
    return torch.zeros(w.shape[0], dtype=w.dtype, device=w.device) if bias is None else bias


def fill_kv_reference(
    x_hat: torch.Tensor,
    norm_weight: torch.Tensor,
    eps: float,
    w_k: torch.Tensor,
    w_v: torch.Tensor,
    b_k: torch.Tensor | None = None,
    b_v: torch.Tensor | None = None,
    k_norm_weight: torch.Tensor | None = None,
    head_dim: int | None = None,
    *,
    k_norm_eps: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``x_hat: [rows, d]``, ``norm_weight: [d]``, ``w_k, w_v: [n_kv_heads * head_dim, d]``, ``b_k, b_v:
    [n_kv_heads * head_dim]`` or None, ``k_norm_weight: [head_dim]`` or None -> ``(k, v)``, each
    ``[rows, n_kv_heads, head_dim]`` in ``x_hat.dtype``, before RoPE. ``k_norm_eps`` defaults to ``eps``."""
    return _fill_kv(x_hat, norm_weight, eps, w_k, w_v, b_k, b_v, k_norm_weight, head_dim, k_norm_eps, None)


def fill_kv(
    x_hat: torch.Tensor,
    norm_weight: torch.Tensor,
    eps: float,
    w_k: torch.Tensor,
    w_v: torch.Tensor,
    b_k: torch.Tensor | None = None,
    b_v: torch.Tensor | None = None,
    k_norm_weight: torch.Tensor | None = None,
    head_dim: int | None = None,
    *,
    k_norm_eps: float | None = None,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Same contract as :func:`fill_kv_reference`; the Triton kernels on CUDA tensors or ``backend="triton"``."""
    return _fill_kv(x_hat, norm_weight, eps, w_k, w_v, b_k, b_v, k_norm_weight, head_dim, k_norm_eps, backend)


def _fill_kv(
    x_hat: torch.Tensor,
    norm_weight: torch.Tensor,
    eps: float,
    w_k: torch.Tensor,
    w_v: torch.Tensor,
    b_k: torch.Tensor | None,
    b_v: torch.Tensor | None,
    k_norm_weight: torch.Tensor | None,
    head_dim: int | None,
    k_norm_eps: float | None,
    backend: str | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``backend=None`` runs the references; otherwise it is resolved once and every step uses it."""
    head_dim = _resolve_head_dim(w_k, w_v, k_norm_weight, head_dim)
    if x_hat.dim() != 2 or x_hat.shape[1] != w_k.shape[1]:
        raise ValueError(f"fill_kv: x_hat must be [rows, {w_k.shape[1]}] to match w_k, got {tuple(x_hat.shape)}")
    if backend is not None:
        on = use_triton(backend, x_hat, norm_weight, w_k, w_v, where="fill_kv")
        backend = "triton" if on else None
    rows = x_hat.shape[0]
    n_kv = w_k.shape[0] // head_dim
    b_k, b_v = _zeros_if_none(b_k, w_k), _zeros_if_none(b_v, w_v)
    if backend is None:
        h = rms_norm_reference(x_hat, norm_weight, eps)
        k, v = apply_map_reference(h, w_k, b_k), apply_map_reference(h, w_v, b_v)
    else:
        h = rms_norm(x_hat, norm_weight, eps, backend=backend)
        k, v = apply_map(h, w_k, b_k, backend=backend), apply_map(h, w_v, b_v, backend=backend)
    if k_norm_weight is not None:
        # Per head: [rows, n_kv * head_dim] -> [rows * n_kv, head_dim] rows of the norm (k is contiguous).
        k_eps = eps if k_norm_eps is None else k_norm_eps
        per_head = k.reshape(rows * n_kv, head_dim)
        if backend is None:
            k = rms_norm_reference(per_head, k_norm_weight, k_eps)
        else:
            k = rms_norm(per_head, k_norm_weight, k_eps, backend=backend)
    return k.reshape(rows, n_kv, head_dim), v.reshape(rows, n_kv, head_dim)
