"""Every change sgl-ridgefill makes to SGLang 0.5.23, in one place, applied through SGLang's HookRegistry.

Always (every process, RidgeFill on or off): the server flags, the ``ridgefill_cpu`` attention backend,
the per-request parameter check and the shape of ``meta_info["ridgefill"]`` in the tokenizer process
(the server's own process loads plugins before it parses ``--prefill-backend``, so what runs there
decides per request, not at registration), a PD decode worker's check of the KV it receives, and the
Mooncake sender's CPU path; under the CPU recipe, PyTorch paths for the SGLang code of Gated DeltaNet
hybrids that would reach Triton or CUDA on CPU tensors, and bfloat16 projections and LM head computed through
float32 on a CPU without bfloat16 instructions. Only when ``--prefill-backend ridgefill``
is on: RidgeFill's versions of the Triton, FlashInfer and fa3 attention backends; the runtime, built after
the model loads and checked against the attention backends once they exist; request admission, batch
publication and cache release (the request's state lives on SGLang's ``Req``); the model forwards; the
radix-cache match bound of namespace requests; the scheduler's prefill deferral and chunk sizes (short
forwards while others decode); the per-batch CUDA-graph gates; ``meta_info["ridgefill"]``
summaries; the weight-update guard; and, on a PD prefill worker, the held-back KV sends, the descriptor in
the metadata and the decode worker's prefix. Each hook's docstring says what SGLang does there, what
RidgeFill changes, and why; each is one row of :data:`HOOKS`. SGLang logs and swallows plugin errors, so
``hook_table.verify_hooks`` checks, once SGLang has applied every plugin's hooks, that each took effect and
stops the process (a ``SystemExit`` is not swallowed) when one did not. Two changes are not HookRegistry
hooks: the attention-backend registry entries (``attention/backends.py``, registered from
:func:`register_hooks`) and the client-side ``http_request`` wrap (``client_patch.py``).
"""

from __future__ import annotations

from typing import Any

from . import arch
from .client_patch import CLIENT_TARGETS, HTTP_REQUEST, wrap_http_request  # noqa: F401 - the client-side patch
from .hook_table import ALWAYS, CPU, ENABLED, Hook, markdown, register, targets_of
from .hook_table import missing_hooks, verify_after_apply, verify_hooks  # noqa: F401 - the startup check

