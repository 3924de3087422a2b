"""Build the scheduler process's RidgeFill runtime once SGLang has loaded the model, and check it against
the attention backends once SGLang has built them.

``build_runtime`` runs from the ``ModelRunner.load_model`` hook (``patches.py``), before SGLang sizes the
KV pool, so the maps' memory is taken first. A configuration RidgeFill cannot serve still gets a runtime,
a *disabled* one: every request runs SGLang's own prefill, one startup warning says why, and every
response says so in ``meta_info["ridgefill"]``. Bad settings (a maps folder for another model, a broken
policy) stop the server instead.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Any

import torch

from ..attention.backends import advice
from ..attention.contract import HIDDEN_KEYS, HIDDEN_KEYS_IN_EXTEND, ROW_QUERIES, VISIBLE_KEYS, capability, row_query_backend
from ..config import ServerConfig
from ..maps.kinds import MapKind
from . import distributed, resolved
from .adapter import ModelAdapter, UnsupportedModelError
from .admission import HYBRID_NAMESPACE_REFUSAL, Admitter, ServerFacts
from ..arch import HYBRID_ARCHITECTURES
from .hybrid_adapter import make_adapter
from .prefill import SelectionResources
from .runtime import RidgeFillRuntime

logger = logging.getLogger("sgl_ridgefill")

_DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32, "int8": torch.int8}
# SGLang's chunked prefill turned off: the upper pass still runs in steps of this many rows, and the slicing and
# upgrade defaults (below) take their shares of it.
UNCHUNKED_ROWS = 8192


def unsupported_reason(runner: Any) -> str | None:
    """Why this scheduler process cannot run RidgeFill at all, or ``None``."""
    sa = getattr(runner, "server_args", None)
    if getattr(runner, "is_draft_worker", False):
        return "draft model of speculative decoding"
    if sa is None:
        return None
    layout = distributed.refusal(sa)
    if layout is not None:
        return layout
    refusal = resolved.read(runner).refusal()  # speculative decoding, the KV cache's dtype, torch.compile
    if refusal is not None:
        return refusal
    checks = (
        (getattr(sa, "enable_lora", False) or getattr(sa, "lora_paths", None), "LoRA adapters are not supported"),
        (getattr(sa, "enable_deterministic_inference", False), "deterministic inference is not supported"),
        ((getattr(sa, "tokenizer_worker_num", 1) or 1) > 1,
         "several tokenizer workers are not supported (SGLang's extra workers load no plugin, so nothing there "
         "checks RidgeFill's request parameters)"),
    )
    for failed, reason in checks:
        if failed:
            return reason
    return None


def _load_policies(config: ServerConfig, maps_folder, adapter) -> tuple[Any, dict[str, Any]]:
    """The server's policy (``--ridgefill-policy``) and every shipped policy, compiled for this model."""
    from ..policy import MapsInfo, ModelInfo, compile_policy, list_builtin_policies, load_policy, resolve_policy_path

    maps_info = None
    if maps_folder is not None:
        maps_info = MapsInfo(splits=tuple(maps_folder.splits), default_split=maps_folder.default_split,
                             num_layers=maps_folder.num_layers)
    shape = adapter.shape
    model_info = ModelInfo(num_layers=shape.num_layers, attention_layers=adapter.attention_layers,
                           recurrent_layers=adapter.recurrent_layers, has_qk_norm=shape.has_qk_norm)
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


def _disabled(config: ServerConfig, reason: str, num_layers: int = 0) -> RidgeFillRuntime:
    logger.warning("RidgeFill is off in this process (every request runs exact prefill): %s", reason)
    return RidgeFillRuntime(config, None, Admitter(config, ServerFacts(num_layers=num_layers, disabled=reason)))


def hybrid_refusal(hybrid: bool, *, tp: bool, pd_prefill: bool) -> str | None:
    """Why RidgeFill cannot serve a hybrid (Gated DeltaNet) model in this process, or ``None``: neither tensor
    parallelism (the GDN states are sharded by head) nor a PD prefill worker (the states travel to the decode
    worker) has been tested with filled states yet."""
    if not hybrid or not (tp or pd_prefill):
        return None
    where = "tensor parallelism" if tp else "a PD prefill worker"
    return f"RidgeFill on hybrid (Gated DeltaNet) models under {where} is not supported yet"


