"""The evaluation's arms, result store and documents, without a server."""

from __future__ import annotations

import json

import pytest

from sgl_ridgefill.eval import arms as A
from sgl_ridgefill.eval.documents import calibration_ids
from sgl_ridgefill.eval.runner import ResultStore, stable_seed
from sgl_ridgefill.policy import MapsInfo, ModelInfo, compile_policy, parse_policy
from sgl_ridgefill.request_schema import parse_request_params

QWEN = {"num_hidden_layers": 24, "hidden_size": 896, "num_attention_heads": 14, "num_key_value_heads": 2,
        "intermediate_size": 4864, "vocab_size": 151936}


SPANS = ((100, 104), (300, 302))  # a sample's needle spans: the needle-row arms' exact rows


@pytest.mark.parametrize("arm", A.ALL_ARMS + ("splice:keys@13-17", "splice:values@18-23"))
def test_every_arm_is_a_valid_request(arm):
    custom = A.arm_params(arm, split=12, tail=1024, longtail=1200, seed=7, needle_spans=SPANS)
    params = parse_request_params(custom)
    assert params is not None
    if arm in (A.EXACT, A.CUT):
        assert params.wants_exact
    else:
        assert (params.split, params.tail) == (12, 1200 if arm == A.NOFILL_LONGTAIL else 1024)
        assert params.policy == (A.ROWS_POLICY if "+rows" in arm or arm == A.RIDGEFILL_RANDOM else "plain")
    random = arm in (A.RIDGEFILL_RANDOM, A.RIDGEFILL_NEEDLE_RANDOM)
    assert (params.control, params.seed) == (("random", 7) if random else ("none", 0))
    assert params.splice == (arm.split(":")[1] if arm.startswith("splice:") else None)
    needle_rows = (100, 101, 102, 103, 300, 301)
    assert params.exact_rows == (needle_rows if arm in A.NEEDLE_ROW_ARMS else None)


def test_needle_row_arms_need_the_spans():
    with pytest.raises(ValueError, match=r"ridgefill\+needle-rows arm needs the sample's needle spans"):
        A.arm_params(A.RIDGEFILL_NEEDLE_ROWS, split=12, tail=1024)
    assert A.needle_rows(((5, 8), (6, 10))) == [5, 6, 7, 8, 9]


def test_default_splice_ranges_halve_the_filled_upper_layers():
    assert A.splice_ranges(12, 24) == ((13, 17), (18, 23))  # layer 12 reads the exact split state
    assert A.splice_ranges(14, 24) == ((15, 18), (19, 23))
    assert A.splice_ranges(15, 30) == ((16, 22), (23, 29))
    assert A.splice_ranges(22, 24) == ((23, 23),) and A.splice_ranges(23, 24) == ()


def test_splice_layers_flag():
    assert A.parse_splice_layers("auto", 12, 24) == ((13, 17), (18, 23))
    assert A.parse_splice_layers("none", 12, 24) == ()
    assert A.parse_splice_layers("13-15, 16-23,13-15,20", 12, 24) == ((13, 15), (16, 23), (20, 20))
    with pytest.raises(ValueError, match="12-24 is outside the upper layers 12-23"):
        A.parse_splice_layers("12-24", 12, 24)
    with pytest.raises(ValueError, match="11-13 is outside"):
        A.parse_splice_layers("11-13", 12, 24)
    with pytest.raises(ValueError, match="'17-13' is not FIRST-LAST"):
        A.parse_splice_layers("17-13", 12, 24)
    with pytest.raises(ValueError, match="give FIRST-LAST ranges"):
        A.parse_splice_layers(",", 12, 24)


