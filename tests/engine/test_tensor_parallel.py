"""RidgeFill under tensor parallelism (``tp_size=2``) on CPU, in the offline engine and the server.

One TP=2 engine (and, in the slow tests, one TP=1 engine) runs these requests: the ridgefill and identity
arms, exact rows chosen by an attention-and-probe policy (statistics summed over the ranks' heads) and by
``exact_every``, nofill, value rescale, a mixed batch, chunked prefill (150 tokens in chunks of 48) and
decode steps. TP=2
must equal the PyTorch oracle (and TP=1: greedy tokens, logprobs within the CPU tolerance), and both ranks
must have chosen the same exact rows (``meta_info["ridgefill"]["tp_rows_agree"]``). Exact requests on the
TP=2 RidgeFill engine equal a TP=2 engine with RidgeFill off, token for token and bit for bit. The server
runs through ``sgl-ridgefill serve-cpu --tp-size 2`` and reports the maps' memory on each rank.
"""

from __future__ import annotations

import os
import re
import sys

import pytest
import requests
import torch

from sgl_ridgefill.cpu.parallel import Layout, parallel_environment, tp_engine_kwargs
from tests.engine.conftest import ATTENTION_SELECT, SPLIT, assert_top_close, attention_policy, attention_rows, policy_env
from tests.support.engines import cpu_engine_kwargs, prompt, request, run_engine
from tests.support.server import cpu_server

pytestmark = pytest.mark.engine
# The TP=2 engines take 2.5 minutes here: outside CI's time budget (run with -m slow);
# tests/runtime/test_distributed.py runs the collectives on two ranks in CI.
TP_ENGINES = pytest.mark.slow
TAIL, N, PROBE = 20, 150, 8
BOUNDARY = N - TAIL
COUNT = round(0.10 * BOUNDARY)
NO_ROWS = 10**6  # exact_every beyond the prompt: the plain arm, no exact rows (the server policy selects)
TP_ENV = parallel_environment(Layout(tp_size=2), base={})
# The KV pool is capped by max_total_tokens; a larger fraction only tolerates other processes on a shared
# machine taking memory while the weights load (SGLang checks the drop against this fraction).
MEM = dict(mem_fraction_static=0.2)
POLICY = attention_policy("tiny-tp", tail=TAIL, select=f"{ATTENTION_SELECT} | top(probe(rows={PROBE}), 10%)")


def _cases():
    p = [prompt(100 + s, N) for s in range(10)]
    return [
        ("ridgefill", request(p[0], {"exact_every": NO_ROWS}, max_new_tokens=3), dict(ids=p[0])),
        ("identity", request(p[1], {"arm": "identity", "exact_every": NO_ROWS}, max_new_tokens=3),
         dict(ids=p[1], arm="identity")),
        ("rows", request(p[2], {}, max_new_tokens=3), dict(ids=p[2], rows="policy")),
        ("rows_identity", request(p[3], {"arm": "identity"}), dict(ids=p[3], arm="identity", rows="policy")),
        ("exact_every", request(p[4], {"exact_every": 7}, max_new_tokens=3), dict(ids=p[4], rows=7)),
        ("nofill", request(p[5], {"arm": "nofill", "exact_every": NO_ROWS}, max_new_tokens=3),
         dict(ids=p[5], arm="nofill")),
        ("value_rescale", request(p[6], {"value_rescale": 8, "exact_every": NO_ROWS}), dict(ids=p[6], value_rescale=8)),
        ("batch", [request(p[7], {}), request(p[8], {"enabled": False}), request(p[9], {"exact_every": 5})],
         [dict(ids=p[7], rows="policy"), dict(ids=p[8], arm="exact"), dict(ids=p[9], rows=5)]),
    ]


OFF_PROMPTS = [prompt(200 + s, n) for s, n in enumerate((150, 97, 15))]


def _off_steps(ridgefill):
    return [request(ids, ridgefill, max_new_tokens=4, top=5) for ids in OFF_PROMPTS]


