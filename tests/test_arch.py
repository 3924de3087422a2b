"""One architecture table (sgl_ridgefill/arch.py): the adapters, the patched forwards, calibration's supported
list, the profile phases, hybrid detection and the FLOP model's gated attention all come from it."""

from __future__ import annotations

import json

from sgl_ridgefill import arch


def test_every_list_of_architectures_is_derived_from_the_table(tmp_path):
    from sgl_ridgefill import patches
    from sgl_ridgefill.bench import phases
    from sgl_ridgefill.tools.flops import ModelDims
    from sgl_ridgefill.calibration.capture import SUPPORTED_ARCHITECTURES
    from sgl_ridgefill.cpu.environment import is_hybrid_model
    from sgl_ridgefill.runtime.adapter import SUPPORTED_ARCHITECTURES as DENSE
    from sgl_ridgefill.runtime.hybrid_adapter import INTERLEAVED

    classes = {f.hf_class for f in arch.FAMILIES}
    assert set(DENSE) | set(arch.HYBRID_ARCHITECTURES) == classes and not set(DENSE) & set(arch.HYBRID_ARCHITECTURES)
    assert set(SUPPORTED_ARCHITECTURES) == classes
    assert set(patches.MODEL_FORWARDS) == {f"sglang.srt.models.{f.sglang_module}.{f.hf_class}.forward" for f in arch.FAMILIES}
    frames = {frame for frame, _ in phases.PHASES}
    assert all(f"{f.hf_class}.forward" in frames and f"{f.inner_model}.forward" in frames for f in arch.FAMILIES)
    assert INTERLEAVED == ("qwen3_next",)
    for f in arch.FAMILIES:
        folder = tmp_path / f.name
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps({"model_type": f.model_types[0]}))
        assert is_hybrid_model(folder) is f.hybrid
    base = dict(num_hidden_layers=4, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                intermediate_size=128, vocab_size=100)
    gated = {f.name: ModelDims.from_hf_config({**base, "model_type": f.model_types[0]}).attn_output_gate
             for f in arch.FAMILIES if not f.hybrid}
    assert not any(gated.values())