ADD_CLI_ARGS = "sglang.srt.server_args.ServerArgs.add_cli_args"
VALIDATE_REQUEST = "sglang.srt.managers.tokenizer_manager.TokenizerManager._validate_one_request"
LOAD_MODEL = "sglang.srt.model_executor.model_runner.ModelRunner.load_model"
INIT_ATTENTION = "sglang.srt.model_executor.model_runner.ModelRunner.init_attention_backends"
CREATE_REQ = "sglang.srt.managers.scheduler.Scheduler._create_generation_req"
PUBLISH_BATCH = "sglang.srt.model_executor.forward_batch_info.ForwardBatch.init_new"
MATCH_LIMIT = "sglang.srt.managers.schedule_batch.Req._compute_max_prefix_len"
RELEASE_KV = "sglang.srt.mem_cache.common.release_kv_cache"
PREFILL_GRAPH = "sglang.srt.model_executor.runner.prefill_cuda_graph_runner.PrefillCudaGraphRunner.can_run_graph"
DECODE_GRAPH = "sglang.srt.model_executor.runner.decode_cuda_graph_runner.DecodeCudaGraphRunner.can_run_graph"
DEFER_PREFILL = "sglang.srt.managers.scheduler.Scheduler._should_defer_prefill"
ADD_CHUNKED_REQ = "sglang.srt.managers.schedule_policy.PrefillAdder.add_chunked_req"
ADD_ONE_REQ = "sglang.srt.managers.schedule_policy.PrefillAdder.add_one_req"
REQUEST_LEVEL_INFO = (
    "sglang.srt.managers.scheduler_components.output_streamer.SchedulerOutputStreamer."
    "is_request_level_customized_info_key"
)
GENERATE = "sglang.srt.managers.tokenizer_manager.TokenizerManager.generate_request"
_WEIGHTS = "sglang.srt.managers.scheduler_components.weight_updater.SchedulerWeightUpdaterManager."
WEIGHT_UPDATES = tuple(
    _WEIGHTS + name
    for name in ("update_weights_from_disk", "update_weights_from_distributed", "update_weights_from_tensor",
                 "update_weights_from_ipc")
)
MODEL_FORWARDS = arch.MODEL_FORWARDS  # every family's ForCausalLM.forward (arch.py)
# Prefill/decode disaggregation (runtime/disaggregation.py).
PD_SEND = "sglang.srt.disaggregation.prefill.SchedulerDisaggregationPrefillMixin.send_kv_chunk"
PD_DESCRIBE = "sglang.srt.disaggregation.utils.MetadataBuffers.set_buf"
PD_BOOTSTRAP = "sglang.srt.disaggregation.prefill.PrefillBootstrapQueue.finalize_bootstrap"
PD_RECEIVE = "sglang.srt.disaggregation.decode.DecodeTransferQueue._commit_transfer_to_req"
PD_CPU_SENDER = "sglang.srt.disaggregation.mooncake.conn.MooncakeKVSender.__init__"
# Only under the CPU recipe (the sgl_kernel stand-in first on the path): the gated norm of Gated DeltaNet layers.
GATED_NORM = "sglang.kernels.ops.attention.fla.layernorm_gated.RMSNorm.forward"
FUSED_GATED_NORM = "sglang.kernels.ops.attention.fla.fused_norm_gate.FusedRMSNormGated.forward"  # Qwen3-Next
NEXT_GDN_INIT = "sglang.srt.models.qwen3_next.Qwen3GatedDeltaNet.__init__"
SHARED_EXPERT_GATE = "sglang.kernels.ops.elementwise.elementwise.fused_gate_sigmoid_mul_add"  # Qwen2/3 MoE blocks
# Only under the CPU recipe: bfloat16 projections and LM head through float32 where the CPU has no bfloat16.
LINEAR = "sglang.srt.layers.quantization.unquant.UnquantizedLinearMethod.apply"
LM_HEAD = "sglang.srt.layers.logits_processor.LogitsProcessor._compute_lm_head"
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


def _reserved(value: Any) -> bool:
    return isinstance(value, str) and NAMESPACE_MARK in value


def after_validate_one_request(result: Any, manager: Any, obj: Any, input_ids: Any, *args: Any, **kwargs: Any) -> None:
    """AFTER ``TokenizerManager._validate_one_request``: SGLang checks lengths; RidgeFill also checks the
    request's ``custom_params["ridgefill"]`` against the server's bounds, and refuses cache keys that
    contain RidgeFill's namespace mark. A ``ValueError`` here becomes HTTP 400 for this request only. A PD
    decode worker checks only that the parameters parse: the prefill worker runs RidgeFill and applies its
    own settings."""
    from .config import config_for
    from .request_schema import RequestParamError, parse_request_params
    from .runtime.admission import check_request_bounds

    sampling = getattr(obj, "sampling_params", None) or {}
    custom = sampling.get("custom_params") if isinstance(sampling, dict) else getattr(sampling, "custom_params", None)
    for name in ("extra_key", "cache_salt"):
        if _reserved(getattr(obj, name, None)):
            raise ValueError(f"{name} may not contain {NAMESPACE_MARK!r}: it is reserved for RidgeFill's cache namespace")
    if not isinstance(custom, dict) or "ridgefill" not in custom:
        return None
    params = parse_request_params(custom)
    if params is None or params.wants_exact:
        return None
    if getattr(getattr(manager, "server_args", None), "disaggregation_mode", "null") == "decode":
        return None  # PD: the same body goes to the prefill worker, which runs RidgeFill and checks the rest
    config = config_for(manager)  # not the environment: ridgefill_engine restores it after the start
    if not config.enabled:
        raise RequestParamError(
            'custom_params["ridgefill"] asks for RidgeFill, but this server runs with --prefill-backend default'
        )
    check_request_bounds(params, config)
    if getattr(obj, "input_embeds", None) is not None or getattr(obj, "image_data", None) is not None:
        raise RequestParamError("RidgeFill does not support input_embeds or multimodal requests; omit custom_params.ridgefill")
    return None


