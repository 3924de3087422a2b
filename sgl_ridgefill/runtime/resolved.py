"""SGLang's settings as the running engine resolved them, read once at startup.

SGLang fills in much of what a user leaves unset after it parses the flags: it picks the chunk size, the KV
cache dtype (an FP8 checkpoint gets an FP8 cache under ``--kv-cache-dtype auto``), a speculative algorithm
for some models, the page size the attention backend needs, and the prefill attention backend for the GPU.
RidgeFill reads what the engine runs with (the scheduler's runtime context and the model runner), falling
back to the raw ``ServerArgs`` field only where SGLang keeps no resolved value; every startup decision and
refusal (``factory.py``) reads :class:`EngineSettings`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

_FP8 = tuple(getattr(torch, name) for name in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz") if hasattr(torch, name))


# --kv-cache-dtype values that name a dtype other than the model's ("auto" and "bfloat16"/"float32" follow it).
_KV_FLAGS = {name: getattr(torch, attr) for name, attr in (("fp8_e4m3", "float8_e4m3fn"), ("fp8_e5m2", "float8_e5m2"))
             if hasattr(torch, attr)}


@dataclass(frozen=True)
class EngineSettings:
    """What the engine runs with (``None``: SGLang did not say)."""

    chunk: int | None  # rows per prefill chunk; None or <= 0: prompts are not chunked
    kv_cache_dtype: torch.dtype | None  # the KV pool's dtype
    model_dtype: torch.dtype | None  # the weights' (and activations') dtype
    speculative: str | None  # the speculative decoding algorithm, or None
    page_size: int  # KV pool page size
    prefill_backend: str | None  # the attention backend prefill batches run on
    torch_compile: bool  # SGLang compiles the model forward (torch.compile)

    def refusal(self) -> str | None:
        """Why RidgeFill cannot run with these settings, or ``None``."""
        if self.speculative:
            return f"speculative decoding ({self.speculative}) is not supported"
        kv, model = self.kv_cache_dtype, self.model_dtype
        if kv is not None and (kv in _FP8 or (model is not None and kv != model)):
            under = f" under a {_name(model)} model" if model is not None else ""
            return (
                f"{'an FP8' if kv in _FP8 else 'a'} KV cache in {_name(kv)}{under} is not supported (the filled rows "
                "would be quantised where the maps were fitted on unquantised keys and values); start the server "
                "with --kv-cache-dtype matching --dtype"
            )
        if self.torch_compile:
            return (
                "--enable-torch-compile is not supported: the compiled forward would trace RidgeFill's per-request "
                "Python branches; RidgeFill runs on eager forwards and on SGLang's CUDA graphs (a batch with RidgeFill "
                "work replays no graph)"
            )
        return None


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _bag(name: str) -> Any:
    """One of SGLang's runtime-context groups (``schedule``, ``spec``, ``flags``), or ``None`` outside a
    scheduler that set them."""
    try:
        from sglang.srt import runtime_context

        return getattr(runtime_context, f"get_{name}")()
    except Exception:  # noqa: BLE001 - an older SGLang or a process without a context: the raw fields answer
        return None


def _first(*values: Any) -> Any:
    return next((v for v in values if v is not None), None)


def _algorithm(value: Any) -> str | None:
    """A speculative algorithm (an enum, a string or ``None``) as a name, ``None`` for none."""
    if value is None:
        return None
    if hasattr(value, "is_none") and value.is_none():
        return None
    name = getattr(value, "name", None) or str(value)
    return None if name.upper() in ("NONE", "") else name


def read(runner: Any, *, schedule: Any = None, spec: Any = None, flags: Any = None) -> EngineSettings:
    """The settings of ``runner`` (SGLang's ``ModelRunner``); ``schedule``, ``spec`` and ``flags`` default to the
    process's runtime context."""
    sa = getattr(runner, "server_args", None)
    schedule = schedule if schedule is not None else _bag("schedule")
    spec = spec if spec is not None else _bag("spec")
    flags = flags if flags is not None else _bag("flags")
    chunk = _first(getattr(schedule, "chunked_prefill_size", None), getattr(sa, "chunked_prefill_size", None))
    if chunk is not None and chunk <= 0:
        chunk = _first(getattr(schedule, "max_prefill_tokens", None), getattr(sa, "max_prefill_tokens", None)) or chunk
    kv = getattr(runner, "kv_cache_dtype", None)
    if not isinstance(kv, torch.dtype):  # a runner that has not resolved it: the flag, where it names a dtype
        kv = _KV_FLAGS.get(str(getattr(sa, "kv_cache_dtype", "auto")))
    model_dtype = _first(getattr(runner, "dtype", None), getattr(getattr(runner, "model_config", None), "dtype", None))
    return EngineSettings(
        chunk=chunk,
        kv_cache_dtype=kv if isinstance(kv, torch.dtype) else None,
        model_dtype=model_dtype if isinstance(model_dtype, torch.dtype) else None,
        speculative=_algorithm(_first(getattr(runner, "spec_algorithm", None), getattr(spec, "speculative_algorithm", None),
                                      getattr(sa, "speculative_algorithm", None))),
        page_size=int(_first(getattr(schedule, "page_size", None), getattr(runner, "page_size", None),
                             getattr(sa, "page_size", None)) or 1),
        prefill_backend=_first(getattr(runner, "prefill_attention_backend_str", None),
                               getattr(sa, "prefill_attention_backend", None), getattr(sa, "attention_backend", None)),
        torch_compile=bool(_first(getattr(getattr(flags, "capture", None), "enable_torch_compile", None),
                                  getattr(sa, "enable_torch_compile", None))),
    )
