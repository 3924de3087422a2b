"""The map application ``x̂_l = A_l · x_S + b_l`` of one upper layer.

Row convention: every tensor holds one token per row, so for a block of rows the product is
``x̂ = x_split · Aᵀ + b``. Maps come in float (bf16/fp16/fp32) or in the group-wise int8 layout of
:mod:`sgl_ridgefill.kernels.quant`. Each entry point has three backends, all accumulating in float32 and
returning ``x_split.dtype``:

- ``"reference"``: a float32 ``addmm`` (the CPU path and the test oracle);
- ``"triton"``: the kernels of :mod:`sgl_ridgefill.kernels.map_apply_triton` (int8 maps dequantised in
  registers);
- ``"torch"``: ``torch.addmm`` in the inputs' dtype (cuBLAS on CUDA); int8 maps are first dequantised to
  ``x_split.dtype``.

``"auto"`` is Triton on CUDA tensors and the reference elsewhere. Which of Triton and cuBLAS is faster on a
given GPU is measured, not assumed: the runtime passes the backend :mod:`sgl_ridgefill.kernels.choose`
measured at startup. One launch per upper layer: predicting every upper layer at once would hold
``layers x rows x d`` predictions (3.2 GB for a 7B model at 32K rows) for no fewer FLOPs.
"""

from __future__ import annotations

import torch

from sgl_ridgefill.kernels.backend import BACKENDS, check_same_device, dot_in_fp32, interpreter_active, use_triton
from sgl_ridgefill.kernels.quant import _check_group_size, dequantize_int8_groupwise

FLOAT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
MAP_BACKENDS = ("auto", "triton", "torch", "reference")


