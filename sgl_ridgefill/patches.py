"""Every change sgl-ridgefill makes to SGLang 0.5.23, in one place, applied through SGLang's HookRegistry.

Always (every process, RidgeFill on or off): the server flags, the ``ridgefill_cpu`` attention backend,
the per-request parameter check in the tokenizer process, and a resolution step that turns the prefill
CUDA graph off when RidgeFill is on. Only when ``--prefill-backend ridgefill`` is on (scheduler
processes): the runtime built after the model loads, request admission, cache release, and the model
forwards. Each hook's docstring says what SGLang does there, what RidgeFill changes, and why. SGLang logs
and swallows plugin errors, so :func:`verify_hooks` checks that every hook took effect and stops the
process (a ``SystemExit`` is not swallowed) when one did not.
"""

from __future__ import annotations

import logging
from typing import Any

from . import envs

logger = logging.getLogger("sgl_ridgefill")

ADD_CLI_ARGS = "sglang.srt.server_args.ServerArgs.add_cli_args"
VALIDATE_REQUEST = "sglang.srt.managers.tokenizer_manager.TokenizerManager._validate_one_request"
LOAD_MODEL = "sglang.srt.model_executor.model_runner.ModelRunner.load_model"
CREATE_REQ = "sglang.srt.managers.scheduler.Scheduler._create_generation_req"
RELEASE_KV = "sglang.srt.mem_cache.common.release_kv_cache"
MODEL_FORWARDS = (
    "sglang.srt.models.llama.LlamaForCausalLM.forward",
    "sglang.srt.models.qwen2.Qwen2ForCausalLM.forward",
    "sglang.srt.models.qwen3.Qwen3ForCausalLM.forward",
)
ALWAYS_TARGETS = (ADD_CLI_ARGS, VALIDATE_REQUEST)
ENABLED_TARGETS = (LOAD_MODEL, CREATE_REQ, RELEASE_KV, *MODEL_FORWARDS)
NAMESPACE_MARK = "|rf:"


# ----------------------------------------------------------------------------- always
def after_add_cli_args(result: Any, *args: Any, **kwargs: Any) -> None:
    """AFTER ``ServerArgs.add_cli_args(parser)``: SGLang fills its parser; RidgeFill adds
    ``--prefill-backend`` and the ``--ridgefill-*`` flags to it, so they show in ``--help`` and parse."""
    import argparse

    from .cli_args import add_ridgefill_arguments

    for candidate in (*args, *kwargs.values()):
        if isinstance(candidate, argparse.ArgumentParser):
            add_ridgefill_arguments(candidate)
            break
    return None


def after_validate_one_request(result: Any, manager: Any, obj: Any, input_ids: Any, *args: Any, **kwargs: Any) -> None:
    """AFTER ``TokenizerManager._validate_one_request``: SGLang checks lengths; RidgeFill also checks the
    request's ``custom_params["ridgefill"]``. A ``ValueError`` here becomes HTTP 400 for this request only."""
    from .request_params import RequestParamError, parse_request_params

    sampling = getattr(obj, "sampling_params", None) or {}
    custom = sampling.get("custom_params") if isinstance(sampling, dict) else getattr(sampling, "custom_params", None)
    extra_key = getattr(obj, "extra_key", None)
    if isinstance(extra_key, str) and NAMESPACE_MARK in extra_key:
        raise ValueError(f"extra_key may not contain {NAMESPACE_MARK!r}: it is reserved for RidgeFill's cache namespace")
    if not isinstance(custom, dict) or "ridgefill" not in custom:
        return None
    params = parse_request_params(custom)
    if params is None or params.wants_exact:
        return None
    if not envs.ridgefill_enabled():
        raise RequestParamError(
            'custom_params["ridgefill"] asks for RidgeFill, but this server runs with --prefill-backend default'
        )
    if getattr(obj, "input_embeds", None) is not None or getattr(obj, "image_data", None) is not None:
        raise RequestParamError("RidgeFill does not support input_embeds or multimodal requests; omit custom_params.ridgefill")
    return None


def _register_attention_backend() -> None:
    """``ridgefill_cpu`` joins SGLang's attention-backend registry and the ``--attention-backend`` choices."""
    from sglang.srt.arg_groups.choices import ATTENTION_BACKEND_CHOICES, add_attention_backend_choices
    from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS, register_attention_backend

    if "ridgefill_cpu" in ATTENTION_BACKENDS:
        return

    @register_attention_backend("ridgefill_cpu")
    def create_ridgefill_cpu_backend(runner):
        from .cpu.attention import RidgeFillCpuAttnBackend

        return RidgeFillCpuAttnBackend(runner)

    if "ridgefill_cpu" not in ATTENTION_BACKEND_CHOICES:
        add_attention_backend_choices(["ridgefill_cpu"])