def maps_refusal(kind: MapKind, tp: distributed.TensorParallel | None, *, hybrid: bool = False) -> str | None:
    """Why maps of ``kind`` cannot serve this process, or ``None`` (the kind says)."""
    return kind.refusal(hybrid=hybrid, tp_size=1 if tp is None else tp.size)


def _check_maps(runner: Any, adapter: ModelAdapter, maps_folder, tp: distributed.TensorParallel | None) -> list[str]:
    """The maps folder's warnings against the served model's fingerprint (raises ``MapsError`` on a
    mismatch). The fingerprint reads the first embedding rows and KV head 0, which tensor-parallel rank 0
    holds: under TP rank 0 checks and every rank adopts its verdict."""
    from ..maps import model_fingerprint

    inner = adapter.model

    def check() -> list[str]:
        fingerprint = model_fingerprint(
            runner.model.config.to_dict(), inner.embed_tokens.weight, inner.norm.weight, adapter.fingerprint_layers()
        )
        return maps_folder.check_model(fingerprint)

    return check() if tp is None else tp.from_first(check)


def build_runtime(runner: Any, config: ServerConfig) -> RidgeFillRuntime | None:
    """The process's runtime; ``None`` on a PD decode worker, which runs no prefill (the KV it receives
    says whether it was filled, ``disaggregation.py``)."""
    sa = getattr(runner, "server_args", None)
    if getattr(sa, "disaggregation_mode", "null") == "decode":
        logger.info("RidgeFill: PD decode worker; RidgeFill runs on the prefill workers, and filled KV received "
                    "from them never enters this worker's radix cache")
        return None
    reason = unsupported_reason(runner)
    if reason is not None:
        return _disabled(config, reason)
    tp = distributed.TensorParallel.current()
    pd_prefill = getattr(sa, "disaggregation_mode", "null") == "prefill"
    hybrid = type(runner.model).__name__ in HYBRID_ARCHITECTURES
    refusal = hybrid_refusal(hybrid, tp=tp is not None, pd_prefill=pd_prefill)  # before reading sharded weights
    if refusal is not None:
        return _disabled(config, refusal)
    try:
        adapter = make_adapter(runner.model)
    except UnsupportedModelError as e:
        return _disabled(config, str(e))
    inner = adapter.model
    if tp is not None:
        from ..metrics import export_from_this_process

        export_from_this_process(tp.first)  # every rank runs the same requests: rank 0 counts them
    maps_folder = maps = token_counts = None
    if config.maps:
        from ..maps import load_maps

        maps_folder = load_maps(config.maps)
        refusal = maps_refusal(maps_folder.kind, tp, hybrid=bool(adapter.recurrent_layers))
        if refusal is not None:
            return _disabled(config, refusal)
        for warning in _check_maps(runner, adapter, maps_folder, tp):
            logger.warning("maps folder %s: %s", config.maps, warning)
        token_counts = maps_folder.token_counts()
    server_policy, policies = _load_policies(config, maps_folder, adapter)
    recurrent = _recurrent_resources(adapter, config, maps_folder, server_policy, policies)
    if maps_folder is not None:
        from .maps_store import MapsStore

        dtype = _DTYPES.get(config.map_dtype, inner.embed_tokens.weight.dtype)
        maps = MapsStore(maps_folder, list(maps_folder.splits), dtype=dtype, device=inner.embed_tokens.weight.device,
                         hidden_size=adapter.shape.hidden_size, kv_dim=adapter.shape.kv_dim,
                         compute_dtype=inner.embed_tokens.weight.dtype, residence=config.map_residence,
                         slots=config.map_slots)
        if tp is not None:  # one map kernel on every rank: the ranks' fills then agree bit for bit
            maps.map_backends = tp.from_first(lambda: maps.map_backends)
    token_table = _token_table(runner)
    facts = ServerFacts(
        num_layers=adapter.shape.num_layers,
        maps_splits=tuple(maps.splits) if maps is not None else (),
        maps_id=maps.maps_id if maps is not None else "",
        maps_context=maps is not None and maps.kind.context,
        default_split=maps_folder.default_split if maps_folder is not None else None,
        has_tokenizer=token_table is not None,
        has_token_counts=token_counts is not None,
        pd_prefill=pd_prefill,
        recurrent_layers=adapter.recurrent_layers,
        terminal_offsets=recurrent.entries if recurrent is not None else (),
    )
    admitter = Admitter(config, facts, policy=server_policy, policies=policies)
    admitter.check_server_policy()  # a bad server policy stops the server here
    engine = resolved.read(runner)  # the settings SGLang resolved, not the raw flags
    chunk = engine.chunk
    logger.info("RidgeFill reads SGLang's resolved settings: chunk=%s kv_cache=%s model=%s page_size=%d prefill_backend=%s",
                chunk, engine.kv_cache_dtype, engine.model_dtype, engine.page_size, engine.prefill_backend)
    from ..gpu_check.census_log import from_environment
    from .slicing import Slicer
    from .split_state_store import SplitStateStore
    from .upgrade import Upgrader

    # Short forwards and the exact upgrade cut and place rows themselves: one device, a dense model, page size 1.
    one_device = tp is None and not pd_prefill and not adapter.recurrent_layers and engine.page_size == 1
    rt = RidgeFillRuntime(
        config, adapter, admitter, maps=maps,
        resources=SelectionResources(tokens=token_table, token_counts=token_counts),
        chunk_rows=chunk if chunk and chunk > 0 else UNCHUNKED_ROWS, tp=tp,
        recurrent=recurrent.resources if recurrent is not None else None, census=from_environment(),
        split_states=SplitStateStore(config.split_state_cache_mib * 2**20) if config.split_state_cache_mib else None,
        slicer=Slicer(slice_rows(config.slice_rows, chunk), allowed=one_device, sinks=maps is not None and bool(maps.folder.sink)),
        upgrader=Upgrader(upgrade_rows(config.upgrade_rows, chunk), allowed=one_device),
    )
    resident = maps.resident_bytes if maps is not None else 0
    streamed = "" if maps is None or maps.residence != "host" else (
        f" (streamed from {maps.host_bytes / 2**20:.1f} MiB of pinned host memory, {config.map_slots} layers per "
        "split on the device)")
    if pd_prefill:
        logger.info("RidgeFill on a PD prefill worker: a RidgeFill request's KV is sent once its prefill is "
                    "complete; nofill requests run exact; cache mode no_insert")
    logger.info(
        "RidgeFill on: model=%s layers=%d maps=%s splits=%s resident=%.1f MiB%s%s policy=%s arm=%s split=%s tail=%s "
        "cache=%s diagnostics=%s rows per forward while others decode=%s exact upgrade rows per decode step=%s",
        type(runner.model).__name__, adapter.shape.num_layers, config.maps, list(facts.maps_splits), resident / 2**20,
        streamed,
        "" if tp is None else f" on TP rank {tp.rank} of {tp.size} (maps replicated: this much on every rank)",
        server_policy.name if server_policy is not None else "-", admitter.effective("arm"),
        admitter.split_summary(), admitter.effective("tail"),
        admitter.default_cache_mode(),
        "on" if config.diagnostics else "off",
        rt.slicer.rows or "(SGLang's chunks)",
        rt.upgrader.rows or "off",
    )
    return rt


