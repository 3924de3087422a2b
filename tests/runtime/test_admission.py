"""Request admission: which values win, what the operator bounds, and which requests are refused or run
exactly (no engine needed)."""

from __future__ import annotations

import pytest

from sgl_ridgefill.config import ServerConfig
from sgl_ridgefill.policy import MapsInfo, ModelInfo, compile_policy, parse_policy
from sgl_ridgefill.request_schema import RequestParamError
from sgl_ridgefill.runtime.admission import Admitter, RequestFacts, ServerFacts

MODEL = ModelInfo(num_layers=24, attention_layers=tuple(range(24)), recurrent_layers=(), has_qk_norm=False)
MAPS = MapsInfo(splits=(12, 16), default_split=12, num_layers=24)
FACTS = ServerFacts(num_layers=24, maps_splits=(12, 16), maps_id="m", default_split=12)


def _policy(text: str):
    return compile_policy(parse_policy(text), maps=MAPS, model=MODEL)


SERVER_POLICY = _policy('policy "server" { split 16 tail 2048 select attention_topk(q=64, share=10%) }')
NAMED = _policy('policy "named" { arm ridgefill split 12 tail 512 cache namespace }')
IDENTITY = _policy('policy "identity-named" { arm identity split 12 }')


def _admitter(facts: ServerFacts = FACTS, **cfg) -> Admitter:
    policies = {"named": NAMED, "server": SERVER_POLICY, "identity-named": IDENTITY}
    return Admitter(ServerConfig(prefill_backend="ridgefill", maps="m", **cfg), facts, policy=SERVER_POLICY, policies=policies)


def admit(admitter, params, **kw):
    return admitter.admit({"ridgefill": params} if params is not None else None, RequestFacts(**kw))


def plan(admitter, params, **kw):
    decision = admit(admitter, params, **kw)
    assert decision.plan is not None, decision.reason
    return decision.plan


def test_server_policy_applies_by_default():
    p = plan(_admitter(), None)
    assert (p.arm, p.split, p.tail, p.cache_mode) == ("ridgefill", 16, 2048, "namespace")  # auto: a selection that reselects shares
    assert p.policy is SERVER_POLICY and p.has_selection


def test_server_flags_override_the_server_policy():
    p = plan(_admitter(tail=1024), None)
    assert (p.split, p.tail) == (16, 1024)


def test_named_policy_wins_over_server_flags_and_request_values_win_over_everything():
    admitter = _admitter(tail=1024, arm="ridgefill", request_policies=("named",))
    p = plan(admitter, {"policy": "named"})
    assert (p.arm, p.split, p.tail, p.cache_mode) == ("ridgefill", 12, 512, "namespace")
    assert plan(admitter, {"policy": "named", "tail": 64}).tail == 64


def test_clients_select_only_the_policies_the_operator_allows():
    """C13: every shipped policy used to be selectable by name, bypassing the server's settings."""
    with pytest.raises(RequestParamError, match=r"'named' is not a policy this server lets clients select \(allowed: server;"):
        admit(_admitter(), {"policy": "named"})
    assert plan(_admitter(request_policies=("all",)), {"policy": "named"}).tail == 512
    assert plan(_admitter(diagnostics=True), {"policy": "named"}).tail == 512


def test_server_arm_exact_is_final():
    """C13: ``--ridgefill-arm exact`` turns RidgeFill off whatever the request asks for."""
    decision = admit(_admitter(arm="exact"), {"arm": "ridgefill", "tail": 64})
    assert decision.plan is None and "--ridgefill-arm exact" in decision.reason


def test_diagnostics_need_the_server_switch():
    """C8: splice, exact_every, the random control and the control arms cost more than an exact prefill or
    serve worse answers; clients get them only from a server started with --ridgefill-diagnostics."""
    for params in ({"splice": "keys"}, {"exact_every": 1}, {"control": "random"}, {"seed": 3}, {"arm": "nofill"},
                   {"arm": "identity"}):
        with pytest.raises(RequestParamError, match="only when started with --ridgefill-diagnostics"):
            admit(_admitter(), params)
    assert plan(_admitter(diagnostics=True), {"splice": "keys"}).splice == "keys"
    assert plan(_admitter(diagnostics=True), {"exact_every": 1}).exact_every == 1


