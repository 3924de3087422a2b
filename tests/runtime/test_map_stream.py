"""Maps streamed from host memory (``--ridgefill-map-residence host``) on the CPU, where host and device are
both ``cpu``: the same code path as on a GPU, checked equal to resident maps."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from sgl_ridgefill.maps import MapsError
from sgl_ridgefill.maps.kinds import map_kind
from sgl_ridgefill.runtime.map_stream import StreamedMaps
from sgl_ridgefill.runtime.maps_store import MapsStore

D, LAYERS, SPLIT = 16, 6, 2


@pytest.mark.parametrize("slots", [2, 3, 5, 8])
def test_every_layer_taken_is_the_hosts_in_any_order(slots):
    a = torch.randn(5, 3, 4)
    b = torch.randn(5, 3)
    stream = StreamedMaps([a, b], "cpu", slots=slots)
    for j in [0, 1, 2, 3, 4, 0, 1, 3, 2, 4, 4, 0, 2, 1, 3]:
        got_a, got_b = stream.take(j)
        assert torch.equal(got_a, a[j]) and torch.equal(got_b, b[j])
        stream.done()
    with pytest.raises(IndexError):
        stream.take(5)
    held = min(slots, 5)
    assert stream.device_bytes == held * (3 * 4 + 3) * 4 and stream.host_bytes == a.nbytes + b.nbytes


@pytest.mark.parametrize("slots", [2, 3])
def test_in_order_each_layer_is_copied_once_per_sweep_ahead_of_use(slots):
    stream = StreamedMaps([torch.randn(4, 2, 2)], "cpu", slots=slots)
    assert stream.holds == list(range(slots))  # the first layers copy before the first fill asks for them
    for _ in range(3):  # three chunks' fills: layers 0..3 each time, the next chunk's first layers prefetched
        for j in range(4):
            assert j in stream.holds  # never copied on demand
            stream.take(j)
            stream.done()
    assert stream.copies == slots + 3 * 4  # the ring's first fill, then each layer once per sweep
    whole = StreamedMaps([torch.randn(4, 2, 2)], "cpu", slots=6)  # more slots than layers: each copied once
    for j in [*range(4), *range(4)]:
        whole.take(j)
        whole.done()
    assert whole.copies == 4 and len(whole.slots) == 4


def test_fewer_than_two_slots_are_refused():
    with pytest.raises(ValueError, match="at least 2 slots, got 1"):
        StreamedMaps([torch.randn(4, 2, 2)], "cpu", slots=1)


def _folder():
    g = torch.Generator().manual_seed(0)
    a = torch.randn(LAYERS - SPLIT, D, D, generator=g) * 0.1 + torch.eye(D)
    b = torch.randn(LAYERS - SPLIT, D, generator=g) * 0.01
    return SimpleNamespace(kind=map_kind("residual"), d_in=D, d_out=D, path="maps", manifest={"id": "m"},
                           load_split=lambda split, dtype, device: (a.to(dtype=dtype, device=device), b.to(device)))


@pytest.mark.parametrize("slots", [2, 3])
def test_host_residence_predicts_what_resident_maps_predict(slots):
    common = dict(dtype=torch.float32, device="cpu", hidden_size=D, kv_dim=D // 2)
    resident = MapsStore(_folder(), [SPLIT], **common)
    streamed = MapsStore(_folder(), [SPLIT], **common, residence="host", slots=slots)
    x = torch.randn(7, D)
    for layer in [*range(SPLIT, LAYERS), *range(SPLIT, LAYERS), 4, 3]:
        assert torch.equal(streamed.predict(SPLIT, layer, x), resident.predict(SPLIT, layer, x))
    assert streamed.resident_bytes == slots * (D * D + D) * 4  # the ring's layers on the device
    assert streamed.host_bytes == resident.resident_bytes == (LAYERS - SPLIT) * (D * D + D) * 4


def test_an_unknown_residence_is_named():
    with pytest.raises(MapsError, match="map residence must be one of device, host, got 'gpu'"):
        MapsStore(_folder(), [SPLIT], dtype=torch.float32, device="cpu", hidden_size=D, kv_dim=D // 2, residence="gpu")