# Rows per forward of a RidgeFill prefill while others decode: 3/32 of SGLang's chunk, 384 rows at the CPU
# launcher's 4,096. With an eighth (512 rows) the rows policy's last forwards ran about 2.1 s each on a 2-core
# AMD EPYC (AVX-512 BF16, bfloat16), and SGLang's serving benchmark on random 6K prompts, two at a time, measured
# its p99 inter-token latency at 2,456 ms against stock's 2,423 ms; with 384 rows 1,840 ms against 2,349 ms, mean
# TTFT 26.52 s against 26.73 s before (stock's about 44 s).
SLICE_SHARE = (3, 32)
# Rows the exact upgrade rewrites per decode step: an eighth of SGLang's chunk.
UPGRADE_SHARE = (1, 8)


def _share_of_chunk(setting: int | None, chunk: int | None, share: tuple[int, int]) -> int:
    if setting is not None:
        return setting
    num, den = share
    return max(1, (chunk if chunk and chunk > 0 else UNCHUNKED_ROWS) * num // den)


def slice_rows(setting: int | None, chunk: int | None) -> int:
    """Rows per forward of a RidgeFill prefill while others decode (``slicing.py``): the setting, or 3/32 of
    SGLang's chunked-prefill size (768 rows when it does not chunk)."""
    return _share_of_chunk(setting, chunk, SLICE_SHARE)


def upgrade_rows(setting: int | None, chunk: int | None) -> int:
    """Rows the exact upgrade rewrites per decode step (``upgrade.py``): the setting, or an eighth of SGLang's
    chunked-prefill size (1,024 rows when it does not chunk)."""
    return _share_of_chunk(setting, chunk, UPGRADE_SHARE)


@dataclass(frozen=True)
class _Recurrent:
    resources: Any  # recurrent.RecurrentResources
    entries: tuple[tuple[str, int, str], ...]  # (file, split, arm) loaded


def _recurrent_resources(adapter, config: ServerConfig, maps_folder, server_policy, policies) -> _Recurrent | None:
    """Hybrid models: refuse the namespace cache mode at startup, and load the terminal-state offsets the
    policies name (the server's own policy must find its offsets, or the server stops)."""
    if not adapter.recurrent_layers:
        return None
    from ..maps.terminal import read_terminal_offsets, terminal_entries
    from .recurrent import RecurrentResources

    mode = config.cache_mode or (server_policy.cache_mode if server_policy is not None else None)
    if mode == "namespace":
        raise ValueError(f"--ridgefill-cache-mode / policy cache mode: {HYBRID_NAMESPACE_REFUSAL}")
    held = terminal_entries(maps_folder.manifest) if maps_folder is not None else []
    wanted = {p.terminal_state.offsets for p in policies.values() if getattr(p, "terminal_state", None) is not None}
    offsets = {}
    for name in sorted(wanted & {name for name, _, _ in held}):
        offsets[name] = read_terminal_offsets(maps_folder.path, name, device=adapter.model.embed_tokens.weight.device)
    terminal = getattr(server_policy, "terminal_state", None)
    if terminal is not None and terminal.offsets not in offsets:
        where = config.maps or "(no maps folder)"
        raise ValueError(
            f"policy {server_policy.name!r} applies the terminal-state correction with offsets {terminal.offsets!r}, "
            f"which the maps folder {where} does not hold; measure them with `sgl-ridgefill calibrate terminal-state`"
        )
    entries = tuple(e for e in held if e[0] in offsets)
    return _Recurrent(RecurrentResources(offsets), entries)


def check_backends(rt: RidgeFillRuntime, runner: Any) -> None:
    """Ask the attention backends SGLang built what they can do; turn RidgeFill off (one warning naming
    the backend to pass) when the prefill backend cannot run row queries."""
    backend = getattr(runner, "attn_backend", None)
    translator = getattr(runner, "kv_index_translator", None)
    if rt.disabled is not None:
        return
    if not capability(backend, ROW_QUERIES):
        name = type(row_query_backend(backend)).__name__
        rt.disable(f"the attention backend ({name}) cannot run exact rows over a filled cache; {advice()}")
    elif getattr(translator, "is_translating", False):
        rt.disable("KV index translation (unified Mamba/SWA pools) is not supported")
    else:
        decode = getattr(runner, "decode_attn_backend", None) or backend
        refusal = None
        if not capability(decode, HIDDEN_KEYS):
            refusal = f"the decode attention backend ({type(decode).__name__}) cannot hide filled rows"
        elif getattr(getattr(runner, "server_args", None), "enable_mixed_chunk", False) and not capability(
            backend, HIDDEN_KEYS_IN_EXTEND
        ):
            refusal = "with --enable-mixed-chunk its decode rows run inside prefill batches, which cannot hide them"
        hiding = None
        if not capability(backend, VISIBLE_KEYS):
            page = getattr(row_query_backend(backend), "page_size", None)
            hiding = f"the attention backend cannot hide keys from a pass at page size {page} (use --page-size 1)"
        rt.admitter.facts = replace(rt.admitter.facts, nofill_refusal=refusal, visible_keys_refusal=hiding)
        rt.admitter.check_server_policy()  # a server policy this backend cannot run stops the server
    if rt.disabled is not None:
        logger.warning("RidgeFill is off in this process (every request runs exact prefill): %s", rt.disabled)
        return
    # The held-back tokens' scratch slots of a sliced sweep come from SGLang's allocator, built by now.
    rt.slicer.allocator = getattr(runner, "token_to_kv_pool_allocator", None)
    from .warmup import warm_up

    try:
        warm_up(rt, row_query_backend(backend))
    except Exception as e:  # noqa: BLE001 - a kernel that does not compile must not stop the server
        logger.exception("RidgeFill warm-up failed")
        rt.disable(f"a RidgeFill kernel did not compile at startup ({type(e).__name__}: {e})")


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