def _flatten(cases):
    out = []
    for name, step, expect in cases:
        if isinstance(step, list):
            out.extend((f"{name}[{j}]", e) for j, e in enumerate(expect))
        else:
            out.append((name, expect))
    return out


@pytest.fixture(scope="module")
def runs(tiny_models, tmp_path_factory):
    model = tiny_models("llama")
    rf_env = policy_env(model, tmp_path_factory, "tiny-tp", POLICY, RIDGEFILL_DIAGNOSTICS="1")
    cases = _cases()
    steps = [step for _, step, _ in cases] + _off_steps({"enabled": False})
    names = [name for name, _ in _flatten(cases)]
    n = len(names)
    tp2 = run_engine(cpu_engine_kwargs(model.path, **MEM, **tp_engine_kwargs(2)), steps, {**rf_env, **TP_ENV})
    off = run_engine(cpu_engine_kwargs(model.path, **MEM, **tp_engine_kwargs(2)), _off_steps(None), TP_ENV)
    expect = dict(_flatten(cases))
    return dict(model=model, expect=expect, tp2=dict(zip(names, tp2[:n])), tp2_exact=tp2[n:], off=off,
                steps=steps, rf_env=rf_env, names=names)


@pytest.fixture(scope="module")
def tp1(runs):
    """The same requests at TP=1 (slow: one more engine; TP=2 is compared with the oracle in any case)."""
    model, names = runs["model"], runs["names"]
    got = run_engine(cpu_engine_kwargs(model.path, **MEM), runs["steps"], runs["rf_env"])
    return dict(zip(names, got[: len(names)]))


def _policy_rows(model, ids, arm: str = "ridgefill") -> list[int]:
    probe = model.ref.probe_scores(ids, split=SPLIT, tail=TAIL, rows=PROBE, arm=arm, maps=model.maps)
    return sorted(set(attention_rows(model, ids, tail=TAIL)) | set(torch.topk(probe, COUNT).indices.tolist()))


def _oracle_kwargs(model, expect) -> dict:
    kw = {k: v for k, v in expect.items() if k not in ("ids", "rows")}
    rows = expect.get("rows")
    if rows == "policy":  # the probe runs over the request's own fill
        kw["exact_rows"] = _policy_rows(model, expect["ids"], expect.get("arm", "ridgefill"))
    elif isinstance(rows, int):
        kw["exact_rows"] = list(range(rows - 1, BOUNDARY, rows))
    return kw


CASES = ["ridgefill", "identity", "rows", "rows_identity", "exact_every", "nofill", "value_rescale", "batch[0]",
         "batch[1]", "batch[2]"]


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES)
def test_tp2_equals_tp1(runs, tp1, case):
    a, b = runs["tp2"][case], tp1[case]
    assert "error" not in a, a.get("error")
    assert a["output_ids"] == b["output_ids"]
    for x, y in zip(a["tops"], b["tops"]):
        assert [t for _, t in x] == [t for _, t in y]
        assert max(abs(p - q) for (p, _), (q, _) in zip(x, y)) < 1e-4, (x, y)
    ra, rb = a["ridgefill"], b["ridgefill"]
    assert ra["ran"] == rb["ran"]
    if ra["ran"]:
        assert (ra["filled"], ra["exact"], ra["tail"]) == (rb["filled"], rb["exact"], rb["tail"])


@TP_ENGINES
@pytest.mark.parametrize("case", CASES)
def test_tp2_matches_the_oracle(runs, case):
    model, expect = runs["model"], runs["expect"][case]
    got = runs["tp2"][case]
    kw = _oracle_kwargs(model, expect)
    assert_top_close(got, model.expected_top(expect["ids"], split=SPLIT, tail=TAIL, **kw))