def after_commit_transfer(result: Any, queue: Any, decode_req: Any, *args: Any, **kwargs: Any) -> None:
    """AFTER ``DecodeTransferQueue._commit_transfer_to_req`` (a PD decode worker, RidgeFill on or off): SGLang
    has received a request's KV and first token from the prefill worker; RidgeFill reads the descriptor a
    RidgeFill prefill worker wrote into the spare metadata slots and keeps filled KV out of this worker's
    radix cache, which holds exact KV that later exact requests reuse. Nothing changes for KV from a stock
    prefill worker (no descriptor)."""
    from .runtime.disaggregation import receive

    receive(queue, decode_req)
    return None


def after_mooncake_sender_init(result: Any, sender: Any, *args: Any, **kwargs: Any) -> None:
    """AFTER ``MooncakeKVSender.__init__`` (PD prefill workers): SGLang copies a chunk's page indices into
    pinned host memory and records a CUDA event when the sender supports host tensor indices; on a CPU-only
    machine (``SGLANG_USE_CPU_ENGINE``) there is no CUDA, so the sender takes SGLang's plain path instead."""
    from sglang.srt.utils import is_cpu

    if is_cpu():
        sender.supports_host_tensor_indices = False
    return None


def around_gated_norm_forward(original, norm: Any, x: Any, z: Any = None) -> Any:
    """AROUND fla's gated ``RMSNorm.forward`` (the output norm of Gated DeltaNet layers, Qwen3.5): on a CPU
    without AMX SGLang sends CPU tensors to a Triton kernel, which cannot run them; the CPU recipe computes
    the same norm in PyTorch (``gdn_ops.py``). Registered only where the CPU ``sgl_kernel`` stand-in is
    in use; any other tensor still goes to SGLang's kernel."""
    if getattr(x, "device", None) is None or x.device.type != "cpu":
        return original(norm, x, z)
    from .gdn_ops import rmsnorm_gated

    return rmsnorm_gated(x, norm.weight, z, norm.eps, norm.activation, norm.norm_before_gate, norm.group_size)


def around_fused_gated_norm_forward(original, norm: Any, x: Any, g: Any, residual: Any = None, *args: Any, **kwargs: Any) -> Any:
    """AROUND fla's ``FusedRMSNormGated.forward`` (Qwen3-Next's GDN output norm): as
    :func:`around_gated_norm_forward`; calls with a residual still go to SGLang's kernel."""
    if getattr(x, "device", None) is None or x.device.type != "cpu" or residual is not None or args or kwargs.get("prenorm"):
        return original(norm, x, g, residual, *args, **kwargs)
    from .gdn_ops import rmsnorm_gated

    return rmsnorm_gated(x, norm.weight, g, norm.eps, norm.activation)


def around_next_gdn_init(original, mixer: Any, *args: Any, **kwargs: Any) -> None:
    """AROUND ``Qwen3GatedDeltaNet.__init__`` (Qwen3-Next): SGLang places the output norm's weight on
    ``torch.get_device_module().current_device()``, which is CUDA's even in a CPU process of the CUDA wheel
    and fails without a driver; on the CPU recipe that call answers the CPU while the mixer is built."""
    import torch

    get_device_module = torch.get_device_module

    def cpu_device_module(device: Any = None):
        return torch.cpu if device is None else get_device_module(device)

    torch.get_device_module = cpu_device_module
    try:
        return original(mixer, *args, **kwargs)
    finally:
        torch.get_device_module = get_device_module


def around_shared_expert_gate(original, hidden: Any, gate_weight: Any, shared: Any, out: Any) -> None:
    """AROUND ``fused_gate_sigmoid_mul_add`` (the shared expert's gate of Qwen2-MoE-style blocks, Qwen3-Next):
    a Triton kernel on any device; on CPU tensors the same ``out += sigmoid(hidden @ w) * shared`` in
    float32, in PyTorch."""
    if getattr(hidden, "device", None) is None or hidden.device.type != "cpu":
        return original(hidden, gate_weight, shared, out)
    gate = ((hidden.float() * gate_weight.float()).sum(-1, keepdim=True)).sigmoid()
    out.copy_((out.float() + gate * shared.float()).to(out.dtype))
    return None


