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
