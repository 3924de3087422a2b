"""Value rescale (one of the corrections): one scale per KV head, measured per request, for filled values.

In an upper attention layer the first ``c`` tail rows go through the V projection twice, with their
exact input (``v_exact``) and with the map's prediction from their own split state (``v_pred``). Per KV
head, the mean over those rows of ``‖v_exact‖ / ‖v_pred‖`` multiplies that head's filled values before
any exact row reads them. Only magnitudes are restored; keys are left alone (with QK-norm their
magnitude is fixed anyway).
"""

from __future__ import annotations

import torch

# Norms at or below this are treated as zero: such a row carries no direction to rescale.
_TINY_NORM = 1e-12


def value_scale_reference(v_exact: torch.Tensor, v_pred: torch.Tensor) -> torch.Tensor:
    """``v_exact, v_pred: [c, n_kv_heads, head_dim]`` -> ``[n_kv_heads]`` float32.

    ``scale[h] = mean over rows r of ‖v_exact[r, h]‖ / ‖v_pred[r, h]‖``, norms over ``head_dim`` in
    float32. A row whose predicted value has zero norm has no defined ratio and is left out of that
    head's mean; a head with no usable row gets scale 1.0 (no correction).
    """
    if v_exact.dim() != 3 or tuple(v_exact.shape) != tuple(v_pred.shape):
        raise ValueError(
            "value_scale_reference: v_exact and v_pred must both be [c, n_kv_heads, head_dim], got "
            f"{tuple(v_exact.shape)} and {tuple(v_pred.shape)}"
        )
    if v_exact.device != v_pred.device:
        raise ValueError(f"value_scale_reference: v_exact is on {v_exact.device} but v_pred on {v_pred.device}")
    exact_norm = torch.linalg.vector_norm(v_exact.float(), dim=-1)  # [c, n_kv_heads]
    pred_norm = torch.linalg.vector_norm(v_pred.float(), dim=-1)
    usable = pred_norm > _TINY_NORM
    ratio = torch.where(usable, exact_norm / pred_norm.clamp_min(_TINY_NORM), torch.zeros_like(exact_norm))
    count = usable.sum(dim=0)
    mean = ratio.sum(dim=0) / count.clamp_min(1)
    return torch.where(count > 0, mean, torch.ones_like(mean))


def apply_value_scale_(
    v_cache_rows: torch.Tensor, scale: torch.Tensor, rows: torch.Tensor | None = None
) -> torch.Tensor:
    """Multiply values by their head's scale, in place; returns ``v_cache_rows``.

    ``v_cache_rows: [n, n_kv_heads, head_dim]``, ``scale: [n_kv_heads]``. With ``rows: [m]`` (integer
    indices), only ``v_cache_rows[rows]`` is scaled, so a whole cache buffer can be passed with the slots
    of the filled rows. The product is formed in float32 and rounded once to the cache dtype.
    """
    if v_cache_rows.dim() != 3:
        raise ValueError(
            f"apply_value_scale_: v_cache_rows must be [rows, n_kv_heads, head_dim], got {tuple(v_cache_rows.shape)}"
        )
    n_kv = v_cache_rows.shape[1]
    if tuple(scale.shape) != (n_kv,):
        raise ValueError(f"apply_value_scale_: scale must have shape ({n_kv},), got {tuple(scale.shape)}")
    factor = scale.to(device=v_cache_rows.device, dtype=torch.float32)[None, :, None]
    if rows is None:
        v_cache_rows.copy_(v_cache_rows.float() * factor)
        return v_cache_rows
    if rows.dim() != 1 or rows.dtype.is_floating_point or rows.dtype == torch.bool:
        raise ValueError(
            f"apply_value_scale_: rows must be a 1-D integer index tensor, got {rows.dtype} {tuple(rows.shape)}"
        )
    index = rows.to(v_cache_rows.device)
    v_cache_rows[index] = (v_cache_rows[index].float() * factor).to(v_cache_rows.dtype)
    return v_cache_rows
