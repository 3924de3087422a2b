"""A map kind carries its behaviour: its calibration target, what serving does with its prediction, and where it
cannot serve (the fill, calibration and the startup checks ask the kind)."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest
import torch

from sgl_ridgefill.maps.kinds import MAP_KINDS, rms_normalise

KV_DIM, HEADS, HEAD_DIM = 4, 2, 2


class _Adapter:
    """What a kind asks of the served model: its shapes, the layer's K/V from an input, and RoPE on a key."""

    shape = SimpleNamespace(kv_dim=KV_DIM, num_kv_heads=HEADS, head_dim=HEAD_DIM)

    def key_value(self, layer_id, positions, x):
        return ("from input", layer_id, x), None

    def value(self, layer_id, x):
        return ("value from input", layer_id, x)

    def rope_key(self, layer_id, positions, k):
        return k * 10  # stands for the K norm and RoPE


def test_targets_per_kind():
    x = torch.randn(5, 8)
    project = lambda t: t[:, : 2 * KV_DIM] + 1  # noqa: E731 - stands for the layer's [W_k; W_v]
    assert torch.equal(MAP_KINDS["residual"].target_of(x), x)
    assert torch.equal(MAP_KINDS["normalised"].target_of(x), rms_normalise(x))
    for name in ("kv", "kv+context"):
        assert torch.equal(MAP_KINDS[name].target_of(x, project), project(x))
        with pytest.raises(ValueError, match=re.escape(f"{name} maps predict K and V: their target needs")):
            MAP_KINDS[name].target_of(x)
    assert [k.name for k in MAP_KINDS.values() if k.scale_free_target] == ["normalised"]


def test_serving_a_prediction_per_kind():
    adapter, positions = _Adapter(), torch.arange(3)
    for name in ("residual", "normalised"):  # the layer's input: its own norm and projections write K and V
        y = torch.randn(3, 8)
        (how, layer, given), _ = MAP_KINDS[name].key_value(adapter, 7, positions, y)
        assert how == "from input" and layer == 7 and given is y
        assert MAP_KINDS[name].value(adapter, 7, y)[2] is y
    for name in ("kv", "kv+context"):  # K then V: K through the layer's RoPE, V reshaped into heads
        y = torch.arange(3 * 2 * KV_DIM, dtype=torch.float32).reshape(3, 2 * KV_DIM)
        k, v = MAP_KINDS[name].key_value(adapter, 7, positions, y)
        assert torch.equal(k, y[:, :KV_DIM] * 10)
        assert torch.equal(v, y[:, KV_DIM:].reshape(3, HEADS, HEAD_DIM))
        assert torch.equal(MAP_KINDS[name].value(adapter, 7, y), v)


def test_where_a_kind_cannot_serve():
    for name, kind in MAP_KINDS.items():
        assert kind.refusal() is None
        if kind.predicts_kv:
            assert "Gated DeltaNet" in kind.refusal(hybrid=True)
            assert "2-way shards" in kind.refusal(tp_size=2)
        else:
            assert kind.refusal(hybrid=True) is None and kind.refusal(tp_size=2) is None
