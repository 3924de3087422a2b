from __future__ import annotations

import json

import pytest
import torch

from sgl_ridgefill.calibration import CalibrationError, capture_layer_inputs, load_model, read_config


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
def test_capture_matches_hidden_states_of_a_full_forward(tiny_models, family):
    model, _, config = load_model(tiny_models[family], "float32")
    ids = torch.randint(0, 1000, (37,), generator=torch.Generator().manual_seed(0))
    captured = capture_layer_inputs(model, ids, [3, 1, 2])
    assert list(captured) == [3, 1, 2]
    with torch.no_grad():
        # hidden_states[l] is the input of layer l for l < L (the last entry is after the final norm).
        reference = model(ids[None], output_hidden_states=True).hidden_states
    for layer, x in captured.items():
        assert x.shape == (37, config["hidden_size"])
        assert torch.equal(x, reference[layer][0]), f"{family} layer {layer}"


def test_capture_stops_after_the_last_requested_layer(tiny_model):
    model, _, _ = load_model(tiny_model, "float32")
    ran = []
    handles = [layer.register_forward_hook(lambda m, a, o, i=i: ran.append(i)) for i, layer in enumerate(model.model.layers)]
    try:
        capture_layer_inputs(model, torch.arange(10), [1, 2])
    finally:
        for h in handles:
            h.remove()
    assert ran == [0, 1]  # layer 2's input is known before layer 2 runs
    assert not any(layer._forward_pre_hooks for layer in model.model.layers)


def test_bad_layers_and_shapes(tiny_model):
    model, _, _ = load_model(tiny_model, "float32")
    with pytest.raises(ValueError, match=r"layers \[4\] must lie in 0\.\.3"):
        capture_layer_inputs(model, torch.arange(5), [4])
    with pytest.raises(ValueError, match=r"input_ids must be \[n\]"):
        capture_layer_inputs(model, torch.arange(6).reshape(2, 3), [1])


def test_unsupported_architecture_is_refused(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"], "num_hidden_layers": 4}))
    with pytest.raises(CalibrationError) as info:
        read_config(tmp_path)
    assert str(info.value) == (
        f"--model {tmp_path}: architecture GPT2LMHeadModel is not supported; "
        "supported: LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, Qwen3_5ForCausalLM, Qwen3NextForCausalLM"
    )
    with pytest.raises(CalibrationError, match="no config.json"):
        read_config(tmp_path / "missing")
