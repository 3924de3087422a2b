"""A policy's split by prompt length, served: a short prompt fills at the base split, a long one at the deeper
split its ``split S from N tokens`` line gives, each matching the PyTorch oracle at that split with that
split's maps; a request's own split still wins."""

from __future__ import annotations

import pytest
import torch

from sgl_ridgefill.maps import SplitMaps, load_maps, write_maps_folder
from sgl_ridgefill.tools.synthetic import near_identity_maps
from tests.engine.conftest import NUM_LAYERS, SPLIT, assert_top_close, policy_env
from tests.support.engines import cpu_engine_kwargs, prompt, run_engine
from tests.support.engines import request as make_request

pytestmark = pytest.mark.engine
TAIL, SHORT, LONG, FROM = 16, 60, 120, 100
DEEPER = SPLIT + 1
POLICY = f"""
policy "by-length" {{
  split {SPLIT}
  split {DEEPER} from {FROM} tokens
  tail {TAIL}
}}
"""


def _two_split_maps(model, folder) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    """A maps folder holding ``SPLIT`` and ``DEEPER``, with the fingerprint of the tiny model; the stored maps."""
    from sgl_ridgefill.maps import hf_fingerprint_layers, model_fingerprint

    hf, d = model.hf, model.hf.config.hidden_size
    fingerprint = model_fingerprint(hf.config.to_dict(), hf.model.embed_tokens.weight, hf.model.norm.weight,
                                    hf_fingerprint_layers(hf))
    splits = [SplitMaps(s, *near_identity_maps(NUM_LAYERS - s, d, noise=0.05, bias_noise=0.02, seed=s), {"lambda": None})
              for s in (SPLIT, DEEPER)]
    write_maps_folder(folder, splits, model=fingerprint)
    stored = load_maps(folder)
    return {s: stored.load_split(s, dtype=torch.float32) for s in (SPLIT, DEEPER)}


@pytest.fixture(scope="module")
def served(tiny_models, tmp_path_factory):
    model = tiny_models("llama")
    folder = tmp_path_factory.mktemp("by-length") / "maps"
    maps = _two_split_maps(model, folder)
    env = {**policy_env(model, tmp_path_factory, "by-length", POLICY), "RIDGEFILL_MAPS": str(folder)}
    short, long = prompt(3, SHORT), prompt(4, LONG)
    steps = [make_request(short, {}), make_request(long, {}), make_request(long, {"split": SPLIT})]
    return model, maps, (short, long), run_engine(cpu_engine_kwargs(model.path), steps, env)


def test_each_prompt_fills_at_the_split_its_length_reaches(served):
    model, maps, (short, long), (got_short, got_long, _) = served
    assert got_short["ridgefill"]["split"] == SPLIT and got_long["ridgefill"]["split"] == DEEPER
    assert_top_close(got_short, model.expected_top(short, split=SPLIT, tail=TAIL, maps=maps[SPLIT]))
    assert_top_close(got_long, model.expected_top(long, split=DEEPER, tail=TAIL, maps=maps[DEEPER]))
    # and not the base split's fill: the two differ on the long prompt
    base = model.expected_top(long, split=SPLIT, tail=TAIL, maps=maps[SPLIT])
    assert abs(base[0][0] - got_long["top"][0][0]) > 1e-4


def test_a_requests_own_split_replaces_the_schedule(served):
    model, maps, (_, long), (_, _, got) = served
    assert got["ridgefill"]["split"] == SPLIT
    assert_top_close(got, model.expected_top(long, split=SPLIT, tail=TAIL, maps=maps[SPLIT]))