def test_max_tail_caps_requests():
    with pytest.raises(RequestParamError, match=r"tail\"\] = 5000 exceeds this server's limit of 4096"):
        admit(_admitter(max_tail=4096), {"tail": 5000})
    assert plan(_admitter(max_tail=4096), {"tail": 4096}).tail == 4096


def test_exact_requests_have_no_plan():
    admitter = _admitter()
    assert admit(admitter, {"enabled": False}).reason == "the request asked for exact prefill"
    assert admit(admitter, "exact").plan is None
    assert "no layer above it" in admit(admitter, {"split": 24}).reason


def test_unsupported_request_runs_exact_and_says_why():
    decision = admit(_admitter(), {}, unsupported="input_embeds")
    assert decision.plan is None and decision.reason == "RidgeFill does not run input_embeds"


def test_disabled_server_declines_every_request():
    admitter = _admitter(ServerFacts(num_layers=24, disabled="the attention backend (X) cannot run exact rows"))
    decision = admit(admitter, {"tail": 64})
    assert decision.plan is None and decision.reason.startswith("the attention backend (X)")


def test_nofill_runs_only_where_the_decode_backend_hides_filled_rows():
    refusing = ServerFacts(num_layers=24, maps_splits=(12,), default_split=12, nofill_refusal="no way to hide them")
    with pytest.raises(RequestParamError, match="the nofill arm cannot run on this server: no way to hide them"):
        admit(_admitter(refusing, diagnostics=True), {"arm": "nofill"})
    p = plan(_admitter(diagnostics=True, cache_mode="namespace"), {"arm": "nofill"})
    assert p.cache_mode == "no_insert"  # C6: its upper layers hold nothing for the prefix: never shared


def test_the_probe_is_refused_where_keys_cannot_be_hidden():
    probe = _policy('policy "probe" { split 12 select top(probe(rows=64), 10%) }')
    facts = ServerFacts(num_layers=24, maps_splits=(12,), default_split=12, visible_keys_refusal="page size 4")
    admitter = Admitter(ServerConfig(prefill_backend="ridgefill", maps="m"), facts, policy=probe, policies={"probe": probe})
    with pytest.raises(RequestParamError, match="policy 'probe' selects with the probe, which this server cannot run: page size 4"):
        admit(admitter, {})
    with pytest.raises(RequestParamError, match="the nofill arm cannot run on this server: page size 4"):
        admit(Admitter(ServerConfig(prefill_backend="ridgefill", maps="m", diagnostics=True), facts), {"arm": "nofill"})


def test_splice_is_a_diagnostic_of_the_filled_arms():
    admitter = _admitter(diagnostics=True)
    assert plan(admitter, {"splice": "keys"}).namespace != plan(admitter, {}).namespace
    with pytest.raises(RequestParamError, match="the nofill arm has none"):
        admit(admitter, {"arm": "nofill", "splice": "values"})


def test_policy_reading_layers_at_or_above_the_split_is_refused():
    """L7: a request split below the policy's attention layers used to drop their captures silently."""
    layers = list(SERVER_POLICY.requirements[0].layers)
    assert max(layers) >= 12
    with pytest.raises(RequestParamError) as e:
        admit(_admitter(), {"split": 12})
    assert str(e.value) == f"policy 'server' reads the attention of layers {layers}, which must lie below the split (12)"
    low = _policy('policy "low" { split 12 select attention_topk(q=64, share=10%, layers=[0, 3]) }')
    admitter = Admitter(ServerConfig(prefill_backend="ridgefill", maps="m"), FACTS, policy=low, policies={"low": low})
    assert plan(admitter, {"split": 12}).policy is low


@pytest.mark.parametrize(
    "params, message",
    [
        ({"split": 13}, "the maps folder has splits [12, 16], not 13; fit it with `sgl-ridgefill calibrate --splits ...`"),
        ({"split": 30}, "split 30 is outside 1..24 for this 24-layer model"),
        ({"value_rescale": 64, "arm": "nofill"}, "value_rescale needs filled values; the nofill arm has none"),
    ],
)
def test_refused(params, message):
    with pytest.raises(RequestParamError) as e:
        admit(_admitter(diagnostics=True), params)
    assert str(e.value) == message


def test_namespace_is_a_function_of_everything_that_changes_filled_kv():
    admitter = _admitter()
    a, b, c = plan(admitter, {}), plan(admitter, {}), plan(admitter, {"tail": 100})
    assert a.namespace == b.namespace != c.namespace


