"""The alternation, median and ratio logic, against a fake server that sleeps a known time per arm."""

from __future__ import annotations

import argparse
import json
import pathlib

import pytest

from sgl_ridgefill.tools.flops import ModelDims
from sgl_ridgefill.bench import results as bench_results
from sgl_ridgefill.bench.cli import add_subparser
from sgl_ridgefill.tools.client import BenchClient, ServerError
from sgl_ridgefill.bench.runner import BenchConfig, Record, make_prompt, pair_order, run_bench, summarize

from .fake_server import FakeServer

DIMS = ModelDims(num_layers=24, hidden_size=896, num_heads=14, num_kv_heads=2, head_dim=64, intermediate_size=4864, vocab_size=5000)
CONFIG_JSON = {
    "num_hidden_layers": 24, "hidden_size": 896, "num_attention_heads": 14, "num_key_value_heads": 2,
    "intermediate_size": 4864, "vocab_size": 5000,
}


@pytest.fixture()
def model_dir(tmp_path: pathlib.Path) -> pathlib.Path:
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text(json.dumps(CONFIG_JSON))
    return tmp_path / "model"


def test_summarize_hand_made_records():
    # exact 3, 1, 2 -> median 2; ridgefill 1.5, 0.4, 1.0 -> median 1.0; pair ratios 2.0, 2.5, 2.0.
    recs = [
        Record(4096, 0, "exact", 0, 3.0, 0), Record(4096, 0, "ridgefill", 1, 1.5, 0),
        Record(4096, 1, "ridgefill", 0, 0.4, 0), Record(4096, 1, "exact", 1, 1.0, 0),
        Record(4096, 2, "exact", 0, 2.0, 0), Record(4096, 2, "ridgefill", 1, 1.0, 5),
    ]
    cfg = BenchConfig(lengths=(4096,), vocab_size=5000, split=12, tail=1024)
    (s,) = summarize(recs, cfg, DIMS)
    assert (s.exact_median, s.ridgefill_median, s.speedup) == (2.0, 1.0, 2.0)
    assert s.pair_ratios == (2.0, 2.5, 2.0) and (s.ratio_min, s.ratio_max) == (2.0, 2.5)
    assert s.layer_bound == pytest.approx(1.6)  # r = 1/2 + 1/2 * 1024/4096 = 0.625
    assert s.layer_fraction == pytest.approx(2.0 / 1.6)
    assert s.cache_hits == 1


def test_pair_order_alternates():
    assert [pair_order(k) for k in range(4)] == [
        ("exact", "ridgefill"), ("ridgefill", "exact"), ("exact", "ridgefill"), ("ridgefill", "exact"),
    ]


def test_prompts_are_fixed_distinct_and_in_vocabulary():
    a = make_prompt(256, 5000, seed=0, pair=0)
    assert a == make_prompt(256, 5000, seed=0, pair=0)
    assert a != make_prompt(256, 5000, seed=0, pair=1) and a != make_prompt(256, 5000, seed=1, pair=0)
    assert len(a) == 256 and 100 <= min(a) and max(a) < 4750


def test_alternating_medians_and_ratio_against_fake_server(model_dir):
    with FakeServer(str(model_dir), exact_s=0.2, ridgefill_s=0.1) as fake:
        cfg = BenchConfig(lengths=(64, 128), vocab_size=5000, pairs=3, warmup=1)
        records, summaries = run_bench(BenchClient(fake.url), cfg, DIMS)
        log = list(fake.log)
    gens = [e for e in log if e[0] == "generate"]
    assert len(gens) == 2 * 1 + 2 * 3 * 2  # warm-up pair + 3 pairs at each of 2 lengths
    assert all(log[i] == ("flush",) for i in range(0, len(log), 2))  # a flush before every request
    timed = gens[2:]
    for k in range(6):
        first, second = timed[2 * k], timed[2 * k + 1]
        assert (first[1], second[1]) == pair_order(k % 3)  # pairs restart at 0 for each length
        assert first[2] == second[2]  # same prompt in both arms of a pair
        assert first[3] == {"enabled": False} if first[1] == "exact" else first[3] == {}
    prompts = [timed[2 * k][2] for k in range(6)]
    assert len(set(prompts)) == 6 and [len(p) for p in prompts] == [64] * 3 + [128] * 3
    assert all(r.cached_tokens == 0 for r in records)
    for s in summaries:
        assert 0.2 <= s.exact_median < 0.3 and 0.1 <= s.ridgefill_median < 0.2
        # The ratio of the medians (sleep jitter moves it around 2; the relation is what is checked).
        assert s.speedup == pytest.approx(s.exact_median / s.ridgefill_median)
        assert 1.5 < s.speedup < 3.0 and s.ratio_min <= s.speedup <= s.ratio_max
        assert s.cache_hits == 0