def around_linear_apply(original, method: Any, layer: Any, x: Any, bias: Any = None) -> Any:
    """AROUND ``UnquantizedLinearMethod.apply`` (every dense projection): on a CPU without AMX SGLang calls
    ``F.linear`` in the model's dtype, and PyTorch runs a bfloat16 GEMM in software there, several times
    slower than float32's; the CPU recipe computes it in float32 and rounds to bfloat16 (the same sums:
    ``cpu/matmul.py``). Any other call (float32, a decode step's few rows, a CPU with bfloat16
    instructions) goes to SGLang's path."""
    from .cpu.matmul import linear, upcasts

    weight = getattr(layer, "weight", None)
    if weight is None or not upcasts(x, weight):
        return original(method, layer, x, bias)
    return linear(x, weight, bias)


def around_compute_lm_head(original, processor: Any, hidden: Any, lm_head: Any, embedding_bias: Any = None, **kwargs: Any) -> Any:
    """AROUND ``LogitsProcessor._compute_lm_head``: the plain LM head (no LoRA, no quantization, no float32
    head) is ``hidden @ weight.T`` in the weight's dtype; on the CPU recipe a bfloat16 one over many rows
    (the logprobs of a prompt) runs through float32 as :func:`around_linear_apply`."""
    from .cpu.matmul import linear, upcasts

    weight = getattr(lm_head, "weight", None)
    plain = (
        embedding_bias is None and not hasattr(lm_head, "set_lora") and not getattr(processor, "use_fp32_lm_head", False)
        and type(getattr(lm_head, "quant_method", None)).__name__ in ("NoneType", "UnquantizedEmbeddingMethod")
    )
    if not plain or weight is None or not upcasts(hidden, weight):
        return original(processor, hidden, lm_head, embedding_bias, **kwargs)
    return linear(hidden, weight)


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


def after_init_attention_backends(result: Any, runner: Any, *args: Any, **kwargs: Any) -> None:
    """AFTER ``ModelRunner.init_attention_backends``: SGLang has built the attention backends; RidgeFill
    asks them what they can do (``attention/contract.py``) and turns itself off, with one startup warning
    naming the backend to pass, when the prefill backend cannot run row queries."""
    from .runtime.factory import check_backends
    from .runtime.runtime import get_runtime

    rt = get_runtime()
    if rt is not None and not getattr(runner, "is_draft_worker", False):
        check_backends(rt, runner)
    return None


def around_create_generation_req(original, scheduler: Any, recv_req: Any, *args: Any, **kwargs: Any):
    """AROUND ``Scheduler._create_generation_req``: SGLang builds the ``Req`` (for a session request, from
    the history and the new turn); RidgeFill plans it from its ``custom_params`` and the server's settings
    and attaches the plan to the ``Req`` (``runtime/state.py``), so the state lives and dies with the
    request. Filled KV stays out of reach of exact requests: the request never inserts into the radix
    cache while its prefill runs; in namespace mode its cache key gets a RidgeFill namespace, so only
    identical plans share filled KV. A bad parameter, or a cache key that names a RidgeFill namespace,
    aborts this request alone with a 400."""
    from .request_schema import RequestParamError
    from .runtime.admission import RequestFacts
    from .runtime.runtime import get_runtime
    from .runtime.state import ATTR, RIDGEFILL_SKIP, RequestState, declined, report

    rt = get_runtime()
    if rt is None or getattr(recv_req, "input_ids", None) is None:
        return original(scheduler, recv_req, *args, **kwargs)
    error = decision = None
    extra_key = kwargs.get("extra_key", getattr(recv_req, "extra_key", None))
    if _reserved(extra_key) or _reserved(kwargs.get("cache_salt", getattr(recv_req, "cache_salt", None))):
        error = f"extra_key and cache_salt may not contain {NAMESPACE_MARK!r}: it is reserved for RidgeFill's cache namespace"
    else:
        try:
            decision = rt.admit(getattr(getattr(recv_req, "sampling_params", None), "custom_params", None),
                                RequestFacts.of(recv_req))
        except RequestParamError as e:
            error = str(e)
    plan = decision.plan if decision is not None else None
    if plan is not None and plan.cache_mode == "namespace":
        mark = NAMESPACE_MARK + plan.namespace
        kwargs["extra_key"] = (extra_key or "") + mark
        # KV events hash the cache salt but not the extra key: routers must see the namespace too.
        kwargs["cache_salt"] = (kwargs.get("cache_salt", getattr(recv_req, "cache_salt", None)) or "") + mark
    req = original(scheduler, recv_req, *args, **kwargs)
    if error is not None:
        req.set_finish_with_abort(f"RidgeFill: {error}")
        # The aborted request keeps one input token; SGLang's later logprob_start_len check would
        # replace this message with its own.
        recv_req.logprob_start_len = -1
        return req
    if plan is None:
        report(req, declined(decision.reason))
        return req
    session = getattr(req, "session", None)
    if getattr(session, "streaming", False):
        # A streaming session keeps this request's KV row for the next turn, whatever that turn asks for.
        report(req, declined("streaming sessions keep a turn's KV for the next turn; RidgeFill runs exact there"))
        return req
    st = RequestState(plan=plan, prior_skip=req.skip_radix_cache_insert)
    req.skip_radix_cache_insert = RIDGEFILL_SKIP
    setattr(req, ATTR, st)
    return req


