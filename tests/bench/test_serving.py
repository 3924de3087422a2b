"""``sgl-ridgefill bench-serving`` without servers: the client's command, the result's fields, the servers'
flags, the report, and a clear refusal of unknown names."""

from __future__ import annotations

import pathlib

from sgl_ridgefill.bench import serving
from sgl_ridgefill.cli import build_parser


def test_the_client_is_sglangs_serving_benchmark_scaled():
    cmd = serving.client_command("http://h:1", "/m", "shared-prefix", pathlib.Path("/o.jsonl"), scale=0.5)
    assert cmd[1:4] == ["-m", "sglang.benchmark.serving", "--backend"] and "--gsp-ordered" in cmd
    assert cmd[cmd.index("--gsp-system-prompt-len") + 1] == "3072"
    assert cmd[cmd.index("--base-url") + 1] == "http://h:1" and cmd[cmd.index("--output-file") + 1] == "/o.jsonl"
    assert "--output-details" in cmd  # every request's inter-token gaps, for the longest ones


def test_the_longest_inter_token_gaps_are_reported():
    """A p99 over a few hundred gaps is set by its three or four longest: the report names the five longest,
    so a reader sees whether a difference is one stall or many."""
    got = serving.parse_result({"p99_itl_ms": 900.0, "itls": [[0.1, 2.5, 0.1], [0.2, 0.9], [], [3.0, 0.05, 1.0]]})
    assert got["itl_longest_ms"] == [3000.0, 2500.0, 1000.0, 900.0, 200.0] and got["itl_count"] == 8
    assert "itl_longest_ms" not in serving.parse_result({"p99_itl_ms": 1.0})  # a client run without details


def test_result_fields_in_seconds():
    got = serving.parse_result({"mean_ttft_ms": 1500.0, "median_ttft_ms": 1000.0, "p99_ttft_ms": 2000.0,
                                "p99_itl_ms": 513.0, "duration": 66.9, "request_throughput": 0.1,
                                "output_throughput": 2.0, "completed": 8})
    assert got == {"ttft_mean_s": 1.5, "ttft_p50_s": 1.0, "ttft_p99_s": 2.0, "itl_p99_ms": 513.0,
                   "duration_s": 66.9, "requests_per_s": 0.1, "output_tokens_per_s": 2.0, "completed": 8}


def test_server_flags():
    stock = serving.server_flags("/m", "float32", "stock", maps="/maps", extra=["--x"], longest=100)
    assert "--prefill-backend" not in stock and "--x" not in stock
    ns = serving.server_flags("/m", "float32", "ridgefill-no-insert", maps="/maps", extra=["--x"], longest=100)
    assert ns[ns.index("--ridgefill-maps") + 1] == "/maps"
    assert ns[ns.index("--ridgefill-cache-mode") + 1] == "no_insert" and ns[-1] == "--x"
    default = serving.server_flags("/m", "float32", "ridgefill", maps="/maps", extra=[], longest=100)
    assert "--ridgefill-cache-mode" not in default  # the default cache mode, auto


def test_server_flags_go_to_every_server_before_ridgefills_own():
    """SGLang flags for every server (``--server-flags``, e.g. ``--prefill-decode-interval 1``): the comparison
    stays fair; RidgeFill's own flags come last."""
    for name in ("stock", "ridgefill", "ridgefill-no-insert"):
        flags = serving.server_flags("/m", "float32", name, maps="/maps", extra=["--x"], longest=100,
                                     shared=["--prefill-decode-interval", "1"])
        assert flags[flags.index("--prefill-decode-interval") + 1] == "1", name
        assert name == "stock" or flags[-1] == "--x"
    report = {"command": "c", "model": "m", "ridgefill_flags": [], "server_flags": ["--prefill-decode-interval", "1"],
              "machine": {}, "workloads": {}}
    assert "SGLang flags of every server: `--prefill-decode-interval 1`" in serving.markdown(report)
    assert "SGLang flags of every server" not in serving.markdown({**report, "server_flags": []})


def test_report_lists_every_server_that_ran():
    row = {"ttft_mean_s": 1.0, "ttft_p50_s": 1.0, "ttft_p99_s": 1.0, "itl_p99_ms": 5.0, "duration_s": 2.0,
           "requests_per_s": 1.0, "output_tokens_per_s": 1.0, "completed": 1, "itl_longest_ms": [9.0, 7.5],
           "itl_count": 12}
    report = {"command": "sgl-ridgefill bench-serving", "model": "m", "ridgefill_flags": [], "scale": 0.5,
              "machine": {"cpu_model": "c", "capability": "AVX2", "dtype": "float32", "threads": 2},
              "workloads": {"random-ids": {"stock": row, "ridgefill": {"error": "boom"}}}}
    text = serving.markdown(report)
    assert "| random-ids | stock | 1.00 s |" in text and "| random-ids | ridgefill | error: boom" in text
    assert "AVX2" in text and "float32" in text and "scaled by 0.5" in text
    assert "| 9, 8 ms of 12 |" in text  # the longest inter-token gaps, of how many