def _register_resolution_hook() -> None:
    """Resolution step ``handle_cuda_graph_config``: when RidgeFill is on, the prefill CUDA graph is off
    (it would capture the model forward, where RidgeFill branches per request in Python)."""
    from sglang.srt.arg_groups.overrides import declare_resolution, resolving_view
    from sglang.srt.arg_groups.resolution_hooks import register_resolution_hook
    from sglang.srt.model_executor.cuda_graph_config import Backend, Phase, with_phase

    @register_resolution_hook("handle_cuda_graph_config")
    def ridgefill_prefill_graph_off(server_args, previous):
        previous(server_args)
        if envs.ridgefill_enabled():
            cfg = resolving_view(server_args)
            declare_resolution(
                server_args,
                "ridgefill",
                cuda_graph_config=with_phase(cfg.cuda_graph_config, Phase.PREFILL, backend=Backend.DISABLED),
            )


# ----------------------------------------------------------------------------- RidgeFill on
def after_load_model(result: Any, runner: Any, *args: Any, **kwargs: Any) -> None:
    """AFTER ``ModelRunner.load_model``: SGLang has built the model; RidgeFill builds its runtime (maps
    resident on the model's device, policies compiled) before SGLang sizes the KV pool around free memory."""
    from .config import ServerConfig
    from .runtime.factory import build_runtime
    from .runtime.runtime import set_runtime

    if getattr(runner, "is_draft_worker", False):
        return None
    set_runtime(build_runtime(runner, ServerConfig.from_env()))
    return None


def _unsupported_request(recv_req: Any) -> str | None:
    if getattr(recv_req, "input_embeds", None) is not None:
        return "input_embeds"
    if getattr(recv_req, "mm_inputs", None) is not None:
        return "multimodal input"
    if getattr(recv_req, "return_hidden_states", False):
        return "return_hidden_states"
    return None


def _prompt_logprob_start(recv_req: Any) -> int | None:
    """The first prompt row whose logprob the request wants, or ``None`` when it wants none but the last."""
    if not getattr(recv_req, "return_logprob", False):
        return None
    start = getattr(recv_req, "logprob_start_len", -1)
    if start is None or start == -1 or start >= len(recv_req.input_ids) - 1:
        return None
    return int(start)


def around_create_generation_req(original, scheduler: Any, recv_req: Any, *args: Any, **kwargs: Any):
    """AROUND ``Scheduler._create_generation_req``: SGLang builds the ``Req``; RidgeFill plans the request
    from its ``custom_params`` and the server policy, and keeps filled KV out of reach of exact requests:
    by default the request never inserts into the radix cache (it still reuses exact cached prefixes); in
    namespace mode its cache key gets a RidgeFill namespace, so only identical plans share filled KV. A
    bad parameter aborts this request alone with a 400."""
    from .request_params import RequestParamError
    from .runtime.runtime import get_runtime

    rt = get_runtime()
    if rt is None or getattr(recv_req, "input_ids", None) is None:
        return original(scheduler, recv_req, *args, **kwargs)
    sampling = getattr(recv_req, "sampling_params", None)
    custom = getattr(sampling, "custom_params", None)
    error = plan = None
    try:
        plan = rt.plan_request(
            recv_req.rid, custom, recv_req.input_ids, unsupported=_unsupported_request(recv_req),
            logprob_start=_prompt_logprob_start(recv_req),
        )
    except RequestParamError as e:
        error = str(e)
    if plan is not None and plan.cache_mode == "namespace":
        kwargs["extra_key"] = (kwargs.get("extra_key") or "") + NAMESPACE_MARK + plan.namespace
    req = original(scheduler, recv_req, *args, **kwargs)
    if error is not None:
        req.set_finish_with_abort(f"RidgeFill: {error}")
        # The aborted request keeps one input token; SGLang's later logprob_start_len check would
        # replace this message with its own.
        recv_req.logprob_start_len = -1
    elif plan is not None:
        req.skip_radix_cache_insert = True
        rt.admit(req.rid, plan, list(recv_req.input_ids))
    return req


def around_release_kv_cache(original, req: Any, tree_cache: Any, *args: Any, **kwargs: Any):
    """AROUND ``mem_cache.common.release_kv_cache``: SGLang inserts the finished request into the radix
    cache and frees its row; RidgeFill forgets the request, and in namespace mode lets a request whose
    prefill completed insert into its namespace (never a partial prefill)."""
    from .runtime.runtime import get_runtime

    rt = get_runtime()
    st = rt.release(req.rid) if rt is not None else None
    if st is not None and st.plan.cache_mode == "namespace" and st.prefill_done and not st.exact:
        req.skip_radix_cache_insert = False
    return original(req, tree_cache, *args, **kwargs)


def around_model_forward(original, lm: Any, *args: Any, **kwargs: Any):
    """AROUND ``{Llama,Qwen2,Qwen3}ForCausalLM.forward``: SGLang runs every layer for every row; RidgeFill
    runs the two-sweep prefill for the requests it admitted (``runtime/prefill.py``). Decode, exact
    requests and anything else call the original unchanged."""
    from .runtime.runtime import get_runtime

    rt = get_runtime()
    if rt is None or rt.adapter.lm is not lm:
        return original(lm, *args, **kwargs)
    return rt.forward(original, lm, *args, **kwargs)


