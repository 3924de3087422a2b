"""The attention backends RidgeFill runs on: the one list, from which registration and messages derive.

``ridgefill_cpu`` is RidgeFill's own CPU backend (a new name in SGLang's registry). On CUDA, RidgeFill
runs on SGLang's own Triton, FlashInfer and fa3 backends: :func:`wrap_gpu_backends` wraps their registry factories so
the instance SGLang builds becomes RidgeFill's subclass (only its class changes; SGLang's constructor and
name-keyed logic stay). Any other backend is left alone, and RidgeFill then reports at startup that it is
off and which ``--attention-backend`` to pass. Both registry changes run from ``patches.register_hooks``.
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


def register_cpu_backend() -> None:
    """``ridgefill_cpu`` joins SGLang's attention-backend registry and the ``--attention-backend`` choices."""
    from sglang.srt.arg_groups.choices import ATTENTION_BACKEND_CHOICES, add_attention_backend_choices
    from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS, register_attention_backend

    if CPU_BACKEND in ATTENTION_BACKENDS:
        return

    @register_attention_backend(CPU_BACKEND)
    def create_ridgefill_cpu_backend(runner):
        from .cpu import RidgeFillCpuAttnBackend

        return RidgeFillCpuAttnBackend(runner)

    if CPU_BACKEND not in ATTENTION_BACKEND_CHOICES:
        add_attention_backend_choices([CPU_BACKEND])


def wrap_gpu_backends() -> None:
    """SGLang builds an attention backend by name from ``ATTENTION_BACKENDS``; RidgeFill wraps the Triton,
    FlashInfer and fa3 factories so the backend they build becomes RidgeFill's subclass of it
    (:func:`as_ridgefill`), which plans row queries and otherwise behaves exactly like SGLang's. The
    instance keeps SGLang's constructor and name-keyed logic; only its class changes."""
    from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS

    for name in GPU_BACKENDS:
        factory = ATTENTION_BACKENDS.get(name)
        if factory is None or getattr(factory, "_ridgefill", False):
            continue

        def create(runner, factory=factory, name=name):
            return as_ridgefill(name, factory(runner))

        create._ridgefill = True  # type: ignore[attr-defined]
        ATTENTION_BACKENDS[name] = create
