"""Backend choice shared by every kernel entry point: the Triton kernel or the PyTorch reference.

``triton`` is imported here only when a caller asks for it, so every ``sgl_ridgefill.kernels`` module
imports on a machine without Triton, and ``TRITON_INTERPRET=1`` (read by Triton when a kernel is
decorated) can still be set by a test before the first kernel module loads.
"""

from __future__ import annotations

import functools
import importlib.util

import torch

BACKENDS = ("auto", "triton", "reference")


@functools.cache
def triton_available() -> bool:
    """Whether ``import triton`` can succeed (checked once, without importing it)."""
    return importlib.util.find_spec("triton") is not None


def interpreter_active() -> bool:
    """Whether Triton runs kernels in its CPU interpreter (``TRITON_INTERPRET=1``).

    Read from Triton's own knob, not the environment, because that is what decides how a kernel was
    decorated; importing Triton here is fine since only the Triton path calls this.
    """
    if not triton_available():
        return False
    import triton

    return bool(triton.knobs.runtime.interpret)


def use_triton(backend: str, *tensors: torch.Tensor, where: str) -> bool:
    """Resolve ``backend`` for a call on ``tensors``; ``where`` names the entry point in messages.

    ``"auto"`` picks Triton for CUDA tensors and the reference otherwise; ``"triton"`` insists on the
    kernel (CUDA tensors, or CPU tensors under the interpreter); ``"reference"`` is the PyTorch path.
    """
    if backend not in BACKENDS:
        raise ValueError(f"{where}: backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "reference":
        return False
    on_cuda = all(t.is_cuda for t in tensors)
    if backend == "auto":
        return on_cuda and triton_available()
    if not triton_available():
        raise ValueError(f"{where}: backend='triton' but the triton package is not installed")
    if not on_cuda and not interpreter_active():
        devices = sorted({str(t.device) for t in tensors})
        raise ValueError(
            f"{where}: backend='triton' needs CUDA tensors or TRITON_INTERPRET=1 set before triton is "
            f"imported; got tensors on {devices}"
        )
    return True


def check_same_device(where: str, **tensors: torch.Tensor) -> None:
    """Raise ``ValueError`` naming the arguments when ``tensors`` do not all live on one device."""
    devices = {name: t.device for name, t in tensors.items()}
    if len(set(devices.values())) > 1:
        listed = ", ".join(f"{name} on {device}" for name, device in devices.items())
        raise ValueError(f"{where}: all tensors must be on one device, got {listed}")


def dot_in_fp32(*dtypes: torch.dtype) -> bool:
    """Whether a kernel must feed ``tl.dot`` float32 operands instead of the inputs' half dtype.

    Half-precision operands (one shared dtype, bf16 or fp16) go to the tensor cores as they are. Mixed
    dtypes and float32 inputs are upcast. Under the interpreter every operand is upcast: it stores
    bfloat16 as raw ``uint16`` bits and its ``tl.dot`` multiplies those bits (triton-lang/triton#11584),
    so the kernels keep all arithmetic in float32 there and only load and store bfloat16.
    """
    if interpreter_active():
        return True
    first = dtypes[0]
    return first == torch.float32 or any(d != first for d in dtypes)