def around_init_new(original, cls: Any, batch: Any, *args: Any, **kwargs: Any):
    """AROUND ``ForwardBatch.init_new(schedule_batch, runner)``: SGLang turns the batch of ``Req`` objects
    into the ``ForwardBatch`` the model sees, which carries only rids; for a prefill batch RidgeFill records
    which ``Req`` each rid is (``LIVE``), binding a new RidgeFill request to its final prompt (after session
    concatenation and truncation), so the forward reads the state of exactly the request in the batch.
    Decode batches add nothing: their requests were recorded when they prefilled."""
    from .runtime.state import LIVE

    mode = getattr(batch, "forward_mode", None)
    if mode is not None and mode.is_extend():
        LIVE.publish(getattr(batch, "reqs", None) or ())
    return original(cls, batch, *args, **kwargs)


def around_compute_max_prefix_len(original, req: Any, *args: Any, **kwargs: Any):
    """AROUND ``Req._compute_max_prefix_len``: SGLang caps how much of a prompt a radix-cache match may
    cover; RidgeFill caps a namespace request's match at its own prefix/tail boundary plus the tail's slack,
    or past that only as far as the cached rows there are exact (``runtime/exact_rows.py``), so at most the
    slack of its tail rows read filled KV of another request's prefix as their own; and a kv+context fill,
    which needs the split states of every row before the ones it fills, matches nothing."""
    limit = original(req, *args, **kwargs)
    from .runtime.runtime import get_runtime
    from .runtime.state import state_of

    st = state_of(req)
    if st is None or st.released or st.start >= 0:
        return limit
    if st.plan.context:
        return 0
    if st.plan.cache_mode == "namespace":
        from .runtime.exact_rows import tail_slack

        reach = max(0, len(req.origin_input_ids) - st.plan.tail) + tail_slack(st.plan.tail)
        if limit > reach:
            rt = get_runtime()
            limit = reach if rt is None else rt.exact_rows.exact_until(st.row_keys(req.origin_input_ids), reach, limit)
    return limit


def around_release_kv_cache(original, req: Any, tree_cache: Any, *args: Any, **kwargs: Any):
    """AROUND ``mem_cache.common.release_kv_cache``: SGLang inserts the finished request into the radix
    cache and frees its row (also on abort and retraction); RidgeFill releases the request's state, and in
    namespace mode lets a request whose prefill completed insert into its namespace (never a partial or
    failed prefill, never a nofill request), recording first which of the rows it adds to the tree are exact.
    Only the skip RidgeFill set is cleared: a skip SGLang set since (e.g. KV that never landed) stays."""
    from .runtime.exact_rows import record_inserted_rows
    from .runtime.runtime import get_runtime
    from .runtime.state import LIVE, RIDGEFILL_SKIP, state_of

    st = state_of(req)
    if st is not None:
        insert = st.may_insert()
        if insert and req.skip_radix_cache_insert is RIDGEFILL_SKIP and not st.prior_skip:
            rt = get_runtime()
            if rt is not None:
                record_inserted_rows(rt.exact_rows, req, tree_cache, st)
        st.release()
        LIVE.forget(req)
        if req.skip_radix_cache_insert is RIDGEFILL_SKIP:
            req.skip_radix_cache_insert = st.prior_skip if insert else True
    return original(req, tree_cache, *args, **kwargs)


