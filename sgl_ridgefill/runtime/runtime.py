"""The per-process RidgeFill runtime: admits requests, dispatches EXTEND batches, holds maps and policy.

One instance per scheduler process, created when SGLang has loaded the model (``patches.py``); the model
forward and the request hooks find it through :func:`get_runtime`.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any

import torch

from ..config import DEFAULT_TAIL, ServerConfig
from ..request_params import RequestParamError, parse_request_params
from . import prefill, selection
from .adapter import ModelAdapter
from .plan import RequestPlan, RequestState
from .subbatch import request_row_starts, requests_subbatch

if TYPE_CHECKING:
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch

    from .maps_store import MapsStore

logger = logging.getLogger("sgl_ridgefill")

_RUNTIME: RidgeFillRuntime | None = None


def get_runtime() -> RidgeFillRuntime | None:
    return _RUNTIME


def set_runtime(rt: RidgeFillRuntime | None) -> None:
    global _RUNTIME
    _RUNTIME = rt


class RidgeFillRuntime:
    def __init__(
        self,
        config: ServerConfig,
        adapter: ModelAdapter,
        *,
        maps: MapsStore | None,
        maps_info: Any = None,
        policy: Any = None,
        policies: dict[str, Any] | None = None,
        token_counts: torch.Tensor | None = None,
        token_table: Any = None,
        default_split: int | None = None,
    ):
        self.config = config
        self.adapter = adapter
        self.maps = maps
        self.maps_info = maps_info
        self.policy = policy
        self.policies = dict(policies or {})
        self.token_counts = token_counts
        self.token_table = token_table
        self.default_split = default_split
        self._states: dict[str, RequestState] = {}
        self._lock = threading.Lock()

    # ----------------------------------------------------------------- admission (scheduler thread)
    def plan_request(
        self,
        rid: str,
        custom_params: dict | None,
        prompt_ids: list[int],
        *,
        unsupported: str | None = None,
        logprob_start: int | None = None,
    ) -> RequestPlan | None:
        """The plan for a new request, or ``None`` to run it exactly. Raises ``RequestParamError``.

        ``logprob_start``: the first prompt row whose logprob the request wants (``None``: none but the
        last). Filled rows have no output of their own, so a request that wants them runs exactly.
        """
        params = parse_request_params(custom_params)
        if params is not None and params.wants_exact:
            return None
        named = None
        if params is not None and params.policy is not None:
            named = self.policies.get(params.policy)
            if named is None:
                raise RequestParamError(
                    f'custom_params["ridgefill"]["policy"]: unknown policy {params.policy!r}; '
                    f"this server has {', '.join(sorted(self.policies)) or 'none'}"
                )
        policy = named or self.policy
        cfg = self.config

        # Request value, else the policy the request named, else the server flag, else the server policy.
        sources = (params, named) if named is not None else (params, cfg, self.policy)

        def pick(name: str):
            for source in sources:
                value = getattr(source, name, None) if source is not None else None
                if value is not None:
                    return value
            return None

        arm = pick("arm") or "ridgefill"
        if arm == "exact":
            return None
        split = pick("split") or self.default_split
        tail = pick("tail") or DEFAULT_TAIL
        num_layers = self.adapter.shape.num_layers
        if split is None:
            raise RequestParamError("no split layer: pass --ridgefill-split, a policy with a split, or a maps folder")
        if not 1 <= split <= num_layers:
            raise RequestParamError(f"split {split} is outside 1..{num_layers} for this {num_layers}-layer model")
        if arm == "ridgefill":
            if self.maps is None:
                raise RequestParamError("the ridgefill arm needs maps; this server was started without --ridgefill-maps")
            if split < num_layers and split not in self.maps.splits:
                raise RequestParamError(
                    f"the maps folder has splits {list(self.maps.splits)}, not {split}; "
                    "fit it with `sgl-ridgefill calibrate --splits ...`"
                )
        if split >= num_layers:
            return None  # nothing above the split: exact by definition
        if unsupported is None and logprob_start is not None and logprob_start < len(prompt_ids) - tail:
            unsupported = (
                f"prompt logprobs from row {logprob_start} would read filled rows (the tail starts at row "
                f"{len(prompt_ids) - tail}); set logprob_start_len >= {len(prompt_ids) - tail} or ask for exact"
            )
        if unsupported is not None:
            logger.warning("request %s runs exact prefill: %s", rid, unsupported)
            return None
        splice = params.splice if params is not None else None
        if splice is not None and arm == "nofill":
            raise RequestParamError("splice replaces filled keys or values; the nofill arm has none")
        value_rescale = policy.value_rescale_c if policy is not None else None
        if params is not None and params.value_rescale is not None:
            value_rescale = params.value_rescale or None
        if value_rescale is not None and arm == "nofill":
            raise RequestParamError("value_rescale needs filled values; the nofill arm has none")
        if splice is not None and value_rescale is not None:
            raise RequestParamError("splice measures the fill itself; turn value_rescale off (value_rescale: 0)")
        use_policy = policy if (policy is not None and (params is None or params.exact_every is None)) else None
        if use_policy is not None:
            self.check_policy_inputs(use_policy)
        return RequestPlan(
            arm=arm,
            split=split,
            tail=tail,
            cache_mode=pick("cache_mode") or "no_insert",
            exact_every=params.exact_every if params is not None else None,
            control=params.control if params is not None else "none",
            value_rescale=value_rescale,
            seed=params.seed if params is not None else 0,
            policy=use_policy if use_policy is not None and use_policy.has_selection() else None,
            policy_name=getattr(policy, "name", ""),
            maps_id=self.maps_id,
            logprob_start=logprob_start,
            splice=splice,
        )

    def check_policy_inputs(self, policy) -> None:
        """Refuse a policy whose selectors need what this server lacks (before any forward runs)."""
        if getattr(policy, "needs_tokens", False) and self.token_table is None:
            raise RequestParamError(f"policy {policy.name!r} selects by token class, but the server has no tokenizer")
        if getattr(policy, "needs_token_counts", False) and self.token_counts is None:
            raise RequestParamError(
                f"policy {policy.name!r} needs token frequencies, but the maps folder has none (recalibrate)"
            )

    @property
    def maps_id(self) -> str:
        if self.maps is None:
            return ""
        manifest = getattr(self.maps.folder, "manifest", {}) or {}
        return str(manifest.get("id") or manifest.get("files") or self.maps.folder.path)

    def admit(self, rid: str, plan: RequestPlan, prompt_ids: list[int]) -> None:
        with self._lock:
            self._states[rid] = RequestState(plan=plan, prompt_ids=torch.tensor(prompt_ids, dtype=torch.long))

    def state(self, rid: str) -> RequestState | None:
        return self._states.get(rid)

    def release(self, rid: str) -> RequestState | None:
        from .attention_scope import forget_rows

        forget_rows(rid)
        with self._lock:
            return self._states.pop(rid, None)

    # ----------------------------------------------------------------- forward (model thread)
    def _begin(self, st: RequestState, p0: int, n: int, hidden_size: int, dtype: torch.dtype, device) -> None:
        """First chunk (rows ``[p0, p0+n)``) of a request: note the cached prefix, decide whether anything is
        left to fill."""
        st.start = p0
        if st.boundary <= p0:
            st.exact = True
            return
        if st.plan.logprob_start is not None and p0 + n < st.num_tokens:
            # SGLang computes a chunk's prompt logprobs with that chunk, before the tail's upper layers run.
            logger.warning("request runs exact prefill: prompt logprobs under RidgeFill need the prompt in one chunk")
            st.exact = True
            return
        st.tail_x = torch.empty((st.num_tokens - st.boundary, hidden_size), dtype=dtype, device=device)
        if st.plan.has_selection or st.plan.splice is not None:
            st.prefix_x = torch.empty((st.boundary - p0, hidden_size), dtype=dtype, device=device)

    def forward(self, original, lm, input_ids: torch.Tensor, positions: torch.Tensor, fb: ForwardBatch, *args, **kwargs):
        """AROUND ``<Model>ForCausalLM.forward``: stock forward unless an EXTEND batch holds RidgeFill rows."""
        from sglang.srt.model_executor.forward_batch_info import ForwardMode

        if (
            fb.forward_mode != ForwardMode.EXTEND
            or not fb.rids
            or not self._states
            or fb.input_embeds is not None
            or (args and args[0] is not None)
            or kwargs.get("input_embeds") is not None
            or kwargs.get("get_embedding")
            or kwargs.get("pp_proxy_tensors") is not None
        ):
            return original(lm, input_ids, positions, fb, *args, **kwargs)
        hidden_size = self.adapter.shape.hidden_size
        dtype = self.adapter.model.embed_tokens.weight.dtype
        work: list[RequestState | None] = []
        for i, rid in enumerate(fb.rids):
            st = self._states.get(rid)
            if st is not None and st.start < 0:
                self._begin(
                    st, int(fb.extend_prefix_lens_cpu[i]), int(fb.extend_seq_lens_cpu[i]), hidden_size, dtype,
                    input_ids.device,
                )
            work.append(None if st is None or st.exact or st.prefill_done else st)
        if all(w is None for w in work):
            return original(lm, input_ids, positions, fb, *args, **kwargs)

        with torch.no_grad():
            hidden = torch.zeros((input_ids.shape[0], hidden_size), dtype=dtype, device=input_ids.device)
            exact_idx = [i for i, w in enumerate(work) if w is None]
            if exact_idx:
                sub, rows = requests_subbatch(fb, exact_idx)
                backend = self.attn_backend()
                backend.init_forward_metadata(sub)
                out = self.adapter.model(sub.input_ids, sub.positions, sub)
                hidden[rows] = out if isinstance(out, torch.Tensor) else out[0]
            starts = request_row_starts(fb)
            for i, st in enumerate(work):
                if st is not None:
                    prefill.run_chunk(self, fb, i, starts[i], st, hidden)
                    if st.prefill_done:
                        self._log_request(fb.rids[i], st)
            self.attn_backend().init_forward_metadata(fb)
            return lm.logits_processor(input_ids, hidden, lm.lm_head, fb)

    def _log_request(self, rid: str, st: RequestState) -> None:
        s = st.stats
        logger.debug(
            "ridgefill rid=%s arm=%s split=%d tail=%d prompt=%d cached=%d filled=%d exact=%d tail_rows=%d "
            "compute_saved=%.3f",
            rid, st.plan.arm, st.plan.split, st.plan.tail, s["prompt"], s["cached"], s["filled"], s["exact"],
            s["tail"], s["saved_fraction"],
        )
        from ..metrics import record_request

        record_request(st)

    # ----------------------------------------------------------------- helpers for the passes
    @staticmethod
    def attn_backend():
        from sglang.srt.model_executor.forward_context import get_attn_backend

        return get_attn_backend()

    def req_to_token(self) -> torch.Tensor:
        return self.attn_backend().req_to_token_pool.req_to_token

    def requirements(self, plan: RequestPlan) -> tuple:
        if plan.policy is None or plan.exact_every is not None:
            return ()
        return tuple(plan.policy.requirements)

    def select_rows(self, fb: ForwardBatch, i: int, st: RequestState, probes: dict) -> torch.Tensor:
        """The request's exact rows (sorted positions in ``[start, B)``), after its lower layers ran."""
        policy_rows = None
        if st.plan.policy is not None and st.plan.exact_every is None:
            policy_rows = self._policy_rows(fb, i, st, probes)
        return selection.exact_rows_for(st, policy_rows)

    def _policy_rows(self, fb: ForwardBatch, i: int, st: RequestState, probes: dict) -> torch.Tensor:
        from ..selectors.base import AttentionRequirement, SelectionInputs

        attention = {}
        req_row = fb.req_pool_indices[i]
        slots = self.req_to_token()[req_row, : st.num_tokens]
        pool = self.attn_backend().token_to_kv_pool
        for req in self.requirements(st.plan):
            if not isinstance(req, AttentionRequirement):
                continue
            lo, hi = selection.query_window(req.query, req.q, st.num_tokens, st.boundary)
            total = torch.zeros(st.boundary, dtype=torch.float32)
            for layer_id in req.layers:
                chunks = st.queries.get((req, layer_id), [])
                if not chunks:
                    continue
                q = torch.cat(chunks).reshape(hi - lo, -1, self.adapter.shape.head_dim)
                k = pool.get_key_buffer(layer_id)[slots]
                scale = self.adapter.layers[layer_id].self_attn.attn.scaling
                received = selection.attention_received(q.float(), k.float(), torch.arange(lo, hi), scale)
                total += received[: st.boundary].cpu()
            attention[req] = total
        inputs = SelectionInputs(
            token_ids=st.prompt_ids,
            prefix_len=st.boundary,
            seed=st.plan.seed,
            tokens=self.token_table,
            token_counts=self.token_counts,
            attention=attention,
            probe=probes,
        )
        return st.plan.policy.select(inputs)

    def value_rescaler(self, st: RequestState, exact: torch.Tensor, x_rows: torch.Tensor, *, n_exact: int, req_row):
        """The value rescale (SPEC.md, "Corrections") as an ``upper_pass`` callback."""
        c = min(st.plan.value_rescale, st.num_tokens - st.boundary)
        x_split_tail = x_rows[n_exact : n_exact + c]
        filled = torch.ones(st.boundary - st.start, dtype=torch.bool)
        filled[exact - st.start] = False
        filled_pos = torch.nonzero(filled).flatten() + st.start
        slots = self.req_to_token()[req_row, filled_pos.to(self.req_to_token().device)]
        pool = self.attn_backend().token_to_kv_pool
        split = st.plan.split

        def before_layer(layer_id: int, x_in: torch.Tensor) -> None:
            if not slots.numel():
                return
            v_exact = self.adapter.value(layer_id, x_in[n_exact : n_exact + c]).float()
            x_hat = x_split_tail if st.plan.arm == "identity" else self.maps.predict(split, layer_id, x_split_tail)
            v_pred = self.adapter.value(layer_id, x_hat).float()
            ratio = v_exact.norm(dim=-1) / v_pred.norm(dim=-1).clamp_min(1e-12)  # [c, kv_heads]
            scale = ratio.mean(dim=0)
            v_buf = pool.get_value_buffer(layer_id)
            v_buf[slots] = (v_buf[slots].float() * scale.view(1, -1, 1)).to(v_buf.dtype)

        return before_layer