def test_without_flush_the_cache_hits_are_reported(model_dir):
    with FakeServer(str(model_dir), exact_s=0.0, ridgefill_s=0.0) as fake:
        cfg = BenchConfig(lengths=(32,), vocab_size=5000, pairs=2, warmup=0, flush=False)
        records, (s,) = run_bench(BenchClient(fake.url), cfg, DIMS)
    assert [r.cached_tokens for r in records] == [0, 31, 0, 31]  # the second arm of each pair hit
    assert s.cache_hits == 2


def test_stream_times_the_first_chunk(model_dir):
    # The stream's tail (0.3 s) comes after the first chunk and must not count.
    with FakeServer(str(model_dir), exact_s=0.1, ridgefill_s=0.05, stream_tail_s=0.3) as fake:
        cfg = BenchConfig(lengths=(16,), vocab_size=5000, pairs=1, warmup=0, stream=True)
        records, (s,) = run_bench(BenchClient(fake.url), cfg, DIMS)
    by_arm = {r.arm: r.seconds for r in records}
    assert 0.1 <= by_arm["exact"] < 0.3 and 0.05 <= by_arm["ridgefill"] < 0.25


def test_aborted_request_is_an_error(model_dir):
    with FakeServer(str(model_dir), exact_s=0.0, ridgefill_s=0.0, abort=True) as fake:
        with pytest.raises(ServerError, match=r"request aborted: RidgeFill: bad$"):
            run_bench(BenchClient(fake.url), BenchConfig(lengths=(8,), vocab_size=5000, pairs=1, warmup=0), DIMS)


def test_bench_config_errors():
    with pytest.raises(ValueError, match=r"^--pairs must be >= 1, got 0$"):
        BenchConfig(lengths=(8,), vocab_size=10, pairs=0)
    with pytest.raises(ValueError, match=r"^--exact-fraction must be in \[0, 1\), got 1\.5$"):
        BenchConfig(lengths=(8,), vocab_size=10, exact_fraction=1.5)


def test_rf_params_set_the_bound_inputs():
    cfg = BenchConfig(lengths=(8192,), vocab_size=10, split=12, tail=1024, rf_params={"tail": 2048})
    assert cfg.arm_params("ridgefill") == {"ridgefill": {"tail": 2048}}
    assert cfg.arm_params("exact") == {"ridgefill": {"enabled": False}}
    assert cfg.shape(8192).tail == 2048


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="sgl-ridgefill")
    add_subparser(parser.add_subparsers(dest="command"))
    return parser.parse_args(["bench", *argv])


