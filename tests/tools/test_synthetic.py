"""Random-weight benchmark artifacts of a Gated DeltaNet hybrid shape (no engine)."""

from __future__ import annotations

import json

from sgl_ridgefill.tools.flops import ModelDims
from sgl_ridgefill.tools.synthetic import RandomModelShape, make_model_and_maps
from sgl_ridgefill.maps import load_maps


def test_qwen35_shape_makes_a_servable_hybrid_and_maps(tmp_path):
    shape = RandomModelShape(num_layers=8, hidden_size=64, num_heads=2, num_kv_heads=1, intermediate_size=128,
                             vocab_size=256, tie_word_embeddings=False, family="qwen3_5", head_dim=32,
                             linear_key_heads=2, linear_value_heads=4, linear_head_dim=16)
    model_dir, maps_dir = make_model_and_maps(tmp_path, shape, split=3)
    config = json.loads((model_dir / "config.json").read_text())
    assert config["architectures"] == ["Qwen3_5ForCausalLM"] and config["full_attention_interval"] == 4
    dims = ModelDims.from_hf_config(config)
    assert dims.kinds() == ("gdn", "gdn", "gdn", "attention") * 2 and dims.linear.conv_dim == 2 * 32 + 64
    folder = load_maps(maps_dir)
    assert folder.layers(3) == tuple(range(3, 8)) and folder.manifest["model"]["layers"]["count"] == 8