def test_per_layer_splices_join_the_key_splice():
    ranges = ((13, 17), (18, 23))
    arms = A.with_splice_ranges(A.parse_arms("all", A.LOSS_ARMS), ranges)
    assert arms[-2:] == ("splice:keys@13-17", "splice:keys@18-23")
    assert A.with_splice_ranges(("exact", "ridgefill"), ranges) == ("exact", "ridgefill")  # no splice:keys asked
    listed = A.parse_arms("ridgefill,splice:values@13-17", A.LOSS_ARMS)
    assert listed == ("exact", "ridgefill", "splice:values@13-17")
    with pytest.raises(ValueError, match="unknown arm\\(s\\) splice:keys@13"):
        A.parse_arms("splice:keys@13", A.LOSS_ARMS)  # arm names spell both ends
    with pytest.raises(ValueError, match="unknown arm\\(s\\) splice:keys@13-17"):
        A.parse_arms("splice:keys@13-17", A.NEEDLE_ARMS)  # needles have no splices
    order = sorted(["cut", "splice:keys@18-23", "splice:values", "splice:keys", "splice:keys@13-17", "exact",
                    "ridgefill+needle-rows", "ridgefill+random"], key=A.arm_sort_key)
    assert order == ["exact", "ridgefill+random", "ridgefill+needle-rows", "splice:keys", "splice:keys@13-17",
                     "splice:keys@18-23", "splice:values", "cut"]


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


def test_rows_select_of_ones_own():
    select = "attention_topk(q=64, share=10%, layers=[3, 7, 11]) budget 10% reserve lexical_net(min_shared=3) up to 2%"
    A.check_rows_select(select, 12)
    text = A.rows_policy_text(12, 1024, select)
    assert f"  select {select}\n" in text and "(--rows-select)" in text
    policy = compile_policy(parse_policy(text), model=ModelInfo.dense(24), maps=MapsInfo((12,), 12, 24))
    assert policy.has_selection()
    assert A.rows_policy_text(12, 1024) == A.rows_policy_text(12, 1024, None)  # the default: attention 10 %
    assert f"select {A.default_rows_select(12)}\n" in A.rows_policy_text(12, 1024)
    with pytest.raises(ValueError, match=r"(?s)'attention_topk\(layers=\[13\]\)'.*layer 13 is not below split 12"):
        A.check_rows_select("attention_topk(layers=[13])", 12)
    with pytest.raises(ValueError, match="unknown selector 'nearest'"):
        A.check_rows_select("nearest()", 12)


def test_longtail_costs_what_the_fill_costs():
    from sgl_ridgefill.tools.flops import ModelDims, RidgeFillShape, ridgefill_prefill_flops

    dims = ModelDims.from_hf_config(QWEN)
    for length in (4096, 16384):
        t = A.longtail_tail(QWEN, length, 12, 1024)
        target = ridgefill_prefill_flops(dims, RidgeFillShape(num_tokens=length, split=12, tail=1024)).total
        at = ridgefill_prefill_flops(dims, RidgeFillShape(num_tokens=length, split=12, tail=t))
        below = ridgefill_prefill_flops(dims, RidgeFillShape(num_tokens=length, split=12, tail=t - 1))
        assert 1024 < t < length and at.total - at.fill >= target > below.total - below.fill
        assert 1024 < A.longtail_tail(QWEN, length, 12, 1024, "kv") < t  # a cheaper fill buys a shorter tail


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


class _Client:
    """Answers every request with ``text`` and ``ran`` as ``meta_info["ridgefill"]``."""

    def __init__(self, text, ran):
        self.text, self.ran, self.bodies = text, ran, []

    def flush_cache(self):
        pass

    def generate(self, body):
        self.bodies.append(body)
        return {"text": self.text, "meta_info": {"ridgefill": self.ran}}


def _sample(ids=tuple(range(64))):
    from sgl_ridgefill.eval.needles import NeedleSample

    return NeedleSample("niah_single/noise/64/0/0", "niah_single", "noise", 64, ids, ("1234567",), ((10, 14),),
                        10 / 64, "filled", 32)


