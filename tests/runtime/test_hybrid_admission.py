"""Admission and startup checks on a hybrid (Gated DeltaNet) model, and the terminal-state gate sums (no
engine needed)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from sgl_ridgefill.config import ServerConfig
from sgl_ridgefill.policy import MapsInfo, ModelInfo, compile_policy, parse_policy
from sgl_ridgefill.request_schema import RequestParamError
from sgl_ridgefill.runtime.admission import Admitter, RequestFacts, ServerFacts
from sgl_ridgefill.runtime.recurrent import GateSums
from tests.support.reference import HybridReference

MODEL = ModelInfo.hybrid(8, attention_every=4)
MAPS = MapsInfo(splits=(3,), default_split=3, num_layers=8)
RECURRENT = MODEL.recurrent_layers
TERMINAL = ("terminal_state.safetensors", 3, "ridgefill")
FACTS = ServerFacts(num_layers=8, maps_splits=(3,), maps_id="m", default_split=3, recurrent_layers=RECURRENT,
                    terminal_offsets=(TERMINAL,))


def _policy(text: str):
    return compile_policy(parse_policy(text), maps=MAPS, model=MODEL)


WITH_TERMINAL = _policy('policy "t" { arm ridgefill correct terminal_state(offsets="terminal_state.safetensors") }')
PLAIN = _policy('policy "plain" { arm ridgefill }')
NAMESPACE = _policy('policy "ns" { arm ridgefill cache namespace }')


def _admitter(policy=WITH_TERMINAL, facts=FACTS, **cfg) -> Admitter:
    return Admitter(ServerConfig(prefill_backend="ridgefill", maps="m", diagnostics=True, **cfg), facts, policy=policy,
                    policies={"plain": PLAIN, "ns": NAMESPACE}, )


def _plan(admitter, params=None):
    decision = admitter.admit({"ridgefill": params} if params is not None else None, RequestFacts())
    assert decision.plan is not None, decision.reason
    return decision.plan


def test_the_policy_toggle_turns_the_correction_on():
    assert _plan(_admitter()).terminal_state == "terminal_state.safetensors"
    assert _plan(_admitter(request_policies=("plain",)), {"policy": "plain"}).terminal_state is None
    assert _plan(_admitter(), {"arm": "nofill"}).terminal_state is None  # nothing filled enters a state


def test_offsets_the_maps_folder_lacks_are_refused():
    with pytest.raises(RequestParamError, match="split 3 and arm identity"):
        _plan(_admitter(), {"arm": "identity"})
    bare = ServerFacts(num_layers=8, maps_splits=(3,), default_split=3, recurrent_layers=RECURRENT)
    with pytest.raises(RequestParamError, match="calibrate terminal-state"):
        _plan(_admitter(facts=bare))


def test_namespace_cache_mode_is_refused_on_hybrids():
    with pytest.raises(RequestParamError, match="namespace is not available on hybrid"):
        _plan(_admitter(policy=PLAIN, request_policies=("ns",)), {"policy": "ns"})
    with pytest.raises(RequestParamError, match="namespace is not available on hybrid"):
        _plan(_admitter(policy=PLAIN, cache_mode="namespace"))
    dense = ServerFacts(num_layers=8, maps_splits=(3,), default_split=3)
    assert _plan(_admitter(policy=PLAIN, facts=dense, cache_mode="namespace")).cache_mode == "namespace"


def test_splice_is_refused_on_hybrids():
    with pytest.raises(RequestParamError, match="splice is not available on hybrid"):
        _plan(_admitter(policy=PLAIN), {"splice": "keys"})


def test_startup_refuses_namespace_and_missing_offsets():
    from sgl_ridgefill.runtime.factory import _recurrent_resources

    adapter = SimpleNamespace(recurrent_layers=RECURRENT)
    with pytest.raises(ValueError, match="namespace is not available on hybrid"):
        _recurrent_resources(adapter, ServerConfig(cache_mode="namespace"), None, None, {})
    with pytest.raises(ValueError, match="does not hold"):
        _recurrent_resources(adapter, ServerConfig(), None, WITH_TERMINAL, {"t": WITH_TERMINAL})
    assert _recurrent_resources(SimpleNamespace(recurrent_layers=()), ServerConfig(cache_mode="namespace"), None,
                                None, {}) is None


@pytest.mark.parametrize("cached", [False, True])
def test_gate_sums_equal_products_of_gates(cached):
    """ρ from running log-sum-exps over blocks equals the share of row weights computed from plain products
    of gates (the oracle's definition), exact rows included, a cached prefix included."""
    gen = torch.Generator().manual_seed(0)
    g = -torch.rand(90, 4, generator=gen) * torch.tensor([0.01, 0.1, 1.0, 5.0])
    filled = torch.rand(90, generator=gen) > 0.2
    sums = GateSums()
    for lo, hi in ((0, 30), (30, 31), (31, 90)):
        sums.add(5, g[lo:hi], filled[lo:hi])
    expected = HybridReference.rho(g, filled, cached=cached)
    torch.testing.assert_close(sums.rho(5, cached=cached), expected, atol=1e-6, rtol=1e-5)
    all_filled = GateSums()
    all_filled.add(5, g, torch.ones(90, dtype=torch.bool))
    torch.testing.assert_close(all_filled.rho(5, cached=False), torch.ones(4))
