"""The recurrent (Gated DeltaNet) states of a request around a RidgeFill chunk that fails: the exact fallback
runs the chunk again, so the states must be back where the chunk started (engine-free, with a fake pool)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from sgl_ridgefill.runtime import recurrent


class _Cache:
    def __init__(self, slots: int):
        self.conv = [torch.zeros(slots, 3, 4)]
        self.temporal = torch.zeros(slots, 2, 4, 4)


def _ctx(layers=(1, 2), slots=3):
    caches = {l: _Cache(slots) for l in layers}
    pool = SimpleNamespace(get_mamba_indices=lambda idx: idx + 1, mamba2_layer_cache=lambda l: caches[l])
    ctx = SimpleNamespace(adapter=SimpleNamespace(recurrent_layers=tuple(layers)),
                          backend=SimpleNamespace(req_to_token_pool=pool))
    fb = SimpleNamespace(req_pool_indices=torch.tensor([0, 1]))
    return ctx, fb, caches


def _advance(caches, slot):
    for cache in caches.values():
        cache.conv[0][slot] += 1.0
        cache.temporal[slot] += 2.0


def test_a_failed_chunk_leaves_the_states_it_found():
    ctx, fb, caches = _ctx()
    _advance(caches, 2)  # request 1 sits in slot 2 with some history
    before = {l: (c.conv[0][2].clone(), c.temporal[2].clone()) for l, c in caches.items()}
    with pytest.raises(RuntimeError), recurrent.restored_on_failure(ctx, fb, 1):
        _advance(caches, 2)  # the lower pass advanced the states over the chunk's rows
        raise RuntimeError("RidgeFill failed")
    for l, c in caches.items():
        assert torch.equal(c.conv[0][2], before[l][0]) and torch.equal(c.temporal[2], before[l][1])


def test_a_chunk_that_succeeds_keeps_its_states():
    ctx, fb, caches = _ctx()
    with recurrent.restored_on_failure(ctx, fb, 1):
        _advance(caches, 2)
    assert all(float(c.temporal[2].max()) == 2.0 and float(c.conv[0][2].max()) == 1.0 for c in caches.values())
    assert all(float(c.temporal[1].abs().max()) == 0.0 for c in caches.values())  # other slots untouched


def test_dense_models_have_no_states_to_keep():
    ctx = SimpleNamespace(adapter=SimpleNamespace(recurrent_layers=()), backend=None)
    with recurrent.restored_on_failure(ctx, None, 0):
        pass
