"""CPU-only stand-in for ``sgl_kernel`` (sgl-ridgefill's CPU recipe; never used on a GPU machine).

SGLang's PyPI wheel ships a CUDA-only ``sgl_kernel`` whose import fails without ``libcuda.so.1``. On a
CPU-only host SGLang still runs with ``--device cpu --attention-backend torch_native`` (or
``ridgefill_cpu``), but several modules do ``from sgl_kernel import X`` at import time. This package goes
first on ``PYTHONPATH`` (only through ``sgl_ridgefill.cpu.cpu_environment``), so those imports succeed;
calling any of the placeholders raises ``NotImplementedError`` naming the op, so a CPU run can never
silently depend on a CUDA kernel.

The CPU ops SGLang's Gated DeltaNet hybrids (Qwen3.5, Qwen3-Next) call are real: ``sgl_kernel.mamba`` and
the ``torch.ops.sgl_kernel.*_cpu`` ops registered on import (``_ops.py``), both pure PyTorch
(``sgl_ridgefill.gdn_ops``).
"""

import logging

_log = logging.getLogger("sgl_kernel_cpu_shim")
__version__ = "0.0.0+cpu-shim"
RIDGEFILL_CPU_SHIM = True

from . import _ops  # noqa: E402

_ops.register()


class _Missing:
    def __init__(self, name):
        self._name = name

    def __call__(self, *args, **kwargs):
        raise NotImplementedError(f"sgl_kernel CPU shim: {self._name} is a CUDA kernel and was called on CPU")

    def __getattr__(self, item):
        if item.startswith("__"):
            raise AttributeError(item)
        return _Missing(f"{self._name}.{item}")

    def __repr__(self):
        return f"<sgl_kernel CPU shim placeholder {self._name}>"


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    _log.debug("sgl_kernel CPU shim provides placeholder %s", name)
    return _Missing(name)
