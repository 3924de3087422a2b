from __future__ import annotations

import torch

from sgl_ridgefill.maps import compare_fingerprints, model_fingerprint, tokenizer_fingerprint
from sgl_ridgefill.maps.fingerprint import WEIGHTS_CLOSE, layer_distances, sketch_distance

from .helpers import config, fingerprint, layer_weights, weights


def test_same_weights_in_float32_hash_like_bf16():
    embed, norm = weights()
    layers = layer_weights()
    fp_bf16 = model_fingerprint(config(), embed, norm, layers)
    fp_f32 = model_fingerprint(config(), embed.float(), norm.float(), [tuple(t.float() for t in layer) for layer in layers])
    assert fp_bf16["weights"]["sha256"] == fp_f32["weights"]["sha256"]
    assert fp_f32["weights"]["dtype"] == "float32"
    assert fp_bf16["layers"] == fp_f32["layers"]
    assert compare_fingerprints(fp_bf16, fp_f32) == ([], [])


def test_padded_embedding_rows_are_ignored():
    embed, norm = weights()
    padded = torch.cat([embed, torch.zeros(64, embed.shape[1], dtype=embed.dtype)])
    assert model_fingerprint(config(), padded, norm, layer_weights()) == fingerprint()


def test_a_changed_weight_in_the_first_rows_changes_the_checksum():
    embed, norm = weights()
    changed = embed.clone()
    changed[3, 5] += 0.25
    assert model_fingerprint(config(), changed, norm)["weights"]["sha256"] != fingerprint()["weights"]["sha256"]


def test_requantised_weights_warn_with_distance():
    embed, norm = weights()
    g = torch.Generator().manual_seed(7)
    noisy = embed.float() * (1 + 0.02 * torch.randn(embed.shape, generator=g))
    expected, actual = fingerprint(), model_fingerprint(config(), noisy, norm.float(), layer_weights())
    distance = sketch_distance(expected["weights"], actual["weights"])
    assert 0 < distance < WEIGHTS_CLOSE
    errors, warnings = compare_fingerprints(expected, actual)
    assert errors == []
    assert warnings == [
        f"model weights: checksum differs but the weights are close (relative sketch distance {distance:.2%}); "
        "the served model (float32) looks re-quantised or converted from the one the maps were fitted on "
        "(bfloat16), so fills may be less accurate"
    ]


def test_other_weights_of_the_same_shape_are_an_error():
    expected, actual = fingerprint(seed=0), fingerprint(seed=1)
    distance = sketch_distance(expected["weights"], actual["weights"])
    assert distance > WEIGHTS_CLOSE
    errors, warnings = compare_fingerprints(expected, actual)
    assert warnings == []
    layers = layer_distances(expected["layers"], actual["layers"])
    assert errors == [
        f"model weights: checksum differs and the weights are far apart (relative sketch distance {distance:.0%}); "
        "the served model is not the one the maps were fitted on",
        f"model layers 0, 1, 2, 3: weights differ from the model the maps were fitted on (relative sketch distance "
        f"up to {max(layers):.0%}); the maps do not fit the served model",
    ]


def test_shape_mismatches_are_named_one_per_line():
    expected = fingerprint()
    actual = fingerprint(architectures=["LlamaForCausalLM"], num_hidden_layers=8)
    errors, warnings = compare_fingerprints(expected, actual)
    assert errors == [
        "model architecture: maps were fitted on 'Qwen2ForCausalLM', served model has 'LlamaForCausalLM'",
        "model num_hidden_layers: maps were fitted on 4, served model has 8",
    ]
    assert warnings == []


def test_a_key_the_manifest_lacks_is_an_error():
    expected = {k: v for k, v in fingerprint().items() if k != "intermediate_size"}
    assert compare_fingerprints(expected, fingerprint()) == ([
        "model intermediate_size: the maps folder's fingerprint does not record it; served model has 96"
    ], [])
    expected = {k: v for k, v in fingerprint().items() if k != "weights"}
    assert compare_fingerprints(expected, fingerprint()) == ([
        "model weights: the maps folder's fingerprint does not record them, so the weights cannot be checked"
    ], [])


def test_a_key_the_served_side_does_not_compute_is_not_compared():
    actual = {k: v for k, v in fingerprint().items() if k != "intermediate_size"}
    assert compare_fingerprints(fingerprint(), actual) == ([], [])


def test_tokenizer_keys_the_manifest_lacks():
    base = tokenizer_fingerprint(_Tokenizer({"a": 0, "b": 1}))
    errors, warnings = compare_fingerprints({k: v for k, v in base.items() if k not in ("vocab_sha256", "bos_token_id")}, base)
    assert errors == [
        f"tokenizer vocab_sha256: the maps folder's fingerprint does not record it; served tokenizer has {base['vocab_sha256']!r}"
    ]
    assert warnings == ["tokenizer bos_token_id: the maps folder's fingerprint does not record it; served tokenizer has 1"]


def test_weight_fingerprint_is_unchanged_by_per_layer_fingerprints():
    """Folders written before per-layer fingerprints keep matching: the embedding/norm part is as it was."""
    embed, norm = weights()
    assert model_fingerprint(config(), embed, norm)["weights"] == fingerprint()["weights"]
    assert fingerprint()["weights"]["sha256"] == "1c2dc2952319a3758adea4a3f24c302c9652d74e85dca8d8b5b3d21a0051a648"
    sketch = fingerprint()["weights"]["sketch"]
    assert (len(sketch), sketch[:2], sketch[-1]) == (4112, [-0.0441177, -0.0314142], 0.673763)


def test_head_dim_defaults_to_hidden_over_heads():
    assert fingerprint()["head_dim"] == 48 // 4
    assert fingerprint(head_dim=32, layers=False)["head_dim"] == 32


class _Tokenizer:
    def __init__(self, vocab, bos=1, eos=0):
        self._vocab = vocab
        self.bos_token_id = bos
        self.eos_token_id = eos

    def get_vocab(self):
        return dict(self._vocab)


def test_tokenizer_vocab_mismatch_is_an_error_and_special_ids_a_warning():
    vocab = {"a": 0, "b": 1, "c": 2}
    base = tokenizer_fingerprint(_Tokenizer(vocab))
    assert base["vocab_size"] == 3
    assert compare_fingerprints(base, tokenizer_fingerprint(_Tokenizer(dict(vocab)))) == ([], [])
    swapped = tokenizer_fingerprint(_Tokenizer({"a": 1, "b": 0, "c": 2}))
    errors, _ = compare_fingerprints(base, swapped)
    assert errors == [
        f"tokenizer vocab_sha256: maps were fitted on {base['vocab_sha256']!r}, served tokenizer has {swapped['vocab_sha256']!r}"
    ]
    errors, warnings = compare_fingerprints(base, tokenizer_fingerprint(_Tokenizer(vocab, eos=2)))
    assert errors == []
    assert warnings == ["tokenizer eos_token_id: maps were fitted on 0, served tokenizer has 2"]
