"""The maps store applies its maps with the backend measured for their shape (no engine needed)."""

from __future__ import annotations

import pytest
import torch

from sgl_ridgefill.kernels.choose import MapBackendChoice
from sgl_ridgefill.kernels.map_apply import apply_map, apply_map_int8
from sgl_ridgefill.kernels.quant import quantize_int8_groupwise
from sgl_ridgefill.maps.kinds import map_kind
from sgl_ridgefill.runtime import maps_store
from sgl_ridgefill.runtime.maps_store import MapsStore

D, UPPER, GROUP = 64, 3, 32


class _Folder:
    """The reader's interface: two splits of random maps, float and int8."""

    path, d_in, d_out, kind = "maps", D, D, map_kind("residual")

    def __init__(self) -> None:
        gen = torch.Generator().manual_seed(0)
        self.a = torch.randn(UPPER, D, D, generator=gen) / D**0.5
        self.b = torch.randn(UPPER, D, generator=gen)

    def load_split(self, split, *, dtype, device):
        return self.a.to(device, dtype), self.b.to(device, dtype)

    def load_split_int8(self, split):
        pairs = [quantize_int8_groupwise(self.a[i], GROUP) for i in range(UPPER)]
        return torch.stack([p[0] for p in pairs]), torch.stack([p[1] for p in pairs]), self.b, GROUP


@pytest.fixture()
def chooser(monkeypatch: pytest.MonkeyPatch) -> list[tuple]:
    calls = []

    def fake(map_dtype, d_in, d_out, *, device, x_dtype=None, group_size=None):
        calls.append((map_dtype, d_in, d_out, str(device), x_dtype, group_size))
        return MapBackendChoice("torch", "shape", {"torch": {8: 1.0}}, {})

    monkeypatch.setattr(maps_store, "fastest_map_backend", fake)
    return calls


def test_float_maps_use_the_measured_backend(chooser: list[tuple]) -> None:
    store = MapsStore(_Folder(), [12, 20], dtype=torch.bfloat16, device="cpu", hidden_size=D, kv_dim=D // 4,
                      compute_dtype=torch.bfloat16)
    assert chooser == [(torch.bfloat16, D, D, "cpu", torch.bfloat16, None)] * 2  # per split; cached in choose
    x = torch.randn(9, D).bfloat16()
    a, b = store._maps[20]
    assert torch.equal(store.predict(20, 21, x), apply_map(x, a[1], b[1], backend="torch"))


def test_int8_maps_use_the_measured_backend(chooser: list[tuple]) -> None:
    store = MapsStore(_Folder(), [12], dtype=torch.int8, device="cpu", hidden_size=D, kv_dim=D // 4,
                      compute_dtype=torch.bfloat16)
    assert chooser == [(torch.int8, D, D, "cpu", torch.bfloat16, GROUP)]
    x = torch.randn(9, D).bfloat16()
    q, scale, b, _ = store._maps[12]
    want = apply_map_int8(x, q[2], scale[2], b[2].bfloat16(), GROUP, backend="torch")
    assert torch.equal(store.predict(12, 14, x), want)


def test_on_cpu_the_reference_is_measured_free() -> None:
    store = MapsStore(_Folder(), [12], dtype=torch.float32, device="cpu", hidden_size=D, kv_dim=D // 4)
    assert store._backends == {12: "reference"}
