"""bfloat16 matmuls computed through float32 on a CPU without bfloat16 instructions.

A bfloat16 matmul multiplies bfloat16 inputs and accumulates in float32: AMX (``TDPBF16PS``), AVX-512 BF16
(``VDPBF16PS``) and oneDNN's software path all do, and round the sum to bfloat16 once. The product of two
bfloat16 numbers (8-bit significands) is exact in float32 (24 bits), so upcasting both operands and running
the float32 GEMM computes the same sums; only the order of the additions differs, as it does between any two
CPUs' kernels. Where the CPU has no bfloat16 instructions that float32 GEMM is the fast one: on a 2-core
Intel Xeon (AVX512, no AVX-512 BF16 or AMX), ``[4096, 896] x [896, 4864]`` took 811 ms in bfloat16 and
221 ms upcast (the weight converted in every call), and the two agreed on 99.99 % of the outputs, each
within the rounding of the other (mean error against float64 the same to 8 digits).

So a model kept in bfloat16 on such a CPU (a measurement resumed in the dtype its records were taken in,
a user who asks for ``--dtype bfloat16``) runs its projections at float32 speed with bfloat16's numerics
and memory. Below :data:`MIN_ROWS` rows (a decode step) converting the weight costs more than the GEMM
saves, so those calls stay on PyTorch's own path.

:func:`linear` is the one switch: SGLang's linear layers and LM head reach it through ``patches.py`` (CPU
recipe only), the fill's own K/V projections (``runtime/adapter.py``) call it, and the calibration's
``transformers`` model through :func:`upcast_linears`.
``RIDGEFILL_BF16_MATMUL=native`` keeps PyTorch's bfloat16 kernels everywhere (to compare the two).
Nothing here imports SGLang.
"""

from __future__ import annotations

import functools
import os

import torch
import torch.nn.functional as F

from .dtype import BF16_MATMUL, CpuFeatures, native_bf16

MIN_ROWS = 16  # rows of the input below which the weight's conversion costs more than it saves
MODES = ("auto", "native")  # RIDGEFILL_BF16_MATMUL: auto = through float32 where no native bfloat16


def through_float32(features: CpuFeatures | None = None) -> bool:
    """Whether bfloat16 matmuls run in float32 on a CPU with ``features`` (default this process's): it has no
    native bfloat16 matmul (``cpu.dtype``) and ``RIDGEFILL_BF16_MATMUL`` is not ``native``.

    Raises ``ValueError`` for a value of ``RIDGEFILL_BF16_MATMUL`` other than :data:`MODES`."""
    mode = (os.environ.get(BF16_MATMUL) or "auto").lower()
    if mode not in MODES:
        raise ValueError(f"{BF16_MATMUL} must be one of {', '.join(MODES)}, got {mode!r}")
    return mode == "auto" and not native_bf16(features)


@functools.cache
def _here() -> bool:
    return through_float32()


def upcasts(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether ``x @ weight.T`` goes through float32 here: both bfloat16 on the CPU, at least
    :data:`MIN_ROWS` rows, and :func:`through_float32`."""
    return (
        x.dtype == torch.bfloat16 and weight.dtype == torch.bfloat16 and x.device.type == "cpu"
        and x.numel() >= MIN_ROWS * x.shape[-1] and _here()
    )


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)``, in float32 with the result rounded to bfloat16 where :func:`upcasts`."""
    if not upcasts(x, weight):
        return F.linear(x, weight, bias)
    return F.linear(x.float(), weight.float(), None if bias is None else bias.float()).to(x.dtype)


def _forward(module: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    return linear(x, module.weight, module.bias)


def upcast_linears(model: torch.nn.Module) -> int:
    """Route every ``nn.Linear`` of ``model`` through :func:`linear`; the number routed (0 where
    :func:`through_float32` is off: nothing changes)."""
    if not _here():
        return 0
    routed = 0
    for module in model.modules():
        if type(module) is torch.nn.Linear:  # subclasses (quantized, LoRA) keep their own forward
            module.forward = functools.partial(_forward, module)
            routed += 1
    return routed

