"""The fill and the selection's device side with every tensor on PyTorch's ``meta`` device (no data: a
host/device mix or a data-dependent op raises, naming its site): each map kind's features, context carried
across chunks, the map applied (float and int8), and the attention statistics the selection reads, gathered
from the pool as the server does, at the Llama-3.1-8B shape."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from sgl_ridgefill.kernels.map_apply import apply_map, apply_map_int8
from sgl_ridgefill.maps.kinds import MAP_KINDS, features, map_kind
from sgl_ridgefill.runtime.selection import accumulate_statistics, attention_statistics
from sgl_ridgefill.selectors.base import AttentionRequirement

D, KV_DIM, HEADS, KV_HEADS, HEAD_DIM = 4096, 1024, 32, 8, 128
META = torch.device("meta")


@pytest.mark.parametrize("name", MAP_KINDS)
def test_each_kind_fills_two_chunks_on_the_device(name):
    kind = map_kind(name)
    d_in, d_out = kind.d_in(D), kind.d_out(D, KV_DIM)
    a = torch.empty(d_out, d_in, dtype=torch.bfloat16, device=META)
    b = torch.empty(d_out, dtype=torch.bfloat16, device=META)
    state = None
    for rows in (2048, 1536):  # a second chunk carries the first one's context
        x = torch.empty(rows, D, dtype=torch.bfloat16, device=META)
        z, state = features(kind, x, state)
        assert z.device == META and z.shape == (rows, d_in)
        if state is not None:
            assert state.last_u.device == state.mean.device == META
        y = apply_map(z.to(x.dtype), a, b, backend="torch")
        assert y.device == META and y.shape == (rows, d_out)


def test_int8_maps_apply_on_the_device():
    group = 128
    x = torch.empty(1024, D, dtype=torch.bfloat16, device=META)
    q = torch.empty(D, D, dtype=torch.int8, device=META)
    scale = torch.empty(D, D // group, dtype=torch.float32, device=META)
    b = torch.empty(D, dtype=torch.bfloat16, device=META)
    assert apply_map_int8(x, q, scale, b, group, backend="reference").device == META


def test_a_host_map_against_device_rows_is_refused_by_name():
    x = torch.empty(8, D, dtype=torch.bfloat16, device=META)
    with pytest.raises(Exception, match="apply_map"):
        apply_map(x, torch.zeros(D, D, dtype=torch.bfloat16), torch.zeros(D, dtype=torch.bfloat16), backend="torch")


def test_the_selection_statistics_gather_on_the_device():
    """``accumulate_statistics`` reads a chunk's captured queries and the pool's keys of one request, and
    ``attention_statistics`` hands their sums over: every tensor they make lives on the pool's device, and
    nothing reads device data."""
    n, boundary, q_rows = 16384, 12288, 64
    layers = (3, 7, 11)
    req = AttentionRequirement(query="last", q=q_rows, layers=layers)
    keys = {l: torch.empty(n + 64, KV_HEADS, HEAD_DIM, dtype=torch.bfloat16, device=META) for l in layers}
    pool = SimpleNamespace(get_key_buffer=lambda layer_id: keys[layer_id])
    adapter = SimpleNamespace(shape=SimpleNamespace(head_dim=HEAD_DIM),
                              attention=lambda layer_id: SimpleNamespace(scaling=HEAD_DIM**-0.5))
    queries = {(req, l): [torch.empty(q_rows, HEADS * HEAD_DIM, dtype=torch.bfloat16, device=META)] for l in layers}
    st = SimpleNamespace(num_tokens=n, boundary=boundary, start=0, queries=queries, attention={})
    slots = torch.empty(n, dtype=torch.int64, device=META)
    accumulate_statistics(SimpleNamespace(adapter=adapter, pool=pool), st, [req], slots, n - 2048, 2048)
    out = attention_statistics(st, [req], META)
    assert out[req].device == META and out[req].shape == (boundary,) and out[req].dtype == torch.float32