def around_should_defer_prefill(original, scheduler: Any, running_batch: Any, *args: Any, **kwargs: Any) -> bool:
    """AROUND ``Scheduler._should_defer_prefill(running_batch)``: SGLang skips a round's prefill, so that the
    running batch decodes, under ``--prefill-decode-interval``; RidgeFill also skips it once after each forward
    of a chunked request with a second sweep while others decode (``runtime/slicing.py``), so their next tokens
    wait for one short forward, not the whole prefill; and it notes whether any request decodes, for the chunk
    limits below; and whether any request waits or runs chunked prefill, for the exact upgrade
    (``runtime/upgrade.py``)."""
    from .runtime.runtime import get_runtime

    deferred = original(scheduler, running_batch, *args, **kwargs)
    rt = get_runtime()
    if rt is None:
        return deferred
    rt.upgrader.note_round(scheduler)
    return rt.slicer.defer(getattr(scheduler, "chunked_req", None), running_batch) or deferred


def around_add_chunked_req(original, adder: Any, req: Any, *args: Any, **kwargs: Any):
    """AROUND ``PrefillAdder.add_chunked_req(req)``: SGLang sizes the next chunk of the request it prefills in
    chunks, within ``chunked_req_limit`` when set; for a request with a second sweep while others decode,
    RidgeFill lowers that limit to ``--ridgefill-slice-rows``, ends the chunk that would end the prompt a few
    tokens short, then gives one token to each slice of the sweep (``runtime/slicing.py``). A chunk it cuts
    short takes the batch's whole budget, as a stock chunk that does not end its prompt does, so no second
    request starts chunked prefill beside it."""
    from .runtime.runtime import get_runtime

    rt = get_runtime()
    own = rt.slicer.chunk_limit(req, adder.rem_chunk_tokens or 0) if rt is not None else None
    if own is None:
        return original(adder, req, *args, **kwargs)
    limit = getattr(adder, "chunked_req_limit", None)
    adder.chunked_req_limit = own if limit is None else min(limit, own)
    out = original(adder, req, *args, **kwargs)
    if out is not None and adder.rem_chunk_tokens is not None:
        adder.rem_chunk_tokens = 0
    return out


def around_add_one_req(original, adder: Any, req: Any, *args: Any, **kwargs: Any):
    """AROUND ``PrefillAdder.add_one_req(req, ...)``: SGLang admits a waiting request into the prefill batch,
    whole or as the first chunk of a chunked prefill; for a request with a second sweep while others decode,
    RidgeFill cuts that chunk to ``--ridgefill-slice-rows`` tokens, or, when it would end the prompt, a few
    tokens short of it, so that the sweep runs in slices over the next chunks (``runtime/slicing.py``). A chunk
    it cuts takes the batch's whole budget, as any first chunk that does not end its prompt does."""
    from .runtime.runtime import get_runtime

    rt = get_runtime()
    budget = adder.rem_chunk_tokens
    own = rt.slicer.chunk_limit(req, budget) if rt is not None and budget is not None else None
    if own is None or own >= budget:
        return original(adder, req, *args, **kwargs)
    adder.rem_chunk_tokens = own
    try:
        return original(adder, req, *args, **kwargs)
    finally:
        used = own - (adder.rem_chunk_tokens or 0)
        adder.rem_chunk_tokens = 0 if getattr(adder, "new_chunked_req", None) is req else budget - used


def around_model_forward(original, lm: Any, *args: Any, **kwargs: Any):
    """AROUND ``{Llama,Qwen2,Qwen3,Qwen3_5,Qwen3Next}ForCausalLM.forward``: SGLang runs every layer for every row; RidgeFill
    runs the two-sweep prefill for the requests it admitted (``runtime/prefill.py``). Decode, exact
    requests and anything else call the original unchanged."""
    from .runtime.runtime import get_runtime

    rt = get_runtime()
    if rt is None or rt.adapter is None or rt.adapter.lm is not lm:
        return original(lm, *args, **kwargs)
    return rt.forward(original, lm, *args, **kwargs)