@pytest.mark.parametrize("cfg", [{}, {"tail": 1024}, {"split": 16, "cache_mode": "namespace"}])
def test_the_startup_report_is_what_a_plain_request_runs(cfg):
    """One resolution: what ``effective`` reports (the startup line) is the plan of a request that sets nothing,
    including a server policy that leaves the split to the maps' default."""
    admitter = _admitter(**cfg)
    p = plan(admitter, None)
    assert tuple(admitter.effective(k) for k in ("arm", "split", "tail")) == (p.arm, p.split, p.tail)
    assert admitter.default_cache_mode().split()[0] == p.cache_mode
    no_split = Admitter(ServerConfig(prefill_backend="ridgefill", maps="m"), FACTS, policy=_policy('policy "p" { tail 64 }'))
    assert no_split.effective("split") == 12 == plan(no_split, None).split


BARE = _policy('policy "bare" { split 12 }')  # no cache statement: auto


def test_auto_shares_the_kv_of_plans_a_later_request_gets_fresh_rows_from():
    """``auto`` (the default): a plan that fills every prefix row whatever the question shares its KV in its
    namespace (a later question on the document prefills only its new tokens), and so does a plan that chooses
    exact rows and can choose them again over the reused cache; a selection that cannot (a probe, the value
    rescale) keeps it out, since a later question would inherit rows chosen for the first."""
    bare = Admitter(ServerConfig(prefill_backend="ridgefill", maps="m", diagnostics=True), FACTS, policy=BARE,
                    policies={"server": SERVER_POLICY})
    assert BARE.cache_mode == "auto" and plan(bare, None).cache_mode == "namespace"
    assert bare.default_cache_mode() == "namespace (auto)"
    for params in ({"exact_every": 8}, {"exact_rows": [3, 5]}, {"arm": "identity"}):
        p = plan(bare, params)
        assert p.cache_mode == "namespace" and p.reselects == p.has_selection, params
    assert plan(bare, {"arm": "nofill"}).cache_mode == "no_insert"
    assert plan(bare, {"exact_every": 8, "value_rescale": 64}).cache_mode == "no_insert"
    selecting = _admitter()  # the server policy selects rows by attention
    p = plan(selecting, None)
    assert p.cache_mode == "namespace" and p.reselects and selecting.default_cache_mode() == "namespace (auto)"
    probe = Admitter(ServerConfig(prefill_backend="ridgefill", maps="m"), FACTS,
                     policy=_policy('policy "probe" { split 12 select top(probe(rows=64), 10%) }'))
    p = plan(probe, None)
    assert p.cache_mode == "no_insert" and not p.reselects and probe.default_cache_mode() == "no_insert (auto)"
    rescaled = Admitter(ServerConfig(prefill_backend="ridgefill", maps="m"), FACTS, policy=_policy(
        'policy "rescaled" { split 12 select attention_topk(q=64, share=10%) correct value_rescale(c=64) }'))
    assert plan(rescaled, None).cache_mode == "no_insert" and rescaled.default_cache_mode() == "no_insert (auto)"
    explicit = plan(Admitter(ServerConfig(prefill_backend="ridgefill", maps="m", cache_mode="namespace"), FACTS,
                             policy=_policy('policy "probe" { split 12 select top(probe(rows=64), 10%) }')), None)
    assert explicit.cache_mode == "namespace" and not explicit.reselects  # it keeps the first question's rows
    no_policy = Admitter(ServerConfig(prefill_backend="ridgefill", maps="m"), FACTS)
    assert plan(no_policy, None).cache_mode == "namespace"


def test_auto_never_shares_where_namespace_is_refused_or_useless():
    pd = ServerFacts(num_layers=24, maps_splits=(12,), default_split=12, pd_prefill=True)
    hybrid = ServerFacts(num_layers=24, maps_splits=(12,), default_split=12, recurrent_layers=(0, 1, 2))
    context = ServerFacts(num_layers=24, maps_splits=(12,), default_split=12, maps_context=True)  # reuses nothing
    for facts in (pd, hybrid, context):
        admitter = Admitter(ServerConfig(prefill_backend="ridgefill", maps="m"), facts, policy=BARE)
        assert plan(admitter, None).cache_mode == "no_insert" and admitter.default_cache_mode() == "no_insert (auto)"