@TP_ENGINES
@pytest.mark.parametrize("case", ["ridgefill", "identity", "rows", "exact_every", "nofill"])
def test_tp2_decode_reads_the_filled_cache(runs, case):
    """Decode steps at TP=2 run the full model over each rank's share of the filled cache."""
    model, expect = runs["model"], runs["expect"][case]
    got = runs["tp2"][case]
    ids = list(expect["ids"])
    kw = _oracle_kwargs(model, expect)
    for step in (1, 2):
        ids.append(got["output_ids"][step - 1])
        assert_top_close({"top": got["tops"][step]}, model.expected_top(ids, split=SPLIT, tail=TAIL + step, **kw))


@TP_ENGINES
def test_both_ranks_chose_the_same_exact_rows(runs):
    """Every RidgeFill request reports that both ranks chose identical rows (checked by gathering each
    rank's rows before the exact pass); the selecting ones chose some, as many as TP=1 chose."""
    for case in CASES:
        meta = runs["tp2"][case]["ridgefill"]
        if meta["ran"]:
            assert meta["tp_ranks"] == 2 and meta["tp_rows_agree"] is True, (case, meta)
    for case in ["rows", "rows_identity", "exact_every", "batch[0]", "batch[2]"]:
        assert runs["tp2"][case]["ridgefill"]["exact"] > 0
    assert runs["tp2"]["rows"]["ridgefill"]["exact"] == len(_policy_rows(runs["model"], runs["expect"]["rows"]["ids"]))


@TP_ENGINES
def test_ridgefill_off_at_tp2_is_stock(runs):
    """Exact requests on the TP=2 RidgeFill engine are bit-identical to a TP=2 engine with RidgeFill off."""
    strip = [(r["output_ids"], r["logprobs"], r["tops"]) for r in runs["tp2_exact"]]
    assert strip == [(r["output_ids"], r["logprobs"], r["tops"]) for r in runs["off"]]
    assert all(r["ridgefill"] == {"ran": False, "reason": "the request asked for exact prefill"} for r in runs["tp2_exact"])


@TP_ENGINES
def test_ridgefill_changes_the_output_at_tp2(runs):
    """Guards the comparisons above against passing trivially."""
    model, expect = runs["model"], runs["expect"]["ridgefill"]
    exact = model.expected_top(expect["ids"], split=SPLIT, tail=TAIL, arm="exact")
    assert abs(runs["tp2"]["ridgefill"]["top"][0][0] - exact[0][0]) > 1e-3


# ----------------------------------------------------------------------------- server
@pytest.fixture(scope="module")
def tp_server(tiny_models, tmp_path_factory):
    model = tiny_models("llama")
    log = tmp_path_factory.mktemp("tp-server") / "server.log"
    args = ["--model-path", str(model.path), "--dtype", "float32", "--max-total-tokens", "8192",
            "--mem-fraction-static", "0.2", "--chunked-prefill-size", "48", "--tp-size", "2",
            "--prefill-backend", "ridgefill", "--ridgefill-maps", str(model.maps_dir), "--ridgefill-split", str(SPLIT),
            "--ridgefill-tail", str(TAIL), "--ridgefill-diagnostics"]
    serve_cpu = [sys.executable, "-m", "sgl_ridgefill.cli", "serve-cpu"]
    with cpu_server(args, log_path=str(log), command=serve_cpu) as url:
        yield model, url, log


def test_serve_cpu_sets_up_tensor_parallelism():
    """``sgl-ridgefill serve-cpu --tp-size 2`` adds the CPU recipe: core groups per rank, no NCCL, one thread
    per rank on two cores, no custom all-reduce."""
    from sgl_ridgefill.cpu.launch_server import command

    cmd, env = command(["--model-path", "m", "--tp-size", "2"])
    assert "--disable-custom-all-reduce" in cmd and cmd[cmd.index("--tp-size") + 1] == "2"
    assert env["SGLANG_CPU_OMP_THREADS_BIND"].count("|") == 1
    assert not os.path.exists(env["SGLANG_NCCL_SO_PATH"])
    assert cmd[1:3] == ["-m", "sglang.launch_server"]


