"""Build the scheduler process's RidgeFill runtime once SGLang has loaded the model.

Called from the ``ModelRunner.load_model`` hook (``patches.py``), before SGLang sizes the KV pool, so the
maps' memory is taken first. Configurations RidgeFill does not support leave the runtime unset: every
request then runs SGLang's own prefill, and one warning says why.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from ..config import ServerConfig
from .adapter import ModelAdapter, UnsupportedModelError
from .runtime import RidgeFillRuntime

logger = logging.getLogger("sgl_ridgefill")

# Attention backends whose extend supports RidgeFill's row queries and visible-key masks.
ROW_QUERY_BACKENDS = ("ridgefill_cpu",)
_DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


def unsupported_reason(runner: Any) -> str | None:
    """Why this scheduler process cannot run RidgeFill, or ``None``."""
    sa = getattr(runner, "server_args", None)
    if getattr(runner, "is_draft_worker", False):
        return "draft model of speculative decoding"
    if sa is not None:
        if getattr(sa, "speculative_algorithm", None):
            return f"speculative decoding ({sa.speculative_algorithm}) is not supported"
        if (getattr(sa, "pp_size", 1) or 1) > 1:
            return "pipeline parallelism is not supported"
        if (getattr(sa, "tp_size", 1) or 1) > 1:
            return "tensor parallelism is not supported yet"
        if getattr(sa, "enable_dp_attention", False):
            return "DP attention is not supported"
        if getattr(sa, "kv_cache_dtype", "auto") not in ("auto", None):
            return f"quantised KV cache ({sa.kv_cache_dtype}) is not supported"
        backend = getattr(sa, "prefill_attention_backend", None) or getattr(sa, "attention_backend", None)
        if backend not in ROW_QUERY_BACKENDS:
            return (
                f"attention backend {backend!r} cannot run exact rows over a filled cache; "
                f"RidgeFill runs on {', '.join(ROW_QUERY_BACKENDS)} (on CPU: --attention-backend ridgefill_cpu)"
            )
    return None


def _load_policies(config: ServerConfig, maps_folder, shape) -> tuple[Any, dict[str, Any]]:
    """The server's policy (``--ridgefill-policy``) and every shipped policy, compiled for this model."""
    try:
        from ..policy import MapsInfo, ModelInfo, compile_policy, list_builtin_policies, load_policy, resolve_policy_path
    except ImportError:  # the policy language is optional for the runtime's simple selections
        if config.policy:
            raise
        return None, {}
    maps_info = None
    if maps_folder is not None:
        maps_info = MapsInfo(splits=tuple(maps_folder.splits), default_split=maps_folder.default_split,
                             num_layers=maps_folder.num_layers)
    model_info = ModelInfo(num_layers=shape.num_layers, attention_layers=tuple(range(shape.num_layers)),
                           recurrent_layers=(), has_qk_norm=shape.has_qk_norm)
    policies: dict[str, Any] = {}
    for name in list_builtin_policies():
        try:
            policies[name] = compile_policy(load_policy(resolve_policy_path(name)), maps=maps_info, model=model_info)
        except ValueError:
            continue  # a shipped policy for another model (split beyond this one's layers, ...)
    server_policy = None
    if config.policy:
        server_policy = compile_policy(load_policy(resolve_policy_path(config.policy)), maps=maps_info, model=model_info)
        policies[server_policy.name] = server_policy
    return server_policy, policies


def build_runtime(runner: Any, config: ServerConfig) -> RidgeFillRuntime | None:
    reason = unsupported_reason(runner)
    if reason is not None:
        logger.warning("RidgeFill is off in this process (every request runs exact prefill): %s", reason)
        return None
    try:
        adapter = ModelAdapter(runner.model)
    except UnsupportedModelError as e:
        logger.warning("RidgeFill is off (every request runs exact prefill): %s", e)
        return None

    maps_folder = maps = token_counts = None
    if config.maps:
        from ..maps import load_maps, model_fingerprint

        maps_folder = load_maps(config.maps)
        inner = adapter.model
        fingerprint = model_fingerprint(runner.model.config.to_dict(), inner.embed_tokens.weight, inner.norm.weight)
        for warning in maps_folder.check_model(fingerprint):
            logger.warning("maps folder %s: %s", config.maps, warning)
        token_counts = maps_folder.token_counts()
    server_policy, policies = _load_policies(config, maps_folder, adapter.shape)
    default_split = maps_folder.default_split if maps_folder is not None else None
    if maps_folder is not None:
        from .maps_store import MapsStore

        model_dtype = inner.embed_tokens.weight.dtype
        dtype = _DTYPES.get(config.map_dtype, model_dtype)
        maps = MapsStore(maps_folder, list(maps_folder.splits), dtype=dtype, device=inner.embed_tokens.weight.device)
    token_table = _token_table(runner)
    rt = RidgeFillRuntime(
        config, adapter, maps=maps, maps_info=maps_folder, policy=server_policy, policies=policies,
        token_counts=token_counts, token_table=token_table, default_split=default_split,
    )
    if server_policy is not None:
        rt.check_policy_inputs(server_policy)  # a bad server policy stops the server here, with this message
    resident = maps.resident_bytes if maps is not None else 0
    logger.info(
        "RidgeFill on: model=%s layers=%d maps=%s splits=%s resident=%.1f MiB policy=%s arm=%s split=%s tail=%s cache=%s",
        type(runner.model).__name__, adapter.shape.num_layers, config.maps, list(maps.splits) if maps else [],
        resident / 2**20, server_policy.name if server_policy is not None else "-", config.arm or "policy/ridgefill",
        config.split or (server_policy.split if server_policy is not None else default_split),
        config.tail or (server_policy.tail if server_policy is not None else "1024"),
        config.cache_mode or (server_policy.cache_mode if server_policy is not None else "no_insert"),
    )
    return rt


def _token_table(runner: Any):
    """Vocabulary facts for the token-class selectors, from the served tokenizer (``None`` without one)."""
    try:
        from transformers import AutoTokenizer

        from ..selectors.tokens import TokenTable
    except ImportError:
        return None
    sa = getattr(runner, "server_args", None)
    path = getattr(sa, "tokenizer_path", None) or getattr(sa, "model_path", None)
    if path is None:
        return None
    try:
        tok = AutoTokenizer.from_pretrained(path, trust_remote_code=bool(getattr(sa, "trust_remote_code", False)))
    except Exception as e:  # noqa: BLE001 - a missing tokenizer only disables token-class selectors
        logger.info("no tokenizer for the token-class selectors (%s)", e)
        return None
    return TokenTable.from_tokenizer(tok)
