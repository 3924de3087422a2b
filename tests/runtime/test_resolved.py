"""RidgeFill reads SGLang's resolved settings, not the raw flags: one case per setting that SGLang resolves
differently from its ``ServerArgs`` field (engine-free fakes of the runner and the runtime context)."""

from __future__ import annotations

from types import SimpleNamespace as NS

import pytest
import torch

from sgl_ridgefill.runtime import resolved

RAW = dict(chunked_prefill_size=None, max_prefill_tokens=16384, kv_cache_dtype="auto", speculative_algorithm=None,
           page_size=None, attention_backend=None, prefill_attention_backend=None, enable_torch_compile=False)
NO_COMPILE = NS(capture=NS(enable_torch_compile=False))


def _read(runner=None, *, schedule=None, spec=None, flags=NO_COMPILE, **raw):
    runner = runner or NS()
    runner.server_args = NS(**{**RAW, **raw})
    return resolved.read(runner, schedule=schedule or NS(), spec=spec or NS(), flags=flags)


def test_the_chunk_is_the_one_sglang_chose():
    # The flag left unset (None): SGLang picks a chunk for the GPU and keeps it in the schedule.
    assert _read(schedule=NS(chunked_prefill_size=8192)).chunk == 8192
    # Chunking turned off (-1): prompts run in one batch up to max_prefill_tokens.
    assert _read(schedule=NS(chunked_prefill_size=-1, max_prefill_tokens=32768)).chunk == 32768
    assert _read(chunked_prefill_size=4096).chunk == 4096  # no resolved value: the flag


def test_an_automatically_chosen_fp8_kv_cache_is_refused():
    if not hasattr(torch, "float8_e4m3fn"):
        pytest.skip("this torch has no float8 dtypes")
    runner = NS(kv_cache_dtype=torch.float8_e4m3fn, dtype=torch.bfloat16)  # --kv-cache-dtype auto on an FP8 checkpoint
    settings = _read(runner)
    assert settings.kv_cache_dtype == torch.float8_e4m3fn
    assert "an FP8 KV cache in float8_e4m3fn under a bfloat16 model is not supported" in settings.refusal()
    assert _read(NS(kv_cache_dtype=torch.bfloat16, dtype=torch.bfloat16)).refusal() is None
    assert "FP8 KV cache" in _read(kv_cache_dtype="fp8_e5m2").refusal()  # a runner not resolved yet: the flag


def test_an_automatically_chosen_speculative_algorithm_is_refused():
    class Algorithm:
        name = "EAGLE3"

        def is_none(self):
            return False

    settings = _read(NS(spec_algorithm=Algorithm()))  # the flag says None; SGLang chose EAGLE3 for the model
    assert settings.speculative == "EAGLE3" and settings.refusal() == "speculative decoding (EAGLE3) is not supported"
    none = NS(name="NONE", is_none=lambda: True)
    assert _read(NS(spec_algorithm=none), speculative_algorithm="EAGLE").speculative is None  # the runner's word wins


def test_page_size_and_prefill_backend_are_the_engines():
    settings = _read(NS(prefill_attention_backend_str="fa3"), schedule=NS(page_size=16), attention_backend=None)
    assert (settings.page_size, settings.prefill_backend) == (16, "fa3")  # the flags said nothing
    assert _read().page_size == 1


def test_torch_compile_is_refused_with_the_reason():
    settings = _read(flags=NS(capture=NS(enable_torch_compile=True)))
    assert settings.torch_compile and "--enable-torch-compile is not supported" in settings.refusal()
    assert _read(enable_torch_compile=True, flags=NS()).torch_compile  # no resolved value: the flag
