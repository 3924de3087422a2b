"""Every shipped policy parses, compiles against its deployment, and says what the seeds say."""

from __future__ import annotations

import json

import pytest

from sgl_ridgefill.policy import (
    ModelInfo,
    PolicyError,
    builtin_policy_names,
    builtin_policy_path,
    compile_policy,
    list_builtin_policies,
    load_policy,
    resolve_policy_path,
)
from sgl_ridgefill.selectors.base import AttentionRequirement, ProbeRequirement
from sgl_ridgefill.shipped_maps import shipped_maps

from .helpers import deployment_for

ROWS_3_7_11 = (AttentionRequirement((3, 7, 11), "last", 64),)
# name -> (split, tail, value_rescale c, terminal_state, requirements), from the seeds' Table 4.
EXPECTED = {
    "llama-3.1-8b": (12, 4096, None, False, ()),
    "llama-3.1-8b-rows": (12, 4096, None, False, ROWS_3_7_11),
    "qwen3.5-9b": (12, 4096, None, False, ()),
    "qwen3.5-9b-rows": (12, 4096, None, False, ROWS_3_7_11),
    "qwen3-8b": (13, 4096, None, False, ()),
    "qwen3-8b-rows": (13, 4096, None, False, ROWS_3_7_11),
    "qwen3.8-27b": (16, 4096, 512, False, (ProbeRequirement(256), AttentionRequirement((3, 7, 11, 15), "last", 64))),
    "qwen3.8-flash-next-speed": (24, 2048, None, False, ()),
    "qwen3.8-flash-next-quality": (24, 2048, None, True, ()),
    "qwen2.5-0.5b-default": (12, 1024, None, False, ()),
    "qwen2.5-0.5b-rows": (12, 1024, None, False, ROWS_3_7_11 + (AttentionRequirement((3, 7, 11), "last", 1024),)),
    "qwen2.5-1.5b-rows": (14, 1024, None, False, ROWS_3_7_11 + (AttentionRequirement((3, 7, 11), "last", 1024),)),
    "plain": (15, 1024, None, False, ()),
}


def test_one_file_per_deployment():
    assert set(builtin_policy_names()) == set(EXPECTED)
    assert list_builtin_policies() == builtin_policy_names()


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_shipped_policy_compiles_against_its_deployment(name):
    model, maps = deployment_for(name)
    policy = compile_policy(load_policy(builtin_policy_path(name)), maps=maps, model=model)
    assert policy.name == name and policy.arm == "ridgefill"
    assert policy.cache_mode == ("no_insert" if name == "plain" else "auto")  # plain: the eval's fresh-fill control
    assert (policy.split, policy.tail, policy.value_rescale_c, policy.terminal_state is not None, policy.requirements) == EXPECTED[name]
    assert policy.has_selection() == (bool(EXPECTED[name][4]) or name.endswith("quality"))
    assert resolve_policy_path(name) == builtin_policy_path(name)


def test_the_27b_selection_shape():
    model, maps = deployment_for("qwen3.8-27b")
    policy = compile_policy(load_policy(builtin_policy_path("qwen3.8-27b")), maps=maps, model=model)
    names = [s.spec.name for s in policy.selection.selectors()]
    assert names == ["probe", "protected_classes", "digits", "attention_topk", "lexical_net", "special_tokens"]
    assert policy.needs_tokens and policy.needs_token_counts


def test_shipped_policies_refuse_models_they_do_not_fit():
    quality = load_policy(builtin_policy_path("qwen3.8-flash-next-quality"))
    with pytest.raises(PolicyError, match="it has no recurrent"):
        compile_policy(quality, model=ModelInfo.dense(48))
    big = load_policy(builtin_policy_path("qwen3.8-27b"))
    with pytest.raises(PolicyError, match="split 16 is out of range: the model has 12 layers"):
        compile_policy(big, model=ModelInfo.dense(12))


def test_advice_on_shallow_splits_without_qk_norm():
    model, maps = deployment_for("llama-3.1-8b")
    assert compile_policy(load_policy(builtin_policy_path("llama-3.1-8b")), maps=maps, model=model).warnings
    assert not compile_policy(load_policy(builtin_policy_path("llama-3.1-8b-rows")), maps=maps, model=model).warnings
    small, small_maps = deployment_for("qwen2.5-0.5b-default")
    assert not compile_policy(load_policy(builtin_policy_path("qwen2.5-0.5b-default")), maps=small_maps, model=small).warnings


def test_the_small_model_rows_policy_pools_its_attention():
    model, maps = deployment_for("qwen2.5-0.5b-rows")
    policy = compile_policy(load_policy(builtin_policy_path("qwen2.5-0.5b-rows")), maps=maps, model=model)
    question, tail = policy.selection.selectors()
    assert [(s.kwargs["q"], s.kwargs["share"], s.kwargs["pool"]) for s in (question, tail)] == [(64, 0.10, 8), (1024, 0.05, 8)]


def test_the_small_model_rows_policy_runs_long_prompts_at_split_14_and_its_shipped_maps_hold_both_splits():
    model, maps = deployment_for("qwen2.5-0.5b-rows")
    policy = compile_policy(load_policy(builtin_policy_path("qwen2.5-0.5b-rows")), maps=maps, model=model)
    # Measured: split 12 at 4K (exact's score), split 14 at 16K (exact's score; split 12 three samples below).
    assert [policy.split_for(n) for n in (4096, 8192, 12287, 12288, 16384, 32640)] == [12, 12, 12, 14, 14, 14]
    shipped = json.loads((shipped_maps("qwen2.5-coder-0.5b", 12).path / "manifest.json").read_text())
    assert {12, 14} <= {int(s) for s in shipped["splits"]} and shipped["default_split"] == 12


def test_the_second_small_model_rows_policy_is_the_first_ones_selection_with_a_lexical_reserve():
    model, maps = deployment_for("qwen2.5-1.5b-rows")
    policy = compile_policy(load_policy(builtin_policy_path("qwen2.5-1.5b-rows")), maps=maps, model=model)
    small_model, small_maps = deployment_for("qwen2.5-0.5b-rows")
    small = compile_policy(load_policy(builtin_policy_path("qwen2.5-0.5b-rows")), maps=small_maps, model=small_model)
    assert (policy.split, small.split) == (14, 12) and not policy.warnings
    # The same rows, budget and attention reserve, then up to 3 % for the sentences sharing words with the question.
    assert (policy.selection.rows, policy.selection.budget) == (small.selection.rows, small.selection.budget)
    assert policy.selection.reserves[:-1] == small.selection.reserves
    lexical, limit = policy.selection.reserves[-1]
    assert lexical.selector.spec.name == "lexical_net" and limit.fraction == 0.03
    assert policy.needs_tokens and not small.needs_tokens
