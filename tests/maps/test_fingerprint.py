from __future__ import annotations

import torch

from sgl_ridgefill.maps import compare_fingerprints, model_fingerprint, tokenizer_fingerprint
from sgl_ridgefill.maps.fingerprint import WEIGHTS_CLOSE, sketch_distance

from .helpers import config, fingerprint, weights


def test_same_weights_in_float32_hash_like_bf16():
    embed, norm = weights()
    fp_bf16 = model_fingerprint(config(), embed, norm)
    fp_f32 = model_fingerprint(config(), embed.float(), norm.float())
    assert fp_bf16["weights"]["sha256"] == fp_f32["weights"]["sha256"]
    assert fp_f32["weights"]["dtype"] == "float32"
    assert compare_fingerprints(fp_bf16, fp_f32) == ([], [])


def test_padded_embedding_rows_are_ignored():
    embed, norm = weights()
    padded = torch.cat([embed, torch.zeros(64, embed.shape[1], dtype=embed.dtype)])
    assert model_fingerprint(config(), padded, norm) == model_fingerprint(config(), embed, norm)


def test_a_changed_weight_in_the_first_rows_changes_the_checksum():
    embed, norm = weights()
    changed = embed.clone()
    changed[3, 5] += 0.25
    assert model_fingerprint(config(), changed, norm)["weights"]["sha256"] != fingerprint()["weights"]["sha256"]


def test_requantised_weights_warn_with_distance():
    embed, norm = weights()
    g = torch.Generator().manual_seed(7)
    noisy = embed.float() * (1 + 0.02 * torch.randn(embed.shape, generator=g))
    expected, actual = fingerprint(), model_fingerprint(config(), noisy, norm.float())
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
    assert errors == [
        f"model weights: checksum differs and the weights are far apart (relative sketch distance {distance:.0%}); "
        "the served model is not the one the maps were fitted on"
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


def test_keys_known_to_one_side_only_are_not_compared():
    expected = fingerprint()
    actual = {k: v for k, v in fingerprint().items() if k != "intermediate_size"}
    assert compare_fingerprints(expected, actual) == ([], [])


def test_head_dim_defaults_to_hidden_over_heads():
    assert fingerprint()["head_dim"] == 48 // 4
    assert fingerprint(head_dim=32)["head_dim"] == 32


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
