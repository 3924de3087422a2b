"""Group-wise symmetric int8 quantisation of map matrices.

Layout contract, shared by the maps folder format, the PyTorch reference and the Triton kernels:

- ``q``: ``[d_out, d_in]`` int8, row-major;
- ``scale``: ``[d_out, n_groups]`` float32 with ``n_groups = ceil(d_in / group_size)``; group ``g`` of row
  ``o`` covers columns ``[g * group_size, min((g + 1) * group_size, d_in))``;
- dequantised value: ``A[o, i] = q[o, i] * scale[o, i // group_size]``.

The scale of a group is ``max|A| / 127`` over the group (1.0 for an all-zero group, so it never divides by
zero), and ``q = round(A / scale)`` clamped to ``[-127, 127]``.
"""

from __future__ import annotations

import torch

DEFAULT_GROUP_SIZE = 128


def _check_group_size(group_size: int) -> None:
    if not isinstance(group_size, int) or group_size < 1:
        raise ValueError(f"group_size must be a positive integer, got {group_size!r}")


def _padded_groups(a: torch.Tensor, group_size: int) -> torch.Tensor:
    """``a``: ``[d_out, d_in]`` -> ``[d_out, n_groups, group_size]``, zero-padded at the end."""
    d_out, d_in = a.shape
    n_groups = -(-d_in // group_size)
    pad = n_groups * group_size - d_in
    if pad:
        a = torch.nn.functional.pad(a, (0, pad))
    return a.reshape(d_out, n_groups, group_size)


def quantize_int8_groupwise(
    a: torch.Tensor, group_size: int = DEFAULT_GROUP_SIZE
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantise ``a``: ``[d_out, d_in]`` (any float dtype) to ``(q [d_out, d_in] int8, scale [d_out, n_groups] f32)``."""
    _check_group_size(group_size)
    if a.dim() != 2:
        raise ValueError(f"expected a 2-D matrix [d_out, d_in], got shape {tuple(a.shape)}")
    d_in = a.shape[1]
    groups = _padded_groups(a.float(), group_size)
    amax = groups.abs().amax(dim=-1)
    scale = torch.where(amax > 0, amax / 127.0, torch.ones_like(amax))
    q = torch.round(groups / scale.unsqueeze(-1)).clamp_(-127, 127).to(torch.int8)
    return q.reshape(a.shape[0], -1)[:, :d_in].contiguous(), scale.contiguous()


def dequantize_int8_groupwise(
    q: torch.Tensor, scale: torch.Tensor, group_size: int = DEFAULT_GROUP_SIZE, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """Inverse of :func:`quantize_int8_groupwise`: ``[d_out, d_in]`` in ``dtype``."""
    _check_group_size(group_size)
    d_out, d_in = q.shape
    n_groups = -(-d_in // group_size)
    if tuple(scale.shape) != (d_out, n_groups):
        raise ValueError(
            f"scale has shape {tuple(scale.shape)}, expected {(d_out, n_groups)} for q {tuple(q.shape)} "
            f"and group_size {group_size}"
        )
    groups = _padded_groups(q.float(), group_size) * scale.float().unsqueeze(-1)
    return groups.reshape(d_out, -1)[:, :d_in].to(dtype)
