"""Resolution of defaults, checks against maps and model, identities and warnings."""

from __future__ import annotations

import pytest

from sgl_ridgefill.policy import DEFAULT_TAIL, MapsInfo, ModelInfo, PolicyError, compile_policy
from sgl_ridgefill.selectors.base import AttentionRequirement, ProbeRequirement

from .helpers import parse

MAPS = MapsInfo((12, 16), 16, 32)


def c(text, **targets):
    return compile_policy(parse(text), **targets)


def test_defaults():
    p = c('policy "p" { split 12 }')
    assert (p.name, p.arm, p.split, p.tail, p.cache_mode) == ("p", "ridgefill", 12, 1024, "auto")
    assert DEFAULT_TAIL == 1024
    assert p.value_rescale_c is None and p.terminal_state is None and p.requirements == ()
    assert not p.has_selection() and not p.needs_tokens and not p.needs_token_counts


def test_split_defaults_to_the_maps_folder():
    assert c('policy "p" {}', maps=MAPS).split == 16
    assert c('policy "p" { split 12 }', maps=MAPS).split == 12


def test_split_from_the_maps_can_be_left_for_serving():
    # `policy check` without --maps: the split is the maps folder's business, decided at serve time.
    assert c('policy "p" {}', defer_split=True).split is None
    assert c('policy "p" { split 12 }', defer_split=True).split == 12
    assert c('policy "p" {}', maps=MAPS, defer_split=True).split == 16
    assert c('policy "p" { arm exact }', defer_split=True).split == 0
    # Selection and corrections that need the split are still checked as far as the text allows.
    p = c('policy "p" { tail 1024 select attention_topk() correct value_rescale(c=512) }', defer_split=True)
    assert p.split is None and p.value_rescale_c == 512 and p.has_selection()
    # Serving compiles without defer_split: no split and no maps folder is refused.
    with pytest.raises(PolicyError, match="split is not set and there is no maps folder"):
        c('policy "p" {}')


def test_arms_without_maps_need_no_split_in_the_folder():
    assert c('policy "p" { arm identity split 14 }', maps=MAPS).split == 14
    assert c('policy "p" { arm nofill split 14 }', maps=MAPS).split == 14
    # Split = L runs every layer exactly: nothing needs a map.
    assert c('policy "p" { split 32 }', maps=MAPS).split == 32


def test_exact_arm_split():
    assert c('policy "p" { arm exact }', model=ModelInfo.dense(24)).split == 24
    assert c('policy "p" { arm exact }').split == 0


def test_requirements_are_resolved_against_split_and_model():
    hybrid = ModelInfo.hybrid(64, attention_every=4)
    p = c('policy "p" { split 16 select probe(rows=128) budget 10% plus attention_topk(q=32, query="before_tail") }', model=hybrid)
    assert p.requirements == (ProbeRequirement(128), AttentionRequirement((3, 7, 11, 15), "before_tail", 32))
    # The same selector twice is one requirement.
    p = c('policy "p" { split 12 select attention_topk() | top(attention_topk(share=50%), 10) }')
    assert p.requirements == (AttentionRequirement((3, 7, 11), "last", 64),)


def test_token_needs():
    assert c('policy "p" { split 12 select digits() }').needs_tokens
    p = c('policy "p" { split 12 select protected_classes() }')
    assert p.needs_tokens and p.needs_token_counts
    # attention_topk reads the token table only to find sentences.
    assert not c('policy "p" { split 12 select attention_topk(pool=8) }').needs_tokens
    assert c('policy "p" { split 12 select attention_topk(pool=8, sentence=48) }').needs_tokens


def test_identity_ignores_comments_but_not_meaning():
    base = c('policy "p" { split 12 }').identity
    assert len(base) == 16
    assert c('# note\npolicy "p" {\n  split 12  # why\n}\n').identity == base
    assert c('policy "p" { split 16 }').identity != base
    assert c('policy "p" { split 12 tail 2048 }').identity != base
    # The same text resolving to another default split is another identity.
    assert c('policy "p" {}', maps=MapsInfo((12,), 12, 32)).identity != c('policy "p" {}', maps=MAPS).identity


def test_warnings():
    llama = ModelInfo.dense(32)
    (warning,) = c('policy "p" { split 12 }', model=llama).warnings
    assert warning.startswith("split 12 is shallower than half of 32 layers on a model without QK-norm")
    assert c('policy "p" { split 16 }', model=llama).warnings == ()
    assert c('policy "p" { split 12 }', model=ModelInfo.dense(32, has_qk_norm=True)).warnings == ()
    assert c('policy "p" { split 12 select attention_topk() }', model=llama).warnings == ()
    (warning,) = c('policy "p" { split 16 select attention_topk() cache namespace }').warnings
    assert "attention_topk() chooses rows by the question" in warning
    assert c('policy "p" { split 16 select attention_topk(query="before_tail") cache namespace }').warnings == ()


def test_maps_and_model_must_agree():
    with pytest.raises(PolicyError, match="fitted on a 32-layer model, but this model has 24 layers"):
        c('policy "p" { split 12 }', maps=MAPS, model=ModelInfo.dense(24))


def test_value_rescale_needs_upper_attention():
    text = 'policy "p" { split 8 tail 64 correct value_rescale(c=16) }'
    assert c(text, model=ModelInfo.dense(12)).value_rescale_c == 16
    with pytest.raises(PolicyError, match="no attention layer at or above split 8"):
        c(text, model=ModelInfo(12, (0, 1, 2), tuple(range(3, 12))))


def test_terminal_state_needs_filled_recurrent_layers():
    text = 'policy "p" { split 24 correct terminal_state() }'
    p = c(text, model=ModelInfo.hybrid(48, attention_every=4))
    assert p.terminal_state.offsets == "terminal_state.safetensors"
    with pytest.raises(PolicyError, match="no recurrent layer is at or above split 24"):
        c(text, model=ModelInfo(48, tuple(range(24, 48)), tuple(range(24))))


def test_target_descriptions_validate():
    with pytest.raises(ValueError, match="default_split 5 is not one of the splits"):
        MapsInfo((12,), 5, 32)
    with pytest.raises(ValueError, match=r"MapsInfo.splits must be layer indices in \[0, 32\)"):
        MapsInfo((40,), 40, 32)
    with pytest.raises(ValueError, match="layer 3 is listed as both attention and recurrent"):
        ModelInfo(8, (3,), (3,))
    assert ModelInfo.hybrid(8, attention_every=4).attention_layers == (3, 7)
