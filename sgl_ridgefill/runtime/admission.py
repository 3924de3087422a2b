"""Admission: what one request runs, decided when SGLang creates it, from its parameters and the server's.

Precedence, per setting: the request's value, else the policy the request named, else the server flag,
else the server's policy, else the default; a policy's split is the one for the prompt's length (``split S
from N tokens``). The operator bounds what a request may ask for: with ``--ridgefill-arm exact`` every
request runs exactly whatever it asks; the diagnostic keys and control arms need
``--ridgefill-diagnostics``; a request may name only the policies ``--ridgefill-request-policies`` allows;
``--ridgefill-max-tail`` caps ``tail``. Anything that only the final prompt decides (its length against
the tail, prompt logprobs) is decided when the request is bound to that prompt (``state.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..config import ServerConfig
from ..vocabulary import DEFAULT_ARM, DEFAULT_CACHE_MODE, DEFAULT_TAIL
from ..request_schema import RequestParamError, parse_request_params, refuse_diagnostics
from ..policy.compiler import describe_splits
from .plan import RequestPlan, reselection_blocker

NOFILL_UNDER_PD = (
    "the nofill arm runs exact on a PD prefill worker (its decode steps must hide the filled rows, which a "
    "stock decode worker cannot)"
)


# What a plan field is when no request, policy or flag sets it (the split defaults to the maps').
PLAN_DEFAULTS = {"arm": DEFAULT_ARM, "tail": DEFAULT_TAIL, "cache_mode": DEFAULT_CACHE_MODE}

HYBRID_NAMESPACE_REFUSAL = (
    "cache mode namespace is not available on hybrid (Gated DeltaNet) models: a recurrent state stored under a "
    "namespace is not proven safe to share; use no_insert"
)


def resolve_cache_mode(mode: str | None, *, arm: str, selects: bool, facts: "ServerFacts",
                       reselect_blocker: str | None = None) -> str:
    """The cache mode a plan runs with, from the effective setting ``mode`` (``None``: the default).

    ``auto`` shares a request's KV in its namespace when a later request on the same prefix gets what a fresh
    fill would give it: always for a plan that fills every prefix row the same way whatever the question (no
    exact rows chosen), and for a plan that chooses exact rows when it can choose them again over the reused
    cache (``RequestPlan.reselects``: among every prefix row, making exact the cached ones it chooses that the
    cache holds filled). ``reselect_blocker`` says why a selecting plan cannot (a probe, the value rescale, a
    splice, a kv+context fill, which reuses no cached prefix): it then keeps its KV out of the cache
    (``no_insert``), since a later question would inherit rows chosen for the first. ``nofill`` (its upper
    layers hold nothing for the prefix) and a PD prefill worker (the decode worker's radix cache holds exact KV
    only) never insert; hybrid models refuse ``namespace`` and resolve ``auto`` to ``no_insert`` (a recurrent
    state stored under a namespace is not proven safe to share)."""
    mode = mode or DEFAULT_CACHE_MODE
    if arm == "nofill" or facts.pd_prefill:
        return "no_insert"
    if mode == "auto":
        return "no_insert" if (selects and reselect_blocker is not None) or facts.recurrent_layers else "namespace"
    if mode == "namespace" and facts.recurrent_layers:
        raise RequestParamError(HYBRID_NAMESPACE_REFUSAL)
    return mode


def check_request_bounds(params, config: ServerConfig) -> None:
    """Refuse (``RequestParamError``) what the operator does not let clients ask for: diagnostic keys and
    control arms without ``--ridgefill-diagnostics``, a tail above ``--ridgefill-max-tail``. Runs in the
    tokenizer process (an early 400) and again at admission."""
    if not config.diagnostics:
        refuse_diagnostics(params)
    if params.tail is not None and config.max_tail is not None and params.tail > config.max_tail:
        raise RequestParamError(
            f'custom_params["ridgefill"]["tail"] = {params.tail} exceeds this server\'s limit of {config.max_tail} '
            "(--ridgefill-max-tail)"
        )


@dataclass(frozen=True)
class Admission:
    """``plan``: RidgeFill runs (``None``: exact); ``reason``: why it runs exactly (for ``meta_info``)."""

    plan: RequestPlan | None = None
    reason: str | None = None


@dataclass(frozen=True)
class ServerFacts:
    """What admission needs to know about the server besides its settings."""

    num_layers: int
    maps_splits: tuple[int, ...] = ()
    maps_id: str = ""
    maps_context: bool = False  # the maps are kv+context maps (``maps/kinds.py``)
    default_split: int | None = None
    has_tokenizer: bool = False
    has_token_counts: bool = False
    nofill_refusal: str | None = None  # why this server cannot run the nofill arm (None: it can)
    visible_keys_refusal: str | None = None  # why it cannot hide keys from a sub-pass (nofill, the probe)
    disabled: str | None = None  # why RidgeFill cannot run at all in this process (None: it can)
    pd_prefill: bool = False  # a PD prefill worker: the KV goes to a decode worker that runs no RidgeFill
    recurrent_layers: tuple[int, ...] = ()  # hybrid models: the recurrent (Gated DeltaNet) layers
    terminal_offsets: tuple[tuple[str, int, str], ...] = ()  # (file, split, arm) of the maps folder's ΔM


@dataclass(frozen=True)
class RequestFacts:
    """What admission needs to know about the request besides its RidgeFill parameters."""

    unsupported: str | None = None  # input_embeds, multimodal input, hidden states, ...
    # The prompt's length, which a policy's split may depend on: the request's own input ids. For a turn of an
    # SGLang session that is the new turn alone; SGLang joins the history when it builds the request, after
    # the plan (and its cache namespace) is fixed.
    prompt_tokens: int | None = None

    @classmethod
    def of(cls, recv_req: Any) -> "RequestFacts":
        """The facts of SGLang's tokenized request ``recv_req``."""
        ids = getattr(recv_req, "input_ids", None)
        unsupported = None
        if getattr(recv_req, "input_embeds", None) is not None:
            unsupported = "input_embeds"
        elif getattr(recv_req, "mm_inputs", None) is not None:
            unsupported = "multimodal input"
        elif getattr(recv_req, "return_hidden_states", False):
            unsupported = "return_hidden_states"
        return cls(unsupported=unsupported, prompt_tokens=len(ids) if ids is not None else None)