def test_an_explicit_cache_mode_beats_auto():
    for mode in ("no_insert", "namespace"):
        flag = Admitter(ServerConfig(prefill_backend="ridgefill", maps="m", cache_mode=mode), FACTS, policy=BARE)
        assert plan(flag, None).cache_mode == mode and flag.default_cache_mode() == mode
    written = _policy('policy "kept" { split 12 cache no_insert }')
    assert plan(Admitter(ServerConfig(prefill_backend="ridgefill", maps="m"), FACTS, policy=written), None).cache_mode == "no_insert"


def test_the_startup_cache_mode_follows_the_arm_with_kv_context_maps():
    """The startup line and admission resolve ``auto`` alike: kv+context maps keep a RidgeFill plan's KV out,
    but an identity-arm server fills without them and shares."""
    context = ServerFacts(num_layers=24, maps_splits=(12,), default_split=12, maps_context=True)
    for arm in ("ridgefill", "identity"):
        admitter = Admitter(ServerConfig(prefill_backend="ridgefill", maps="m", arm=arm), context, policy=BARE)
        assert admitter.default_cache_mode().split()[0] == plan(admitter, None).cache_mode


def test_a_selection_that_reads_sentences_needs_the_servers_tokenizer():
    """attention_topk reads the tokens only with sentence=M: a server without a tokenizer serves the pooled
    selection and refuses, naming why, the one that takes sentences whole."""
    admitter = _admitter()
    pooled = _policy('policy "p" { split 12 select attention_topk(pool=8) budget 10% }')
    sentences = _policy('policy "s" { split 12 select attention_topk(pool=8, sentence=32) budget 10% }')
    admitter.check_policy(pooled, 12)
    with pytest.raises(RequestParamError, match="policy 's' reads the tokenizer's tokens"):
        admitter.check_policy(sentences, 12)
    _admitter(ServerFacts(num_layers=24, maps_splits=(12, 16), maps_id="m", default_split=12,
                          has_tokenizer=True)).check_policy(sentences, 12)


LONG = _policy('policy "long" { split 12 split 16 from 8192 tokens tail 1024 select attention_topk(q=64, share=10%) }')


def test_a_length_schedule_picks_each_prompts_split_below_the_request_and_the_flag():
    admitter = Admitter(ServerConfig(prefill_backend="ridgefill", maps="m"), FACTS, policy=LONG)
    assert [plan(admitter, None, prompt_tokens=n).split for n in (4096, 8191, 8192, 30000)] == [12, 12, 16, 16]
    assert plan(admitter, None).split == 12  # length unknown: the base split
    assert plan(admitter, {"split": 12}, prompt_tokens=30000).split == 12  # the request's own value wins
    flagged = Admitter(ServerConfig(prefill_backend="ridgefill", maps="m", split=12), FACTS, policy=LONG)
    assert plan(flagged, None, prompt_tokens=30000).split == 12  # so does the server flag
    # Different splits fill different KV: the namespaces differ.
    assert plan(admitter, None, prompt_tokens=4096).namespace != plan(admitter, None, prompt_tokens=30000).namespace


def test_a_server_policy_is_checked_at_every_split_of_its_schedule():
    facts = ServerFacts(num_layers=24, maps_splits=(12,), maps_id="m", default_split=12)
    admitter = Admitter(ServerConfig(prefill_backend="ridgefill", maps="m"), facts, policy=LONG)
    with pytest.raises(RequestParamError, match=r"policy 'long' runs prompts of at least 8192 tokens at split 16, "
                                                r"but the maps folder has splits \[12\]"):
        admitter.check_server_policy()
    Admitter(ServerConfig(prefill_backend="ridgefill", maps="m"), FACTS, policy=LONG).check_server_policy()
    assert Admitter(ServerConfig(prefill_backend="ridgefill", maps="m"), FACTS, policy=LONG).split_summary() == \
        "12 (16 from 8192 tokens)"
    assert _admitter().split_summary() == "16"
    assert Admitter(ServerConfig(prefill_backend="ridgefill", maps="m", split=12), FACTS, policy=LONG).split_summary() == "12"


def test_request_facts_count_the_prompt():
    class Recv:
        input_ids = list(range(300))

    assert RequestFacts.of(Recv()).prompt_tokens == 300