@pytest.mark.slow  # a third TP=2 start
def test_tp_server_matches_the_oracle_and_reports_memory_per_rank(tp_server):
    model, url, log = tp_server
    for j, (body, kw) in enumerate([({"arm": "identity"}, dict(arm="identity")), ({"exact_every": 7}, {}),
                                    ({}, {})]):
        ids = prompt(300 + j, N)
        resp = requests.post(url + "/generate", json=request(ids, body, max_new_tokens=2), timeout=600)
        assert resp.status_code == 200, resp.text
        meta = resp.json()["meta_info"]
        got = {"top": [[x[0], x[1]] for x in meta["output_top_logprobs"][0]]}
        if "exact_every" in body:
            kw = dict(exact_rows=list(range(6, BOUNDARY, 7)))
            assert meta["ridgefill"]["tp_rows_agree"] is True and meta["ridgefill"]["tp_ranks"] == 2
        assert meta["ridgefill"]["ran"] is True
        assert_top_close(got, model.expected_top(ids, split=SPLIT, tail=TAIL, **kw))
    text = log.read_text()
    ranks = sorted(set(re.findall(r"RidgeFill on: .* resident=[\d.]+ MiB on TP rank (\d) of 2", text)))
    assert ranks == ["0", "1"], text[-3000:]


# ----------------------------------------------------------------------------- a fault on one rank
# Loaded by every Python process of the server (a sitecustomize first on PYTHONPATH): RidgeFill's prefill
# raises on TP rank 1 only.
FAULT_HOOK = """
import sgl_ridgefill.runtime.prefill as prefill

_run_chunk = prefill.run_chunk


def run_chunk(ctx, *args, **kwargs):
    if ctx.tp is not None and ctx.tp.rank == 1:
        raise RuntimeError("a fault on rank 1")
    return _run_chunk(ctx, *args, **kwargs)


prefill.run_chunk = run_chunk
"""


@TP_ENGINES
def test_a_fault_on_one_rank_ends_in_an_error_not_a_hang(tiny_models, tmp_path):
    """RidgeFill raising on one TP rank only: the request ends with an error and the server shuts down
    within 30 s, instead of the other rank waiting in a collective."""
    import time

    from sgl_ridgefill.cpu.environment import cpu_environment
    from sgl_ridgefill.cpu.launch_server_process import ServerProcess
    from tests.support.server import REPO

    model = tiny_models("llama")
    (tmp_path / "sitecustomize.py").write_text(FAULT_HOOK)
    env = {k: v for k, v in cpu_environment().items() if not k.startswith("RIDGEFILL_")}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env["PYTHONPATH"], str(REPO)])
    log = tmp_path / "server.log"
    args = ["--model-path", str(model.path), "--dtype", "float32", "--max-total-tokens", "8192",
            "--mem-fraction-static", "0.2", "--chunked-prefill-size", "48", "--tp-size", "2",
            "--prefill-backend", "ridgefill", "--ridgefill-maps", str(model.maps_dir), "--ridgefill-split", str(SPLIT),
            "--ridgefill-tail", str(TAIL)]
    server = ServerProcess(args, log_path=log, env=env, command=[sys.executable, "-m", "sgl_ridgefill.cli", "serve-cpu"])
    server.start()
    try:
        server.wait_ready(900)
        exact = requests.post(server.url + "/generate", json=request(prompt(400, N), {"enabled": False}), timeout=120)
        assert exact.status_code == 200, exact.text  # exact requests never reach the fault
        start = time.monotonic()
        try:
            resp = requests.post(server.url + "/generate", json=request(prompt(401, N), {}), timeout=60)
            assert resp.status_code >= 500, resp.text
        except requests.ConnectionError:
            pass  # the server went down while the request was in flight
        while server.alive and time.monotonic() - start < 30:
            time.sleep(0.5)
        elapsed = time.monotonic() - start
        assert not server.alive, f"the server still runs {elapsed:.0f} s after the fault:\n{log.read_text()[-3000:]}"
        assert elapsed < 30
        text = log.read_text()
        assert "RidgeFill failed on tensor-parallel rank 1 of 2" in text, text[-3000:]
    finally:
        server.stop()