def __getattr__(name: str) -> object:
    # The kernels live in a module that imports triton; resolve them only when someone asks.
    if name in ("_map_kernel", "_map_int8_kernel"):
        from sgl_ridgefill.kernels import map_apply_triton

        return getattr(map_apply_triton, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# --------------------------------------------------------------------------------------------- checks


def _check_float(where: str, name: str, t: torch.Tensor) -> None:
    if t.dtype not in FLOAT_DTYPES:
        raise ValueError(f"{where}: {name} must be bf16, fp16 or fp32, got {t.dtype}")


def _check_maps(where: str, x_split: torch.Tensor, A: torch.Tensor, b: torch.Tensor) -> None:
    """Shapes: ``x_split: [rows, d_in]``, ``A: [d_out, d_in]``, ``b: [d_out]``."""
    if x_split.dim() != 2:
        raise ValueError(f"{where}: x_split must be [rows, d_in], got shape {tuple(x_split.shape)}")
    if A.dim() != 2:
        raise ValueError(f"{where}: the map must be [d_out, d_in], got shape {tuple(A.shape)}")
    if A.shape[-1] != x_split.shape[1]:
        raise ValueError(
            f"{where}: the map takes d_in={A.shape[-1]} columns but x_split has {x_split.shape[1]} "
            f"(shapes {tuple(A.shape)} and {tuple(x_split.shape)})"
        )
    if tuple(b.shape) != tuple(A.shape[:-1]):
        raise ValueError(f"{where}: b must have shape {tuple(A.shape[:-1])}, got {tuple(b.shape)}")
    _check_float(where, "x_split", x_split)
    _check_float(where, "b", b)


def _check_int8(where: str, q: torch.Tensor, scale: torch.Tensor, group_size: int) -> None:
    """``q: [d_out, d_in]`` int8, ``scale: [d_out, ceil(d_in / group_size)]`` f32."""
    _check_group_size(group_size)
    if q.dtype != torch.int8:
        raise ValueError(f"{where}: q must be int8, got {q.dtype}")
    if scale.dtype != torch.float32:
        raise ValueError(f"{where}: scale must be float32, got {scale.dtype}")
    n_groups = -(-q.shape[-1] // group_size)
    want = (*q.shape[:-1], n_groups)
    if tuple(scale.shape) != want:
        raise ValueError(
            f"{where}: scale has shape {tuple(scale.shape)}, expected {want} for q {tuple(q.shape)} "
            f"and group_size {group_size}"
        )


def _check_out(where: str, out: torch.Tensor, shape: tuple[int, ...], like: torch.Tensor) -> None:
    if tuple(out.shape) != shape or out.dtype != like.dtype or out.device != like.device:
        raise ValueError(
            f"{where}: out must be {shape} {like.dtype} on {like.device}, "
            f"got {tuple(out.shape)} {out.dtype} on {out.device}"
        )


# ----------------------------------------------------------------------------------------- references


def apply_map_reference(
    x_split: torch.Tensor, A: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None
) -> torch.Tensor:
    """``x_split: [rows, d_in]``, ``A: [d_out, d_in]``, ``b: [d_out]`` -> ``[rows, d_out]`` in ``x_split.dtype``.

    Computes ``x_split · Aᵀ + b`` with a float32 ``addmm`` (half inputs are upcast first). ``out``, when
    given, must be ``[rows, d_out]`` in ``x_split.dtype`` and is written and returned.
    """
    _check_maps("apply_map_reference", x_split, A, b)
    _check_float("apply_map_reference", "A", A)
    shape = (x_split.shape[0], A.shape[0])
    if out is not None:
        _check_out("apply_map_reference", out, shape, x_split)
    f32 = torch.float32
    if out is not None and out.dtype == f32 and x_split.dtype == A.dtype == b.dtype == f32:
        return torch.addmm(b, x_split, A.t(), out=out)
    result = torch.addmm(b.to(f32), x_split.to(f32), A.to(f32).t())
    if out is None:
        return result.to(x_split.dtype)
    return out.copy_(result)


def apply_map_int8_reference(
    x_split: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, b: torch.Tensor, group_size: int
) -> torch.Tensor:
    """``x_split: [rows, d_in]``, ``q: [d_out, d_in]`` int8, ``scale: [d_out, n_groups]`` f32, ``b: [d_out]``
    -> ``[rows, d_out]`` in ``x_split.dtype``: the float32 map dequantised, then :func:`apply_map_reference`."""
    _check_maps("apply_map_int8_reference", x_split, q, b)
    _check_int8("apply_map_int8_reference", q, scale, group_size)
    A = dequantize_int8_groupwise(q, scale, group_size, dtype=torch.float32)
    return apply_map_reference(x_split, A, b)


# ------------------------------------------------------------------------------------------ dispatch


def resolve_map_backend(backend: str, *tensors: torch.Tensor, where: str) -> str:
    """``"triton"``, ``"torch"`` or ``"reference"`` for a call on ``tensors``; ``where`` names the entry point."""
    if backend == "torch":
        return backend
    if backend not in BACKENDS:
        raise ValueError(f"{where}: backend must be one of {MAP_BACKENDS}, got {backend!r}")
    return "triton" if use_triton(backend, *tensors, where=where) else "reference"


def apply_map(
    x_split: torch.Tensor,
    A: torch.Tensor,
    b: torch.Tensor,
    *,
    backend: str = "auto",
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``x_split: [rows, d_in]``, ``A: [d_out, d_in]``, ``b: [d_out]`` -> ``[rows, d_out]`` in ``x_split.dtype``.

    ``backend``: one of :data:`MAP_BACKENDS` (module docstring). Inputs may be strided views (for example
    every other row of a hidden-state buffer); ``out``, when given, is written and returned.
    """
    where = "apply_map"
    _check_maps(where, x_split, A, b)
    _check_float(where, "A", A)
    check_same_device(where, x_split=x_split, A=A, b=b)
    chosen = resolve_map_backend(backend, x_split, A, b, where=where)
    shape = (x_split.shape[0], A.shape[0])
    if out is not None:
        _check_out(where, out, shape, x_split)
    if chosen == "reference" or (chosen == "torch" and not x_split.dtype == A.dtype == b.dtype):
        # Mixed dtypes have no single cuBLAS dtype: the float32 reference is the torch path for them.
        return apply_map_reference(x_split, A, b, out=out)
    if chosen == "torch":
        return torch.addmm(b, x_split, A.t(), out=out) if out is not None else torch.addmm(b, x_split, A.t())
    if out is None:
        out = torch.empty(shape, dtype=x_split.dtype, device=x_split.device)
    _launch(x_split, A, None, b, out, group_size=None)
    return out


def apply_map_int8(
    x_split: torch.Tensor,
    q: torch.Tensor,
    scale: torch.Tensor,
    b: torch.Tensor,
    group_size: int,
    *,
    backend: str = "auto",
) -> torch.Tensor:
    """``x_split: [rows, d_in]``, ``q: [d_out, d_in]`` int8, ``scale: [d_out, n_groups]`` f32, ``b: [d_out]``
    -> ``[rows, d_out]`` in ``x_split.dtype``. Triton dequantises in registers; ``"torch"`` dequantises the
    map to ``x_split.dtype`` (``d_out x d_in`` elements, once per call) and multiplies with ``torch.addmm``."""
    where = "apply_map_int8"
    _check_maps(where, x_split, q, b)
    _check_int8(where, q, scale, group_size)
    check_same_device(where, x_split=x_split, q=q, scale=scale, b=b)
    chosen = resolve_map_backend(backend, x_split, q, scale, b, where=where)
    if chosen == "reference":
        return apply_map_int8_reference(x_split, q, scale, b, group_size)
    if chosen == "torch":
        A = dequantize_int8_groupwise(q, scale, group_size, dtype=x_split.dtype)
        return torch.addmm(b.to(x_split.dtype), x_split, A.t())
    out = torch.empty(x_split.shape[0], q.shape[0], dtype=x_split.dtype, device=x_split.device)
    _launch(x_split, q, scale, b, out, group_size=group_size)
    return out


# ------------------------------------------------------------------------------------------ launcher


def _tile_config(group_size: int | None) -> dict[str, int]:
    """Block sizes; under the interpreter small tiles so that tests with a few dozen rows cross tiles."""
    if interpreter_active():
        block_k = 32
        config = dict(BLOCK_M=32, BLOCK_N=32, GROUP_M=2)
    else:
        block_k = 64
        config = dict(BLOCK_M=128, BLOCK_N=128, GROUP_M=8, num_warps=8, num_stages=3)
    if group_size is not None:
        # The int8 kernel's fast path needs each K tile inside one group: shrink BLOCK_K to the largest
        # power of two (>= 16, tl.dot's minimum) dividing the group size; otherwise it dequantises per element.
        for candidate in (block_k, 32, 16):
            if candidate <= block_k and group_size % candidate == 0:
                block_k = candidate
                break
    return dict(config, BLOCK_K=block_k)


def _launch(
    x: torch.Tensor,
    a: torch.Tensor,
    scale: torch.Tensor | None,
    b: torch.Tensor,
    out: torch.Tensor,
    *,
    group_size: int | None,
) -> None:
    """Launch one of the map kernels.

    ``x: [rows, d_in]``, ``a: [d_out, d_in]`` (float, or int8 with ``scale: [d_out, n_groups]`` f32),
    ``b: [d_out]``, ``out: [rows, d_out]``. Any strides are accepted; the public entry points have checked
    shapes, dtypes and devices, so violations here are bugs.
    """
    from sgl_ridgefill.kernels import map_apply_triton as kernels

    d_out, d_in = a.shape
    rows = x.shape[0]
    assert x.shape == (rows, d_in), f"x {tuple(x.shape)} does not match the map {tuple(a.shape)}"
    assert b.shape == (d_out,), f"b {tuple(b.shape)} does not match the map {tuple(a.shape)}"
    assert out.shape == (rows, d_out), f"out {tuple(out.shape)}, expected {(rows, d_out)}"
    assert out.dtype == x.dtype, f"out is {out.dtype} but x is {x.dtype}"
    assert all(s >= 0 for t in (x, a, b, out) for s in t.stride()), "negative strides are not supported"
    if rows == 0 or d_out == 0:
        return
    config = _tile_config(group_size)
    grid = (-(-rows // config["BLOCK_M"]) * -(-d_out // config["BLOCK_N"]),)
    common = dict(rows=rows, d_in=d_in, d_out=d_out)
    strides = dict(
        stride_xm=x.stride(0), stride_xk=x.stride(1), stride_bn=b.stride(0),
        stride_om=out.stride(0), stride_on=out.stride(1),
    )
    if group_size is None:
        assert a.dtype in FLOAT_DTYPES, f"float maps must be bf16/fp16/fp32, got {a.dtype}"
        kernels._map_kernel[grid](
            x, a, b, out, **common, **strides,
            stride_an=a.stride(0), stride_ak=a.stride(1),
            DOT_FP32=dot_in_fp32(x.dtype, a.dtype), **config,
        )
        return
    assert a.dtype == torch.int8 and scale is not None and scale.dtype == torch.float32
    assert scale.shape == (d_out, -(-d_in // group_size)), f"scale {tuple(scale.shape)}"
    kernels._map_int8_kernel[grid](
        x, a, scale, b, out, **common, **strides,
        stride_qn=a.stride(0), stride_qk=a.stride(1),
        stride_sn=scale.stride(0), stride_sg=scale.stride(1),
        GROUP_SIZE=group_size, DOT_FP32=dot_in_fp32(x.dtype), **config,
    )
