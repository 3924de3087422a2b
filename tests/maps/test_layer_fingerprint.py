"""Per-layer fingerprints: a maps folder is bound to every decoder layer's norm and KV-head-0 rows."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from sgl_ridgefill.maps import MapsError, compare_fingerprints, load_maps, model_fingerprint, write_maps_folder
from sgl_ridgefill.maps.fingerprint import LAYER_SKETCH_DIM, WEIGHTS_CLOSE, hf_fingerprint_layers, layer_distances

from .helpers import hf_fingerprint, perturbed, tiny_llama


@pytest.fixture(scope="module")
def llama():
    return tiny_llama()


def _folder(tmp_path, model_fp):
    """A one-split maps folder (split 5 of 6 layers, d = 64) bound to ``model_fp``."""
    from sgl_ridgefill.maps import SplitMaps

    split = SplitMaps(5, torch.eye(64).unsqueeze(0), torch.zeros(1, 64), {"lambda": None})
    return load_maps(write_maps_folder(tmp_path / "maps", [split], model=model_fp))


def test_layers_are_the_input_norm_and_the_rows_of_kv_head_0(llama):
    layers = hf_fingerprint_layers(llama)
    assert len(layers) == 6
    for hf_layer, (norm, k, v) in zip(llama.model.layers, layers):
        assert norm is hf_layer.input_layernorm.weight
        assert torch.equal(k, hf_layer.self_attn.k_proj.weight[:16]) and k.shape == (16, 64)
        assert torch.equal(v, hf_layer.self_attn.v_proj.weight[:16]) and v.shape == (16, 64)


def test_layer_fingerprint_is_small_and_json_safe(llama):
    fp = hf_fingerprint(llama)
    layers = fp["layers"]
    assert set(layers) == {"count", "sha256", "digests", "sketch"}
    assert layers["count"] == 6 and len(layers["sha256"]) == 64
    assert len(layers["digests"]) == 6 and all(len(d) == 16 for d in layers["digests"])
    assert [len(s) for s in layers["sketch"]] == [3 * LAYER_SKETCH_DIM] * 6
    assert json.loads(json.dumps(fp)) == fp
    assert len(json.dumps(layers)) < 6 * 400


def test_layer_5_k_projection_change_is_refused_naming_the_layer(llama, tmp_path):
    """A fine-tune that leaves the embeddings and every norm untouched."""
    tuned = copy.deepcopy(llama)
    with torch.no_grad():
        tuned.model.layers[5].self_attn.k_proj.weight.normal_(std=0.02, generator=torch.Generator().manual_seed(5))
    expected, actual = hf_fingerprint(llama), hf_fingerprint(tuned)
    assert actual["weights"] == expected["weights"]
    distances = layer_distances(expected["layers"], actual["layers"])
    assert distances[:5] == [0.0] * 5 and distances[5] > WEIGHTS_CLOSE
    folder = _folder(tmp_path, expected)
    with pytest.raises(MapsError) as info:
        folder.check_model(actual)
    assert str(info.value) == (
        f"maps folder {folder.path} does not match the served model: model layer 5: weights differ from the model "
        f"the maps were fitted on (relative sketch distance {distances[5]:.0%}); the maps do not fit the served model"
    )
    assert folder.check_model(hf_fingerprint(llama)) == []


def test_another_model_names_the_first_differing_layers(llama):
    other = tiny_llama(seed=1)
    expected, actual = hf_fingerprint(llama), hf_fingerprint(other)
    distances = layer_distances(expected["layers"], actual["layers"])
    assert min(distances) > WEIGHTS_CLOSE
    errors, warnings = compare_fingerprints(expected, actual)
    assert warnings == []
    assert errors[1] == (
        f"model layers 0, 1, 2, 3 and 2 more: weights differ from the model the maps were fitted on (relative sketch "
        f"distance up to {max(distances):.0%}); the maps do not fit the served model"
    )
    assert errors[0].startswith("model weights: checksum differs and the weights are far apart")


def test_float32_and_bf16_loads_of_one_checkpoint_match_exactly(llama, tmp_path):
    from transformers import AutoModelForCausalLM

    copy.deepcopy(llama).to(torch.bfloat16).save_pretrained(tmp_path / "ckpt")
    f32 = AutoModelForCausalLM.from_pretrained(tmp_path / "ckpt", dtype=torch.float32)
    bf16 = AutoModelForCausalLM.from_pretrained(tmp_path / "ckpt", dtype=torch.bfloat16)
    assert f32.model.layers[0].self_attn.k_proj.weight.dtype == torch.float32
    fp32, fp16 = hf_fingerprint(f32), hf_fingerprint(bf16)
    assert fp32["layers"] == fp16["layers"]
    assert fp32["weights"]["sha256"] == fp16["weights"]["sha256"]
    assert compare_fingerprints(fp32, fp16) == ([], [])
    # A float32 checkpoint rounds to the same bf16 values as its bf16 load.
    assert hf_fingerprint(llama)["layers"] == fp16["layers"]


def test_requantised_copy_warns_naming_the_layers(llama, tmp_path):
    requantised = perturbed(llama, 0.01, seed=3)
    expected, actual = hf_fingerprint(llama), hf_fingerprint(requantised)
    distances = layer_distances(expected["layers"], actual["layers"])
    assert all(0 < d < WEIGHTS_CLOSE for d in distances)
    warnings = _folder(tmp_path, expected).check_model(actual)
    assert len(warnings) == 2
    assert warnings[0].startswith("model weights: checksum differs but the weights are close")
    assert warnings[1] == (
        f"model layers 0, 1, 2, 3 and 2 more: checksum differs but the weights are close (relative sketch distance up "
        f"to {max(distances):.2%}); the served model looks re-quantised, converted or lightly fine-tuned from the one "
        "the maps were fitted on, so fills may be less accurate"
    )


def test_one_close_layer_is_named_alone(llama):
    tuned = perturbed(llama, 0.01, seed=4, only={"model.layers.2.self_attn.v_proj.weight"})
    expected, actual = hf_fingerprint(llama), hf_fingerprint(tuned)
    distance = layer_distances(expected["layers"], actual["layers"])[2]
    assert compare_fingerprints(expected, actual) == ([], [
        f"model layer 2: checksum differs but the weights are close (relative sketch distance {distance:.2%}); the "
        "served model looks re-quantised, converted or lightly fine-tuned from the one the maps were fitted on, so "
        "fills may be less accurate"
    ])


def test_old_manifest_without_layers_still_loads_with_a_warning(llama, tmp_path):
    served = hf_fingerprint(llama)
    old = {k: v for k, v in served.items() if k != "layers"}
    folder = _folder(tmp_path, old)
    assert folder.check_model(served) == [
        "model layers: the maps folder records no per-layer fingerprint (written by an older sgl-ridgefill), so only "
        "the embeddings and final norm were checked against the served model; record one with `sgl-ridgefill "
        "calibrate fingerprint --maps MAPS --model MODEL`"
    ]


def test_served_fingerprint_without_layers_is_refused(llama):
    expected = hf_fingerprint(llama)
    served = {k: v for k, v in expected.items() if k != "layers"}
    assert compare_fingerprints(expected, served) == ([
        "model layers: the maps folder records a per-layer fingerprint but the served model's fingerprint has none, "
        "so the layers cannot be checked"
    ], [])


def test_layer_count_mismatch_is_an_error(llama):
    expected = hf_fingerprint(llama)
    layers = hf_fingerprint_layers(llama)[:4]
    served = model_fingerprint(llama.config.to_dict(), llama.model.embed_tokens.weight, llama.model.norm.weight, layers)
    assert compare_fingerprints(expected, served) == ([
        "model layers: the maps folder fingerprints 6 layers, the served model's fingerprint has 4"
    ], [])


def test_layer_tensors_of_the_wrong_shape_are_refused(llama):
    cfg, embed, norm = llama.config.to_dict(), llama.model.embed_tokens.weight, llama.model.norm.weight
    layers = hf_fingerprint_layers(llama)
    whole_kv = [(n, layer.self_attn.k_proj.weight, v) for (n, _, v), layer in zip(layers, llama.model.layers)]
    with pytest.raises(ValueError) as info:
        model_fingerprint(cfg, embed, norm, whole_kv)
    assert str(info.value) == (
        "layers[0]: k_rows has shape (32, 64), expected (16, 64) (head_dim rows of KV head 0 by hidden_size)"
    )
    short_norm = [(n[:32], k, v) for n, k, v in layers]
    with pytest.raises(ValueError) as info:
        model_fingerprint(cfg, embed, norm, short_norm)
    assert str(info.value) == "layers[0]: input_norm_weight has shape (32,), expected (64,)"


@pytest.mark.parametrize("family", ["qwen2", "qwen3"])
def test_qwen_families_fingerprint_their_kv_head_0_rows(family):
    from transformers import AutoModelForCausalLM

    from sgl_ridgefill.tools.synthetic import _tiny_config as _config

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(_config(family, 2, 64, 300, False), dtype=torch.float32)
    layers = hf_fingerprint_layers(model)
    assert [tuple(k.shape) for _, k, _ in layers] == [(16, 64)] * 2
    assert torch.equal(layers[1][2], model.model.layers[1].self_attn.v_proj.weight[:16])
    assert hf_fingerprint(model)["layers"]["count"] == 2