def test_cli_writes_json_and_png(model_dir, tmp_path, capsys):
    out = tmp_path / "out"
    with FakeServer(str(model_dir), exact_s=0.04, ridgefill_s=0.02) as fake:
        args = _parse(["--url", fake.url, "--lengths", "64,128", "--pairs", "2", "--tail", "32", "--out", str(out)])
        assert args.func(args) == 0
    report = json.loads((out / "bench.json").read_text())
    assert [s["length"] for s in report["summary"]] == [64, 128]
    assert report["model"]["num_layers"] == 24 and report["config"]["tail"] == 32
    assert len(report["records"]) == 2 * 2 * 2
    # r = 1/2 + 1/2 * 32/64 = 0.75 at 64 tokens.
    assert report["summary"][0]["layer_bound"] == pytest.approx(1 / 0.75)
    assert (out / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = capsys.readouterr().out
    assert table.splitlines()[0].split()[:5] == ["tokens", "arm", "exact", "rows", "exact"]


def test_pair_order_rotates_three_arms():
    arms = ("exact", "bare", "ridgefill")
    assert [pair_order(k, arms) for k in range(3)] == [
        ("exact", "bare", "ridgefill"), ("bare", "ridgefill", "exact"), ("ridgefill", "exact", "bare"),
    ]


def _bench_rows_policy(model_dir, out, lengths: str, *, pairs: int, more: tuple[str, ...] = ()) -> list[tuple]:
    """``bench --ridgefill-policy qwen2.5-0.5b-rows`` against a fake server whose policy responses report 1,500
    exact rows; the requests it received."""
    with FakeServer(str(model_dir), exact_s=0.06, ridgefill_s=0.04, bare_s=0.03, exact_rows=1500) as fake:
        args = _parse(["--url", fake.url, "--lengths", lengths, "--pairs", str(pairs), "--warmup", "0",
                       "--ridgefill-policy", "qwen2.5-0.5b-rows", "--out", str(out), *more])
        assert args.func(args) == 0
        return fake.generates()


def test_a_policy_with_rows_is_measured_beside_the_bare_fill(model_dir, tmp_path):
    """``--ridgefill-policy`` with exact rows: three arms per pair; each arm's FLOP bound counts the exact rows its
    responses report (and the policy's selection), so the policy's bound sits below the bare fill's."""
    out = tmp_path / "out"
    gens = _bench_rows_policy(model_dir, out, "8192", pairs=3)
    assert [g[1] for g in gens] == ["exact", "bare", "ridgefill", "bare", "ridgefill", "exact", "ridgefill", "exact", "bare"]
    params = {g[1]: g[3] for g in gens}
    assert params["ridgefill"] == {"policy": "qwen2.5-0.5b-rows"}  # asked for per request
    assert params["bare"] == {"policy": "plain", "split": 12, "tail": 1024}  # the policy's split and tail
    report = json.loads((out / "bench.json").read_text())
    rows, bare = (next(s for s in report["summary"] if s["arm"] == arm) for arm in ("ridgefill", "bare"))
    assert (rows["exact_rows"], bare["exact_rows"]) == (1500, 0)
    assert rows["flop_bound"] < bare["flop_bound"] and rows["layer_bound"] < bare["layer_bound"]
    assert report["config"]["selector_flops"]["8192"] > 0
    # r = 1/2 + 1/2 * (1024 + 1500) / 8192
    assert rows["layer_bound"] == pytest.approx(1 / (0.5 + 0.5 * 2524 / 8192))


def test_cli_split_from_maps_manifest(model_dir, tmp_path):
    maps = tmp_path / "maps"
    maps.mkdir()
    (maps / "manifest.json").write_text(json.dumps({"default_split": 6}))
    out = tmp_path / "out"
    with FakeServer(str(model_dir), exact_s=0.0, ridgefill_s=0.0) as fake:
        args = _parse(["--url", fake.url, "--lengths", "64", "--pairs", "1", "--warmup", "0", "--tail", "32",
                       "--ridgefill-maps", str(maps), "--out", str(out)])
        assert args.func(args) == 0
    report = json.loads((out / "bench.json").read_text())
    # r = 6/24 + 18/24 * 32/64 = 0.625.
    assert report["summary"][0]["layer_bound"] == pytest.approx(1 / 0.625)
    assert report["config"]["map_kind"] is None  # no kind in the manifest: the residual map prices the fill
    (maps / "manifest.json").write_text(json.dumps({"default_split": 6, "map_kind": "kv"}))
    with FakeServer(str(model_dir), exact_s=0.0, ridgefill_s=0.0) as fake:
        args = _parse(["--url", fake.url, "--lengths", "64", "--pairs", "1", "--warmup", "0", "--tail", "32",
                       "--ridgefill-maps", str(maps), "--out", str(out)])
        assert args.func(args) == 0
    kv = json.loads((out / "bench.json").read_text())
    assert kv["config"]["map_kind"] == "kv"
    assert kv["summary"][0]["flop_bound"] > report["summary"][0]["flop_bound"]  # the kv map fills for less


def test_cli_refuses_an_unknown_map_kind_before_any_request(model_dir, tmp_path, capsys):
    maps = tmp_path / "maps"
    maps.mkdir()
    (maps / "manifest.json").write_text(json.dumps({"default_split": 6, "map_kind": "linear"}))
    with FakeServer(str(model_dir), exact_s=0.0, ridgefill_s=0.0) as fake:
        args = _parse(["--url", fake.url, "--lengths", "64", "--pairs", "1", "--warmup", "0", "--tail", "32",
                       "--ridgefill-maps", str(maps), "--out", str(tmp_path / "out")])
        assert args.func(args) == 1
        assert fake.generates() == []
    assert "unknown map kind 'linear'" in capsys.readouterr().err


def test_manifest_name_matches_the_maps_format():
    from sgl_ridgefill.bench.cli import MAPS_MANIFEST
    from sgl_ridgefill.maps.format import MANIFEST

    assert MAPS_MANIFEST == MANIFEST


def test_cli_needs_a_model_shape(tmp_path, capsys):
    with FakeServer("/nonexistent/model", exact_s=0.0, ridgefill_s=0.0) as fake:
        args = _parse(["--url", fake.url, "--lengths", "64", "--out", str(tmp_path / "out")])
        assert args.func(args) == 1
    assert capsys.readouterr().err.strip() == (
        "sgl-ridgefill bench: error: cannot read the model's shape: the server's model_path '/nonexistent/model' "
        "is not a local folder with a config.json; pass --model-path DIR"
    )


def test_cli_unreachable_server(tmp_path, capsys):
    args = _parse(["--url", "http://127.0.0.1:9", "--lengths", "64", "--out", str(tmp_path / "out")])
    assert args.func(args) == 1
    assert capsys.readouterr().err.startswith("sgl-ridgefill bench: error: GET http://127.0.0.1:9/get_model_info: ")


def test_a_flush_refused_while_the_last_request_winds_down_is_retried(model_dir):
    """SGLang answers ``/generate`` before the request leaves its running batch, and refuses a flush until it
    has (HTTP 400 "Flush cache failed"): the client retries instead of stopping the run."""
    with FakeServer(str(model_dir), exact_s=0.0, ridgefill_s=0.0) as fake:
        fake.busy_flushes = 2
        BenchClient(fake.url).flush_cache()
        assert fake.log == [("flush refused",), ("flush refused",), ("flush",)]
        fake.busy_flushes = 10**6  # a server that never settles: a clear error after the retry budget
        with pytest.raises(ServerError, match="flush_cache: HTTP 400"):
            BenchClient(fake.url).flush_cache(retry_s=0.3)


def test_a_cpu_servers_selection_counts_its_scores_once(model_dir, tmp_path):
    """The CPU reference computes each selection score once, the CUDA kernel twice: the FLOP bound counts the
    passes of the server's device."""
    flops = {}
    for device in ("cpu", "cuda"):
        out = tmp_path / device
        with FakeServer(str(model_dir), exact_s=0.01, ridgefill_s=0.01, exact_rows=10,
                        server_info={"device": device}) as fake:
            args = _parse(["--url", fake.url, "--lengths", "8192", "--pairs", "1", "--warmup", "0",
                           "--ridgefill-policy", "qwen2.5-0.5b-rows", "--out", str(out)])
            assert args.func(args) == 0
        flops[device] = json.loads((out / "bench.json").read_text())["config"]["selector_flops"]["8192"]
    assert flops["cpu"] == pytest.approx(flops["cuda"] / 2)


def test_a_policy_with_a_split_by_length_is_bounded_and_paired_at_each_lengths_split(model_dir, tmp_path):
    """``qwen2.5-0.5b-rows`` runs prompts of 12,288 tokens or more at split 14: the bounds at 16K count 14 exact
    layers, and the bare fill beside it runs at the same split, so the two arms differ only by the rows."""
    out = tmp_path / "out"
    gens = _bench_rows_policy(model_dir, out, "8192,16384", pairs=1)
    bare = [(len(g[2]), g[3]["split"]) for g in gens if g[1] == "bare"]
    assert bare == [(8192, 12), (16384, 14)]
    report = json.loads((out / "bench.json").read_text())
    assert report["config"]["splits_by_length"] == {"8192": 12, "16384": 14}
    long = next(s for s in report["summary"] if s["arm"] == "ridgefill" and s["length"] == 16384)
    layers = report["model"]["num_layers"]
    kept = 14 / layers
    assert long["layer_bound"] == pytest.approx(1 / (kept + (1 - kept) * (1024 + 1500) / 16384))
    assert "S = 12 (14 at 16,384 tokens)" in bench_results.section("f", report)
    # A split the requests ask for replaces the schedule, for both filled arms and the bounds.
    gens = _bench_rows_policy(model_dir, tmp_path / "forced", "16384", pairs=1, more=("--rf-params", '{"split": 12}'))
    assert {g[3]["split"] for g in gens if g[1] in ("bare", "ridgefill")} == {12}
    forced = json.loads((tmp_path / "forced" / "bench.json").read_text())
    assert forced["config"]["splits_by_length"] == {}
    assert "S = 12, T" in bench_results.section("f", forced)