def around_prefill_graph(original, runner: Any, forward_batch: Any, *args: Any, **kwargs: Any) -> bool:
    """AROUND ``PrefillCudaGraphRunner.can_run_graph``: SGLang replays a captured prefill when the batch
    fits; RidgeFill's prefill branches per request in Python, so a batch that carries RidgeFill work runs
    eagerly. Every other batch keeps the graph."""
    from .runtime.state import LIVE

    if LIVE.has_work(getattr(forward_batch, "rids", None)):
        return False
    return original(runner, forward_batch, *args, **kwargs)


def around_decode_graph(original, runner: Any, forward_batch: Any, *args: Any, **kwargs: Any) -> bool:
    """AROUND ``DecodeCudaGraphRunner.can_run_graph``: a captured decode reads one key list per request for
    every layer; a nofill request's decode skips the filled rows in its upper layers, so a batch holding
    one runs eagerly, as does a batch whose step first runs a slice of an exact upgrade (``runtime/upgrade.py``)."""
    from .runtime.runtime import get_runtime
    from .runtime.state import LIVE

    if LIVE.has_hidden_keys(getattr(forward_batch, "rids", None)):
        return False
    rt = get_runtime()
    if rt is not None and rt.upgrader.due(forward_batch, LIVE) is not None:
        return False
    return original(runner, forward_batch, *args, **kwargs)


def around_request_level_info(original, streamer: Any, key: str, *args: Any, **kwargs: Any) -> bool:
    """AROUND ``SchedulerOutputStreamer.is_request_level_customized_info_key``: SGLang slices a request's
    customized info per output token unless the key is request-level; ``meta_info["ridgefill"]`` is one
    summary per request, sent once."""
    from .runtime.state import META_KEY

    return key == META_KEY or original(streamer, key, *args, **kwargs)


def around_generate_request(original, manager: Any, *args: Any, **kwargs: Any):
    """AROUND ``TokenizerManager.generate_request`` (an async generator: every response of ``/generate``,
    the OpenAI API and ``Engine.generate`` passes through it, each streamed chunk too): SGLang accumulates a
    request's customized info into lists; RidgeFill's summary is one dict per request, and every response
    that carries it shows it as that dict, ``meta_info["ridgefill"]``."""
    return _summaries_as_dicts(original(manager, *args, **kwargs))


async def _summaries_as_dicts(responses):
    from .runtime.state import META_KEY

    async for out in responses:
        for one in out if isinstance(out, list) else (out,):
            meta = one.get("meta_info") if isinstance(one, dict) else None
            value = meta.get(META_KEY) if isinstance(meta, dict) else None
            if isinstance(value, list) and value:
                meta[META_KEY] = value[-1]
        yield out


def after_weight_update(result: Any, manager: Any, *args: Any, **kwargs: Any) -> None:
    """AFTER ``SchedulerWeightUpdaterManager.update_weights_from_*``: SGLang loads new weights into the
    running model; the maps were fitted to the old ones, so RidgeFill turns itself off (every response then
    says so in ``meta_info["ridgefill"]``) until the server restarts with matching maps."""
    from .runtime.runtime import get_runtime

    rt = get_runtime()
    if rt is not None:
        rt.disable("the model's weights were updated after the maps were fitted; restart with matching maps")
    return None


def around_send_kv_chunk(original, scheduler: Any, req: Any, last_chunk: bool = False, *args: Any, **kwargs: Any):
    """AROUND ``SchedulerDisaggregationPrefillMixin.send_kv_chunk`` (PD prefill worker): SGLang ships each
    chunk's KV to the decode worker as soon as the chunk ran (and a radix hit's KV even before); RidgeFill's
    second sweep, in the last chunk, rewrites earlier chunks' upper-layer KV, so a RidgeFill request's
    intermediate sends wait. SGLang moves its send cursor only when it sends: the last send ships it all."""
    from .runtime.disaggregation import holds_back

    if not last_chunk and holds_back(req):
        return None
    return original(scheduler, req, last_chunk, *args, **kwargs)


def after_set_buf(result: Any, buffers: Any, req: Any, *args: Any, **kwargs: Any) -> None:
    """AFTER ``MetadataBuffers.set_buf`` (PD prefill worker, at a request's last send): SGLang fills the
    request's metadata row (first token, cached-token counts in ``cached_tokens`` slots 0-6); RidgeFill
    writes its descriptor (arm, filled or not, split, tail, row counts, namespace hash) into the spare
    slots 7-15, which travel with it, so the decode worker knows whether the KV holds filled rows."""
    from .runtime.disaggregation import write_descriptor

    write_descriptor(buffers, req)
    return None


