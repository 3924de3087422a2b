"""What each map kind costs per filled row and layer."""

from __future__ import annotations

from sgl_ridgefill.maps.kinds import MAP_KINDS


def test_fill_flops_count_the_map_and_the_projections_it_leaves_to_the_layer():
    hidden, kv_dim = 896, 128  # Qwen2.5-0.5B: 2 KV heads of 64
    cost = {name: kind.fill_flops(hidden, kv_dim) for name, kind in MAP_KINDS.items()}
    # residual / normalised: an 896x896 map, then the layer's K and V projections (896 -> 2 x 128);
    # kv: 896 -> 256 straight; kv+context: 2688 -> 256.
    assert cost == {"residual": 2_064_384, "normalised": 2_064_384, "kv": 458_752, "kv+context": 1_376_256}
