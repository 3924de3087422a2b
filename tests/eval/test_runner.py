"""The evaluation's arms, result store and documents, without a server."""

from __future__ import annotations

import json

import pytest

from sgl_ridgefill.eval import arms as A
from sgl_ridgefill.eval.documents import calibration_ids
from sgl_ridgefill.eval.runner import ResultStore, stable_seed
from sgl_ridgefill.policy import MapsInfo, ModelInfo, compile_policy, parse_policy
from sgl_ridgefill.request_params import parse_request_params

QWEN = {"num_hidden_layers": 24, "hidden_size": 896, "num_attention_heads": 14, "num_key_value_heads": 2,
        "intermediate_size": 4864, "vocab_size": 151936}


@pytest.mark.parametrize("arm", A.ALL_ARMS)
def test_every_arm_is_a_valid_request(arm):
    custom = A.arm_params(arm, split=12, tail=1024, longtail=1200, seed=7)
    params = parse_request_params(custom)
    assert params is not None
    if arm in (A.EXACT, A.CUT):
        assert params.wants_exact
    else:
        assert (params.split, params.tail) == (12, 1200 if arm == A.NOFILL_LONGTAIL else 1024)
        assert params.policy == (A.ROWS_POLICY if "+rows" in arm or arm == A.RIDGEFILL_RANDOM else "plain")
    assert (params.control, params.seed) == (("random", 7) if arm == A.RIDGEFILL_RANDOM else ("none", 0))
    assert params.splice == (arm.split(":")[1] if arm in A.SPLICE_ARMS else None)


def test_unknown_arms_are_named():
    with pytest.raises(ValueError, match="unknown arm 'bogus'"):
        A.arm_params("bogus", split=12, tail=1024)
    with pytest.raises(ValueError, match="unknown arm\\(s\\) nope"):
        A.parse_arms("ridgefill,nope", A.NEEDLE_ARMS)
    assert A.parse_arms("ridgefill", A.NEEDLE_ARMS) == ("exact", "ridgefill")


@pytest.mark.parametrize("split", [2, 6, 12])
def test_rows_policy_compiles_below_its_split(split):
    policy = compile_policy(parse_policy(A.rows_policy_text(split, 1024)), model=ModelInfo.dense(24),
                            maps=MapsInfo((split,), split, 24))
    assert policy.split == split and policy.has_selection()
    assert all(layer < split for req in policy.requirements for layer in req.layers)


def test_longtail_costs_what_the_fill_costs():
    from sgl_ridgefill.bench.bounds import ModelDims, RidgeFillShape, ridgefill_prefill_flops

    dims = ModelDims.from_hf_config(QWEN)
    for length in (4096, 16384):
        t = A.longtail_tail(QWEN, length, 12, 1024)
        target = ridgefill_prefill_flops(dims, RidgeFillShape(num_tokens=length, split=12, tail=1024)).total
        at = ridgefill_prefill_flops(dims, RidgeFillShape(num_tokens=length, split=12, tail=t))
        below = ridgefill_prefill_flops(dims, RidgeFillShape(num_tokens=length, split=12, tail=t - 1))
        assert 1024 < t < length and at.total - at.fill >= target > below.total - below.fill


def test_store_resumes_and_drops_a_partial_last_record(tmp_path):
    path = tmp_path / "results.jsonl"
    store = ResultStore(path)
    store.add({"kind": "meta", "split": 12})
    store.add({"kind": "needle", "length": 4096, "task": "t", "sample": "s", "arm": "exact", "score": 100.0})
    with path.open("a") as f:
        f.write('{"kind": "needle", "length": 4096, "ta')  # killed mid-write
    again = ResultStore(path)
    assert again.meta == {"kind": "meta", "split": 12}
    assert again.has(kind="needle", length=4096, task="t", sample="s", arm="exact")
    again.add({"kind": "needle", "length": 4096, "task": "t", "sample": "s", "arm": "ridgefill", "score": 0.0})
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r.get("arm") for r in lines] == [None, "exact", "ridgefill"]


def test_random_control_seeds_differ_per_sample_and_repeat():
    assert stable_seed("a") == stable_seed("a") != stable_seed("b")


def test_calibration_documents_are_left_out(tmp_path):
    (tmp_path / "manifest.json").write_text(json.dumps({"calibration": {"read_ids": ["x", "y"], "heldout_ids": ["y", "z"]}}))
    assert calibration_ids(tmp_path) == {"x", "y", "z"}
    assert calibration_ids(None) == frozenset()


def test_lengths_must_fit_the_context_and_exceed_the_tail():
    from sgl_ridgefill.eval.cli import _check_lengths

    config = {"max_position_embeddings": 8192}
    _check_lengths((4096, 8160), 1024, config, ("niah_single",))  # 8160 + 32 answer tokens fit
    with pytest.raises(SystemExit, match="context is 8192 tokens .* up to 32 more; use lengths up to 8160"):
        _check_lengths((4096, 8192), 1024, config, ("niah_single",))
    with pytest.raises(SystemExit, match="up to 120 more"):
        _check_lengths((8160,), 1024, config, ("niah_single", "cwe"))
    with pytest.raises(SystemExit, match="--lengths 1024: not longer than the tail"):
        _check_lengths((1024, 4096), 1024, config, ("niah_single",))


def test_a_ridgefill_arm_the_server_ran_exactly_stops_the_run():
    """meta_info["ridgefill"] says when a server ran a RidgeFill arm exactly (a backend that cannot run it, a
    prompt no longer than the tail); its results would measure exact prefill under a RidgeFill label."""
    import pytest

    from sgl_ridgefill.eval import arms as A
    from sgl_ridgefill.eval.runner import RanExact, _check_ran

    declined = {"meta_info": {"ridgefill": {"ran": False, "reason": "the attention backend (X) cannot run exact rows"}}}
    with pytest.raises(RanExact, match=r"s1: the server ran the ridgefill arm exactly: the attention backend \(X\)"):
        _check_ran(A.RIDGEFILL, "s1", declined)
    _check_ran(A.EXACT, "s1", declined)  # the exact arm is meant to
    _check_ran(A.RIDGEFILL, "s1", {"meta_info": {"ridgefill": {"ran": True}}})
    _check_ran(A.RIDGEFILL, "s1", {"meta_info": {}})  # a server that does not report: the bit-identity check remains