def after_finalize_bootstrap(result: Any, queue: Any, req: Any, *args: Any, **kwargs: Any):
    """AFTER ``PrefillBootstrapQueue.finalize_bootstrap`` (PD prefill worker): SGLang learns how much of the
    prompt the decode worker already holds (``decode_prefix_len``, its own radix hit) and sends only the
    rest; RidgeFill makes those rows exact in this request's prefill too, so its tail attends to the KV the
    decode worker will decode over."""
    from .runtime.disaggregation import note_decode_prefix

    if result:
        note_decode_prefix(req)
    return None


# ----------------------------------------------------------------------------- registration
# Every hook, once, in registration order.
HOOKS: tuple[Hook, ...] = (
    Hook((ADD_CLI_ARGS,), after_add_cli_args, ALWAYS),
    Hook((VALIDATE_REQUEST,), after_validate_one_request, ALWAYS),
    Hook((GENERATE,), around_generate_request, ALWAYS),
    Hook((PD_RECEIVE,), after_commit_transfer, ALWAYS),
    Hook((PD_CPU_SENDER,), after_mooncake_sender_init, ALWAYS),
    Hook((GATED_NORM,), around_gated_norm_forward, CPU),
    Hook((FUSED_GATED_NORM,), around_fused_gated_norm_forward, CPU),
    Hook((NEXT_GDN_INIT,), around_next_gdn_init, CPU),
    Hook((SHARED_EXPERT_GATE,), around_shared_expert_gate, CPU),
    Hook((LINEAR,), around_linear_apply, CPU),
    Hook((LM_HEAD,), around_compute_lm_head, CPU),
    Hook((LOAD_MODEL,), after_load_model, ENABLED),
    Hook((INIT_ATTENTION,), after_init_attention_backends, ENABLED),
    Hook((CREATE_REQ,), around_create_generation_req, ENABLED),
    Hook((PUBLISH_BATCH,), around_init_new, ENABLED),
    Hook((MATCH_LIMIT,), around_compute_max_prefix_len, ENABLED),
    Hook((RELEASE_KV,), around_release_kv_cache, ENABLED),
    Hook((PREFILL_GRAPH,), around_prefill_graph, ENABLED),
    Hook((DECODE_GRAPH,), around_decode_graph, ENABLED),
    Hook((REQUEST_LEVEL_INFO,), around_request_level_info, ENABLED),
    Hook(WEIGHT_UPDATES, after_weight_update, ENABLED),
    Hook(MODEL_FORWARDS, around_model_forward, ENABLED),
    Hook((DEFER_PREFILL,), around_should_defer_prefill, ENABLED),
    Hook((ADD_CHUNKED_REQ,), around_add_chunked_req, ENABLED),
    Hook((ADD_ONE_REQ,), around_add_one_req, ENABLED),
    Hook((PD_SEND,), around_send_kv_chunk, ENABLED),
    Hook((PD_DESCRIBE,), after_set_buf, ENABLED),
    Hook((PD_BOOTSTRAP,), after_finalize_bootstrap, ENABLED),
)


def targets(*when: str) -> tuple[str, ...]:
    """The dotted targets of the hooks of :data:`HOOKS` that apply ``when``, in registration order."""
    return targets_of(HOOKS, *when)


ALWAYS_TARGETS, CPU_TARGETS, ENABLED_TARGETS = targets(ALWAYS), targets(CPU), targets(ENABLED)


def hooks_markdown() -> str:
    """The README's table of :data:`HOOKS`."""
    return markdown(HOOKS)


def register_hooks(enabled: bool) -> tuple[str, ...]:
    """Register the hooks of :data:`HOOKS` that apply to this process, in order (and the attention backends,
    which SGLang registers by name, not through hooks); returns the dotted targets that must be patched."""
    from .cpu.environment import cpu_shim_active

    when = (ALWAYS, *((CPU,) if cpu_shim_active() else ()), *((ENABLED,) if enabled else ()))
    from .attention.backends import register_cpu_backend, wrap_gpu_backends

    register_cpu_backend()
    if enabled:
        wrap_gpu_backends()
    return register(HOOKS, when)