def test_needle_records_carry_the_prompt_hash_and_the_rows_that_ran(tmp_path):
    from sgl_ridgefill.eval.runner import EvalPlan, prompt_sha, run_needle

    plan = EvalPlan(split=2, tail=16, lengths=(64,), needle_arms=A.NEEDLE_ARMS, loss_arms=(), longtail={64: 20})
    store = ResultStore(tmp_path / "results.jsonl")
    client = _Client(" 1234567.", {"ran": True, "exact": 4, "filled": 44})
    sample = _sample()
    run_needle(client, store, sample, A.RIDGEFILL_NEEDLE_ROWS, plan)
    run_needle(client, store, sample, A.RIDGEFILL_NEEDLE_RANDOM, plan)
    rows, random = (b["sampling_params"]["custom_params"]["ridgefill"] for b in client.bodies)
    assert rows["exact_rows"] == random["exact_rows"] == [10, 11, 12, 13]
    assert "control" not in rows and (random["control"], random["seed"]) == ("random", stable_seed(sample.id))
    records = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert [(r["arm"], r["score"], r["exact_rows"], r["filled_rows"]) for r in records] == [
        (A.RIDGEFILL_NEEDLE_ROWS, 100.0, 4, 44), (A.RIDGEFILL_NEEDLE_RANDOM, 100.0, 4, 44)]
    assert records[0]["prompt_sha"] == prompt_sha(sample.input_ids) == prompt_sha(list(sample.input_ids))
    assert prompt_sha(_sample(tuple(range(1, 65))).input_ids) != records[0]["prompt_sha"]
    assert records[0]["distractor_answers"] == []
    # A server that does not report the rows leaves them out of the record.
    run_needle(_Client("", None), store, sample, A.RIDGEFILL, plan)
    last = json.loads((tmp_path / "results.jsonl").read_text().splitlines()[-1])
    assert "exact_rows" not in last and last["score"] == 0.0


def test_needle_records_carry_the_other_keys_values(tmp_path):
    import dataclasses

    from sgl_ridgefill.eval.runner import EvalPlan, run_needle

    plan = EvalPlan(split=2, tail=16, lengths=(64,), needle_arms=A.NEEDLE_ARMS, loss_arms=(), longtail={64: 20})
    store = ResultStore(tmp_path / "results.jsonl")
    sample = dataclasses.replace(_sample(), distractor_answers=("7654321", "5550001"))
    run_needle(_Client(" 7654321.", None), store, sample, A.EXACT, plan)
    record = json.loads((tmp_path / "results.jsonl").read_text())
    assert (record["answers"], record["distractor_answers"], record["score"]) == (["1234567"], ["7654321", "5550001"], 0.0)


def test_an_answer_decoded_over_rows_the_exact_upgrade_rewrote_stops_a_run_that_measures_the_fill(tmp_path):
    """The exact upgrade rewrites a request's rows exactly in its own decode steps: every answer token after the
    first would read exact keys and values, and the arm would not measure its fill. A run that leaves the
    upgrade off (the default) stops at such an answer, writing nothing; one that asks for it records it."""
    import dataclasses

    from sgl_ridgefill.eval.runner import EvalPlan, UpgradedAnswer, run_needle

    plan = EvalPlan(split=2, tail=16, lengths=(64,), needle_arms=A.NEEDLE_ARMS, loss_arms=(), longtail={64: 20})
    assert plan.upgrade_rows == 0
    store = ResultStore(tmp_path / "results.jsonl")
    upgraded = _Client(" 1234567.", {"ran": True, "exact": 6, "filled": 42, "exact_upgrade": 48})
    with pytest.raises(UpgradedAnswer, match="--ridgefill-upgrade-rows 0"):
        run_needle(upgraded, store, _sample(), A.RIDGEFILL_ROWS, plan)
    assert not (tmp_path / "results.jsonl").exists()
    run_needle(_Client(" 1234567.", {"ran": True, "exact": 6, "filled": 42}), store, _sample(), A.RIDGEFILL_ROWS, plan)
    run_needle(upgraded, store, _sample(), A.RIDGEFILL_ROWS, dataclasses.replace(plan, upgrade_rows=512))
    records = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert [r.get("upgrade_rows") for r in records] == [None, 48]