def test_unknown_names_are_refused(capsys):
    args = build_parser().parse_args(["bench-serving", "--model", "m", "--ridgefill-maps", "d", "--servers", "stok"])
    assert args.func(args) == 2
    assert "unknown server(s) stok; known: stock, ridgefill, ridgefill-no-insert" in capsys.readouterr().err


def test_multi_turn_runs_through_sglangs_chat_backend():
    cmd = serving.client_command("http://h:1", "/m", "multi-turn", pathlib.Path("/o.jsonl"))
    assert cmd[cmd.index("--backend") + 1] == "sglang-oai-chat" and "--gsp-num-turns" in cmd
    assert "--backend sglang-oai-chat --dataset-name generated-shared-prefix" in serving.markdown(
        {"command": "c", "model": "m", "ridgefill_flags": [], "machine": {}, "workloads": {"multi-turn": {}}})


def test_each_request_is_compared_with_stocks_same_request():
    """The same seed sends every server the same prompts in the same order: the median of the per-request
    ratios says whether a server is slower on most requests, which two medians of eight cannot."""
    stock = serving.parse_result({"ttfts": [20.0, 1.0, 2.0, 1.0]})
    assert stock["ttfts_s"] == [20.0, 1.0, 2.0, 1.0]
    entry = {"stock": stock, "ridgefill": {"ttfts_s": [10.0, 1.1, 1.0, 1.2]}, "short": {"ttfts_s": [1.0]},
             "failed": {"error": "boom"}}
    got = serving.paired(entry)
    assert set(got) == {"ridgefill"}  # a run with another count of requests, or none, is not paired
    assert got["ridgefill"]["slower"] == 2 and got["ridgefill"]["n"] == 4
    assert abs(got["ridgefill"]["median_ratio"] - 0.8) < 1e-12  # ratios 0.5, 1.1, 0.5, 1.2
    assert serving.paired({"ridgefill": {"ttfts_s": [1.0]}}) == {}  # no stock run
    row = {"ttft_mean_s": 1.0, "ttft_p50_s": 1.0, "ttft_p99_s": 1.0, "itl_p99_ms": 5.0, "duration_s": 2.0,
           "requests_per_s": 1.0, "output_tokens_per_s": 1.0, "completed": 4}
    report = {"command": "c", "model": "m", "ridgefill_flags": [], "machine": {},
              "workloads": {"shared-prefix": {"stock": {**stock, **row}, "ridgefill": {**row, **entry["ridgefill"]}}}}
    text = serving.markdown(report)
    assert "| shared-prefix | ridgefill | 1.00 s | 1.00 s | 1.00 s | 0.800x; 2 of 4 |" in text
    assert "| shared-prefix | stock | 1.00 s | 1.00 s | 1.00 s | – |" in text


def _round(ttfts, gaps, duration, tps=2.0):
    return {"ttft_mean_s": sum(ttfts) / len(ttfts), "ttft_p50_s": 0.0, "ttft_p99_s": 0.0, "itl_p99_ms": 0.0,
            "duration_s": duration, "requests_per_s": len(ttfts) / duration, "output_tokens_per_s": tps,
            "completed": len(ttfts), "ttfts_s": list(ttfts), "itl_longest_ms": sorted(gaps, reverse=True)[:5],
            "itl_count": len(gaps), "itl_gaps_ms": sorted(gaps, reverse=True)}


def test_rounds_pool_every_request_and_gap():
    """Two runs of one server differ by 10-20 % per request on a small CPU: the rounds' requests are pooled,
    and every figure is recomputed over the pool, not averaged from the rounds' own percentiles."""
    got = serving.pool([_round([1.0, 3.0], [10.0, 20.0], 10.0, tps=1.0), _round([2.0, 6.0], [30.0, 400.0], 30.0)])
    assert got["ttft_mean_s"] == 3.0 and got["ttft_p50_s"] == 2.5
    assert abs(got["ttft_p99_s"] - (3.0 + 0.97 * 3.0)) < 1e-9  # numpy's linear percentile over [1, 2, 3, 6]
    assert abs(got["itl_p99_ms"] - (30.0 + 0.97 * 370.0)) < 1e-9
    assert got["itl_longest_ms"] == [400.0, 30.0, 20.0, 10.0] and got["itl_count"] == 4
    assert got["duration_s"] == 20.0 and got["completed"] == 4 and got["requests_per_s"] == 0.1
    assert got["output_tokens_per_s"] == (10.0 + 60.0) / 40.0
    assert [r["ttfts_s"] for r in got["rounds"]] == [[1.0, 3.0], [2.0, 6.0]]
    assert "itl_gaps_ms" not in got and all("itl_gaps_ms" not in r for r in got["rounds"])  # not in serving.json
    one = serving.pool([_round([1.0], [5.0], 1.0)])
    assert "rounds" not in one and "itl_gaps_ms" not in one and one["ttfts_s"] == [1.0]
    failed = serving.pool([_round([1.0], [5.0], 1.0), {"error": "boom"}])
    assert failed["error"] == "boom"


