"""The attention backends RidgeFill runs on: the one list, from which registration and messages derive.

``ridgefill_cpu`` is RidgeFill's own CPU backend (a new name in SGLang's registry). On CUDA, RidgeFill
runs on SGLang's own Triton, FlashInfer and fa3 backends: ``patches.py`` wraps their registry factories so
the instance SGLang builds becomes RidgeFill's subclass (only its class changes; SGLang's constructor and
name-keyed logic stay). Any other backend is left alone, and RidgeFill then reports at startup that it is
off and which ``--attention-backend`` to pass.
"""

from __future__ import annotations

import pkgutil
from typing import Any

CPU_BACKEND = "ridgefill_cpu"
# SGLang backend name -> (SGLang's class, RidgeFill's subclass of it)
GPU_BACKENDS: dict[str, tuple[str, str]] = {
    "triton": ("sglang.srt.layers.attention.triton_backend:TritonAttnBackend",
               "sgl_ridgefill.attention.triton:RidgeFillTritonBackend"),
    "flashinfer": ("sglang.srt.layers.attention.flashinfer_backend:FlashInferAttnBackend",
                   "sgl_ridgefill.attention.flashinfer:RidgeFillFlashInferBackend"),
    "fa3": ("sglang.srt.layers.attention.flashattention_backend:FlashAttentionBackend",
            "sgl_ridgefill.attention.fa3:RidgeFillFa3Backend"),
}
SUPPORTED = (CPU_BACKEND, *GPU_BACKENDS)


def as_ridgefill(name: str, backend: Any) -> Any:
    """``backend`` (built by SGLang's factory for ``name``) as RidgeFill's subclass when it is exactly
    SGLang's class for that name; anything else (an MLA or platform variant) is returned unchanged."""
    stock, ours = GPU_BACKENDS[name]
    if type(backend) is pkgutil.resolve_name(stock):
        backend.__class__ = pkgutil.resolve_name(ours)
    return backend


def advice() -> str:
    return (
        f"RidgeFill runs on --attention-backend {', '.join(GPU_BACKENDS)} (CUDA) or {CPU_BACKEND} (CPU); "
        "with different prefill and decode backends, --prefill-attention-backend is the one that matters"
    )