# ----------------------------------------------------------------------------- registration
def register_hooks(enabled: bool) -> tuple[str, ...]:
    """Register the hooks in order; returns the dotted targets that must be patched."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(ADD_CLI_ARGS, after_add_cli_args, HookType.AFTER)
    HookRegistry.register(VALIDATE_REQUEST, after_validate_one_request, HookType.AFTER)
    _register_attention_backend()
    _register_resolution_hook()
    if not enabled:
        return ALWAYS_TARGETS
    HookRegistry.register(LOAD_MODEL, after_load_model, HookType.AFTER)
    HookRegistry.register(CREATE_REQ, around_create_generation_req, HookType.AROUND)
    HookRegistry.register(RELEASE_KV, around_release_kv_cache, HookType.AROUND)
    for target in MODEL_FORWARDS:
        HookRegistry.register(target, around_model_forward, HookType.AROUND)
    return ALWAYS_TARGETS + ENABLED_TARGETS


def missing_hooks(targets: tuple[str, ...]) -> list[str]:
    """Targets whose hook is not in place (never applied, or replaced since)."""
    import pkgutil

    from sglang.srt.plugins.hook_registry import HookRegistry

    missing = []
    for target in targets:
        if target not in HookRegistry._patched:  # noqa: SLF001
            missing.append(target)
            continue
        owner, attr = target.rsplit(".", 1)
        fn = getattr(pkgutil.resolve_name(owner), attr, None)
        if getattr(fn, "__wrapped__", None) is None:
            missing.append(target)
    return missing


def verify_hooks(targets: tuple[str, ...]) -> None:
    """Stop this process when a required hook did not take effect (SGLang would otherwise start without it)."""
    from sglang.srt.plugins.hook_registry import HookRegistry

    HookRegistry.apply_hooks()
    missing = missing_hooks(targets)
    if missing:
        msg = (
            "sgl-ridgefill: --prefill-backend ridgefill was requested but these SGLang hooks did not take effect: "
            + ", ".join(missing)
            + ". Refusing to start a server that would silently run exact prefill."
        )
        logger.critical(msg)
        raise SystemExit(msg)


# ----------------------------------------------------------------------------- client side: frontend programs
# This section runs in the client process of an ``@sgl.function`` program, not in SGLang's server
# processes, so it is neither registered through HookRegistry (which the server's plugin loader applies)
# nor in ALWAYS_TARGETS / ENABLED_TARGETS: the first ``RidgeFillEndpoint`` installs it, and each endpoint
# method checks that its request went through it (``frontend.py``). Its imports are kept here, with it.
import functools  # noqa: E402
import threading  # noqa: E402
from collections.abc import Callable  # noqa: E402

HTTP_REQUEST = "sglang.lang.backend.runtime_endpoint.http_request"
CLIENT_TARGETS = (HTTP_REQUEST,)
_client_patch_lock = threading.Lock()


def wrap_http_request(stamp: Callable[[str, Any], Any]) -> None:
    """WRAP the module global ``runtime_endpoint.http_request`` in the client process, once.

    SGLang's frontend ``RuntimeEndpoint`` builds every ``/generate`` body itself and posts it through
    this global, and ``sgl.gen`` has no ``custom_params``. RidgeFill passes each body through
    ``stamp(url, body)`` first, which returns the body unchanged or a copy carrying
    ``custom_params["ridgefill"]`` (``frontend.RidgeFillEndpoint``), so that a frontend program, its forks
    and their prefix-caching requests can ask for a RidgeFill plan. Not a HookRegistry hook: it runs in
    the client process, where no plugin loads, lazily when the first ``RidgeFillEndpoint`` is made.
    Idempotent and thread-safe (later calls keep the first ``stamp``); ``RuntimeError`` when the target is
    missing.
    """
    from sglang.lang.backend import runtime_endpoint

    with _client_patch_lock:
        original = getattr(runtime_endpoint, "http_request", None)
        if getattr(original, "_ridgefill_seam", False):
            return
        if not callable(original):
            raise RuntimeError(
                f"{HTTP_REQUEST} is missing, so RidgeFillEndpoint cannot attach its parameters; "
                "this SGLang version posts requests differently from the one sgl-ridgefill supports"
            )

        @functools.wraps(original)
        def http_request(url: str, *args: Any, **kwargs: Any) -> Any:
            # SGLang passes the body as json=... (or first positional after the URL).
            body = args[0] if args else kwargs.get("json")
            stamped = stamp(url, body)
            if stamped is not body:
                if args:
                    args = (stamped, *args[1:])
                else:
                    kwargs["json"] = stamped
            return original(url, *args, **kwargs)

        http_request._ridgefill_seam = True  # type: ignore[attr-defined]
        runtime_endpoint.http_request = http_request