def test_rounds_pair_each_request_with_stocks_in_the_same_round():
    stock = serving.pool([_round([1.0, 2.0], [], 1.0), _round([4.0, 4.0, 4.0], [], 1.0)])
    fast = serving.pool([_round([0.5, 2.5], [], 1.0), _round([2.0, 2.0, 5.0], [], 1.0)])
    short = serving.pool([_round([0.5, 2.5], [], 1.0), _round([2.0], [], 1.0)])
    got = serving.paired({"stock": stock, "ridgefill": fast, "short": short})
    assert set(got) == {"ridgefill"}  # a round with another count of requests is not paired
    assert got["ridgefill"] == {"median_ratio": 0.5, "slower": 2, "n": 5}  # 0.5, 1.25, 0.5, 0.5, 1.25


def test_every_other_round_reverses_the_servers_order():
    assert serving.round_order(["stock", "ridgefill"], 0) == ["stock", "ridgefill"]
    assert serving.round_order(["stock", "ridgefill"], 1) == ["ridgefill", "stock"]
    args = build_parser().parse_args(["bench-serving", "--model", "m", "--ridgefill-maps", "d", "--rounds", "3"])
    assert args.rounds == 3
    row = serving.pool([_round([1.0], [5.0], 1.0), _round([1.0], [5.0], 1.0)])
    text = serving.markdown({"command": "c", "model": "m", "ridgefill_flags": [], "machine": {}, "rounds": 2,
                             "workloads": {"shared-prefix": {"stock": row}}})
    assert "2 rounds, the servers' order reversed every other round" in text
    assert "rounds," not in serving.markdown({"command": "c", "model": "m", "ridgefill_flags": [], "machine": {},
                                              "workloads": {}})


def test_rounds_must_be_positive(capsys):
    import pytest

    with pytest.raises(SystemExit):
        build_parser().parse_args(["bench-serving", "--model", "m", "--ridgefill-maps", "d", "--rounds", "0"])
    assert "expected a positive number of rounds, got 0" in capsys.readouterr().err


def test_a_run_alternates_the_servers_and_reports_the_pooled_rounds(tmp_path, monkeypatch):
    """The command end to end with the servers and SGLang's client stood in for: who ran when, with which
    seed, and what reaches serving.json and SERVING.md."""
    import contextlib
    import json
    import urllib.request

    from sgl_ridgefill.cpu import launch_server_process
    from sgl_ridgefill.tools import machine

    calls = []

    @contextlib.contextmanager
    def server(flags, log_path, timeout):
        yield "http://ridgefill" if "--prefill-backend" in flags else "http://stock"

    def client(command, output, *, timeout):
        url, seed = command[command.index("--base-url") + 1], int(command[command.index("--seed") + 1])
        calls.append((url.removeprefix("http://"), seed))
        base = 2.0 if url.endswith("stock") else 1.0
        return serving.parse_result({"mean_ttft_ms": 1.0, "median_ttft_ms": 1.0, "p99_ttft_ms": 1.0,
                                     "p99_itl_ms": 1.0, "duration": 10.0, "request_throughput": 0.2,
                                     "output_throughput": 1.0, "completed": 2, "ttfts": [base, base + seed],
                                     "itls": [[0.01 * (seed + 1)]]})

    monkeypatch.setattr(launch_server_process, "running_server", server)
    monkeypatch.setattr(serving, "run_client", client)
    monkeypatch.setattr(urllib.request, "urlopen", lambda *a, **k: None)
    monkeypatch.setattr(machine, "machine_record", lambda **k: {"capability": "AVX2", "dtype": "float32"})
    args = build_parser().parse_args(["bench-serving", "--model", str(tmp_path), "--ridgefill-maps", "d",
                                      "--workloads", "shared-prefix", "--servers", "stock,ridgefill",
                                      "--dtype", "float32", "--rounds", "3", "--out", str(tmp_path / "out")])
    assert args.func(args) == 0
    assert calls == [("stock", 0), ("ridgefill", 0), ("ridgefill", 1), ("stock", 1), ("stock", 2), ("ridgefill", 2)]
    report = json.loads((tmp_path / "out" / "serving.json").read_text())
    assert report["rounds"] == 3
    ridgefill = report["workloads"]["shared-prefix"]["ridgefill"]
    assert ridgefill["completed"] == 6 and len(ridgefill["rounds"]) == 3 and ridgefill["itl_count"] == 3
    # pairs: 1/2, 1/2, 1/2, 2/3, 1/2, 3/4
    assert ridgefill["ttft_vs_stock"] == {"median_ratio": 0.5, "slower": 0, "n": 6}
    assert "| shared-prefix | ridgefill | 1.50 s | 1.00 s |" in (tmp_path / "out" / "SERVING.md").read_text()