class Admitter:
    """Plans requests against one server's settings, policies and facts."""

    def __init__(self, config: ServerConfig, facts: ServerFacts, *, policy: Any = None, policies: Mapping[str, Any] = ()):
        self.config = config
        self.facts = facts
        self.policy = policy
        self.policies = dict(policies)
        self.requestable = self._requestable_policies()

    def _requestable_policies(self) -> dict[str, Any]:
        """The named policies a request may select (``--ridgefill-request-policies``)."""
        own = self.policy.name if self.policy is not None else None
        return {name: p for name, p in sorted(self.policies.items()) if self.config.allows_policy(name, own)}

    def effective(self, name: str, params: Any = None, named: Any = None, prompt_tokens: int | None = None) -> Any:
        """The value of plan field ``name`` a request runs with: the request's own (``params``), else the policy
        it named (``named``, which then stands in for the server's settings), else the server flag, else the
        server's policy, else the default (``split``: the maps' default). A policy's split is the one for a
        prompt of ``prompt_tokens`` tokens (``None``: its base split). With no request, what a request that sets
        nothing runs with: the startup line reports this."""
        sources = (params, named) if named is not None else (params, self.config, self.policy)
        for source in sources:
            if source is None:
                continue
            by_length = name == "split" and hasattr(source, "split_for")
            value = source.split_for(prompt_tokens) if by_length else getattr(source, name, None)
            if value is not None:
                return value
        return self.facts.default_split if name == "split" else PLAN_DEFAULTS.get(name)

    def _split_schedule(self) -> tuple[tuple[int, int], ...]:
        """The server policy's ``(tokens, split)`` pairs a request that sets nothing can reach (none when the
        ``--ridgefill-split`` flag decides)."""
        if self.config.split is not None or self.policy is None:
            return ()
        return self.policy.splits_by_length

    def split_summary(self) -> str:
        """The split a request that sets nothing runs with, as the startup line shows it."""
        return describe_splits(self.effective("split"), self._split_schedule())

    def check_server_policy(self) -> None:
        """Refuse (``RequestParamError``, which stops the server) a server policy that some prompt would run
        at a split this server cannot serve: without maps for it, or with a selection that cannot run there."""
        policy = self.policy
        if policy is None:
            return
        fills = self.effective("arm") == "ridgefill"
        for tokens, split in [(None, self.effective("split")), *self._split_schedule()]:
            if split is None:
                continue
            unmapped = split < self.facts.num_layers and split not in self.facts.maps_splits
            if tokens is not None and fills and unmapped:
                raise RequestParamError(
                    f"policy {policy.name!r} runs prompts of at least {tokens} tokens at split {split}, but the maps "
                    f"folder has splits {list(self.facts.maps_splits)}; fit it with `sgl-ridgefill calibrate --splits "
                    f"{','.join(str(s) for s in sorted({*self.facts.maps_splits, split}))}`"
                )
            if policy.has_selection():
                self.check_policy(policy, split)

    def default_cache_mode(self) -> str:
        """The cache mode a request that sets nothing runs with (the startup line), by the one resolution
        admission uses: ``auto`` is shown with what it resolves to."""
        mode = self.effective("cache_mode") or DEFAULT_CACHE_MODE
        arm = self.effective("arm") or DEFAULT_ARM
        selection = self.policy is not None and self.policy.has_selection()
        context = self._context(arm)
        blocker = reselection_blocker(policy=self.policy if selection else None, context=context,
                                      value_rescale=getattr(self.policy, "value_rescale_c", None))
        try:
            resolved = resolve_cache_mode(mode, arm=arm, selects=selection or context, facts=self.facts,
                                          reselect_blocker=blocker)
        except RequestParamError:
            return mode  # refused at startup for hybrids (factory), per request otherwise
        return f"{resolved} (auto)" if mode == "auto" else resolved

    def _context(self, arm: str) -> bool:
        """A kv+context fill: the maps are kv+context and the arm fills with them."""
        return arm == "ridgefill" and self.facts.maps_context

    def admit(self, custom_params: Mapping[str, Any] | None, request: RequestFacts = RequestFacts()) -> Admission:
        """The request's plan, or why it runs exactly. Raises ``RequestParamError`` (HTTP 400)."""
        params = parse_request_params(custom_params)
        cfg, facts = self.config, self.facts
        if params is not None:
            check_request_bounds(params, cfg)
            if params.wants_exact:
                return Admission(reason="the request asked for exact prefill")
        if cfg.arm == "exact":
            return Admission(reason="this server runs every request exactly (--ridgefill-arm exact)")
        if facts.disabled is not None:
            return Admission(reason=facts.disabled)
        named = None
        if params is not None and params.policy is not None:
            named = self.requestable.get(params.policy)
            if named is None:
                allowed = ", ".join(self.requestable) or "none"
                raise RequestParamError(
                    f'custom_params["ridgefill"]["policy"]: {params.policy!r} is not a policy this server lets '
                    f"clients select (allowed: {allowed}; see --ridgefill-request-policies)"
                )
        policy = named or self.policy

        def pick(name: str):
            return self.effective(name, params, named, request.prompt_tokens)

        arm = pick("arm") or "ridgefill"
        if arm == "exact":
            return Admission(reason="the policy runs exact prefill")
        if arm == "nofill" and facts.pd_prefill:
            return Admission(reason=NOFILL_UNDER_PD)
        split = pick("split") or facts.default_split
        tail = pick("tail") or DEFAULT_TAIL
        num_layers = facts.num_layers
        if split is None:
            raise RequestParamError("no split layer: pass --ridgefill-split, a policy with a split, or a maps folder")
        if not 1 <= split <= num_layers:
            raise RequestParamError(f"split {split} is outside 1..{num_layers} for this {num_layers}-layer model")
        if arm == "ridgefill" and split < num_layers:
            if not facts.maps_splits:
                raise RequestParamError("the ridgefill arm needs maps; this server was started without --ridgefill-maps")
            if split not in facts.maps_splits:
                raise RequestParamError(
                    f"the maps folder has splits {list(facts.maps_splits)}, not {split}; "
                    "fit it with `sgl-ridgefill calibrate --splits ...`"
                )
        if split >= num_layers:
            return Admission(reason=f"split {split} leaves no layer above it to fill")
        if request.unsupported is not None:
            return Admission(reason=f"RidgeFill does not run {request.unsupported}")
        splice = params.splice if params is not None else None
        if splice is not None and arm == "nofill":
            raise RequestParamError("splice replaces filled keys or values; the nofill arm has none")
        if splice is not None and facts.recurrent_layers:
            raise RequestParamError("splice is not available on hybrid (Gated DeltaNet) models")
        value_rescale = policy.value_rescale_c if policy is not None else None
        if params is not None and params.value_rescale is not None:
            value_rescale = params.value_rescale or None
        if value_rescale is not None and arm == "nofill":
            raise RequestParamError("value_rescale needs filled values; the nofill arm has none")
        if splice is not None and value_rescale is not None:
            raise RequestParamError("splice measures the fill itself; turn value_rescale off (value_rescale: 0)")
        context = self._context(arm)
        if context and value_rescale is not None:
            raise RequestParamError(
                "value_rescale cannot run with kv+context maps (the tail's features need the whole prompt's context); "
                "turn it off (value_rescale: 0)"
            )
        if arm == "nofill" and (facts.nofill_refusal or facts.visible_keys_refusal) is not None:
            raise RequestParamError(
                f"the nofill arm cannot run on this server: {facts.nofill_refusal or facts.visible_keys_refusal}"
            )
        exact_every = params.exact_every if params is not None else None
        exact_rows = params.exact_rows if params is not None else None
        if exact_every is not None and exact_rows is not None:
            raise RequestParamError("exact_every and exact_rows both choose the exact rows; give one of them")
        explicit = exact_every is not None or exact_rows is not None
        use_policy = policy if (policy is not None and not explicit and policy.has_selection()) else None
        if use_policy is not None:
            self.check_policy(use_policy, split)
        # A kv+context fill matches no cached prefix (it needs every row's split state): nothing could reuse it.
        selects = explicit or use_policy is not None or context
        blocker = reselection_blocker(policy=use_policy, value_rescale=value_rescale, splice=splice, context=context)
        cache_mode = resolve_cache_mode(pick("cache_mode"), arm=arm, selects=selects, facts=facts,
                                        reselect_blocker=blocker)
        terminal = getattr(getattr(policy, "terminal_state", None), "offsets", None)
        if arm == "nofill" or not any(l >= split for l in facts.recurrent_layers):
            terminal = None  # nothing filled enters a recurrent state
        if terminal is not None and (terminal, split, arm) not in facts.terminal_offsets:
            raise RequestParamError(
                f"policy {getattr(policy, 'name', '')!r} applies the terminal-state correction with offsets "
                f"{terminal!r}, which the maps folder does not hold for split {split} and arm {arm}; measure them "
                f"with `sgl-ridgefill calibrate terminal-state --splits {split} --arm {arm}`"
            )
        return Admission(
            plan=RequestPlan(
                arm=arm,
                split=split,
                tail=tail,
                cache_mode=cache_mode,
                exact_every=exact_every,
                control=params.control if params is not None else "none",
                value_rescale=value_rescale,
                seed=params.seed if params is not None else 0,
                policy=use_policy,
                policy_name=getattr(policy, "name", ""),
                maps_id=facts.maps_id,
                splice=splice,
                exact_rows=exact_rows,
                watch_rows=params.watch_rows if params is not None else None,
                context=context,
                terminal_state=terminal,
            )
        )

    def check_policy(self, policy, split: int) -> None:
        """Refuse a policy whose selectors need what this server lacks, or read layers at or above the split."""
        from ..selectors.base import AttentionRequirement, ProbeRequirement

        if self.facts.visible_keys_refusal is not None and any(isinstance(r, ProbeRequirement) for r in policy.requirements):
            raise RequestParamError(
                f"policy {policy.name!r} selects with the probe, which this server cannot run: "
                f"{self.facts.visible_keys_refusal}"
            )
        if getattr(policy, "needs_tokens", False) and not self.facts.has_tokenizer:
            raise RequestParamError(f"policy {policy.name!r} reads the tokenizer's tokens (token classes, sentences), "
                                    "but the server has no tokenizer")
        if getattr(policy, "needs_token_counts", False) and not self.facts.has_token_counts:
            raise RequestParamError(
                f"policy {policy.name!r} needs token frequencies, but the maps folder has none (recalibrate)"
            )
        for req in policy.requirements:
            if isinstance(req, AttentionRequirement) and any(layer >= split for layer in req.layers):
                raise RequestParamError(
                    f"policy {policy.name!r} reads the attention of layers {list(req.layers)}, which must lie below "
                    f"the split ({split})"
                )