def test_fill_arms_watch_the_needle_rows_and_record_how_many_ran_exactly(tmp_path):
    from sgl_ridgefill.eval.runner import EvalPlan, run_needle

    plan = EvalPlan(split=2, tail=16, lengths=(64,), needle_arms=A.NEEDLE_ARMS, loss_arms=(), longtail={64: 20})
    store = ResultStore(tmp_path / "results.jsonl")
    client = _Client(" 1234567.", {"ran": True, "exact": 6, "filled": 42, "watched": 4, "watched_exact": 3})
    sample = _sample()
    for arm in (A.RIDGEFILL_ROWS, A.RIDGEFILL, A.EXACT):
        run_needle(client, store, sample, arm, plan)
    bodies = [b["sampling_params"]["custom_params"]["ridgefill"] for b in client.bodies]
    assert [b.get("watch_rows") for b in bodies] == [[10, 11, 12, 13], [10, 11, 12, 13], None]
    records = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert [(r["arm"], r.get("needle_rows"), r.get("needle_rows_exact")) for r in records[:2]] == [
        (A.RIDGEFILL_ROWS, 4, 3), (A.RIDGEFILL, 4, 3)]


def test_a_later_question_follows_questions_about_the_other_keys_on_the_cached_document(tmp_path):
    """ridgefill+rows@q3: the cache is emptied once, the two other questions go first on the same document (the
    first fills it and chooses its rows), then the sample's own question with its needle watched; the record
    says how much of the needle the cache held exact and how many prefix rows were exact."""
    import dataclasses

    from sgl_ridgefill.eval.runner import EvalPlan, needle_jobs, run_needle

    class Flushing(_Client):
        def flush_cache(self):
            self.bodies.append("flush")

    plan = EvalPlan(split=2, tail=16, lengths=(64,), needle_arms=(A.EXACT, *A.LATER_ARMS), loss_arms=(), longtail={})
    store = ResultStore(tmp_path / "results.jsonl")
    sample = dataclasses.replace(_sample(), question_len=4, other_questions=((90, 91, 92), (93, 94)))
    ran = {"ran": True, "cached": 58, "cached_exact": 14, "tail_reused_filled": 1, "watched_cached": 4,
           "watched_cached_exact": 1}
    client = Flushing(" 1234567.", ran)
    run_needle(client, store, sample, "ridgefill+rows@q3", plan)
    flush, first, second, own = client.bodies
    assert flush == "flush"
    assert first["input_ids"] == list(range(60)) + [90, 91, 92] and second["input_ids"] == list(range(60)) + [93, 94]
    assert own["input_ids"] == list(range(64))
    asked = [b["sampling_params"]["custom_params"]["ridgefill"] for b in (first, second, own)]
    assert asked[0] == asked[1] == {k: v for k, v in asked[2].items() if k != "watch_rows"}
    assert asked[2]["policy"] == A.ROWS_POLICY and asked[2]["watch_rows"] == [10, 11, 12, 13]
    record = json.loads((tmp_path / "results.jsonl").read_text())
    assert (record["arm"], record["score"], record["needle_rows"], record["needle_rows_exact"]) == (
        "ridgefill+rows@q3", 100.0, 4, 1)
    # 14 cached exact rows, of which 58 - 48 - 1 = 9 lie in its own tail: 5 exact prefix rows
    assert (record["cached_rows"], record["exact_rows"]) == (58, 5)
    # A sample without two other questions gets no @q3 request, one with one gets @q2.
    one = dataclasses.replace(sample, id="other", other_questions=((90,),))
    assert [(s.id, arm) for s, arm in needle_jobs(store, [sample, one], plan)] == [
        (sample.id, A.EXACT), (sample.id, "ridgefill+rows@q2"), ("other", A.EXACT), ("other", "ridgefill+rows@q2")]
