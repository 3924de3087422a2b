"""``sgl-ridgefill eval`` end to end on a tiny random model: two real CPU servers, the stock check, needle
and loss records for every arm asked for, the splice that restores exact keys and values scoring like the
exact arm, the report, and resuming without repeating a request."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

from sgl_ridgefill.calibration.corpus import CalibrationError, builtin_corpus
from tests.engine.conftest import SPLIT
from tests.support.engines import REPO

# Outside CI's time budget (run with -m slow): eval against a live server takes 4.5 minutes per run here;
# tests/eval checks the runner, the analysis and the reports without an engine.
pytestmark = [pytest.mark.engine, pytest.mark.slow]


def _eval(model, out, *extra):
    cmd = [sys.executable, "-m", "sgl_ridgefill.cli", "eval", "--model", str(model.path), "--maps", str(model.maps_dir),
           "--split", str(SPLIT), "--tail", "64", "--lengths", "512", "--out", str(out), "--docs", "1", "--depths", "1",
           "--haystacks", "noise", "--needle-arms", "ridgefill,nofill+longtail", "--loss-arms", "ridgefill,splice:both",
           "--n-resamples", "200", "--dtype", "float32", *extra]  # explicit: auto depends on this CPU
    env = {k: v for k, v in os.environ.items() if not k.startswith("RIDGEFILL_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=1200)


@pytest.fixture(scope="module")
def run(tiny_models, tmp_path_factory):
    try:
        builtin_corpus()
    except CalibrationError as e:
        pytest.skip(str(e))
    model = tiny_models("qwen2")
    out = tmp_path_factory.mktemp("eval")
    first = _eval(model, out)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-6000:]
    again = _eval(model, out)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-6000:]
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    return out, records, first, again


def test_the_stock_check_runs_first_and_passes(run):
    _, records, _, _ = run
    kinds = [r["kind"] for r in records]
    assert kinds[0] == "meta" and kinds[1] == "check"
    assert records[1]["passed"] and records[1]["prompts"] == 3, records[1]


def test_every_sample_gets_every_arm(run):
    _, records, _, _ = run
    needles = [r for r in records if r["kind"] == "needle"]
    samples = {r["sample"] for r in needles}
    assert len(samples) >= 3  # a filled depth + the grid around and in the tail
    assert {(s, a) for s in samples for a in ("exact", "ridgefill", "nofill+longtail")} == {(r["sample"], r["arm"]) for r in needles}
    assert "filled" in {r["region"] for r in needles} and len({r["region"] for r in needles}) >= 2
    assert all(0.0 <= r["score"] <= 100.0 for r in needles)
    losses = {r["arm"] for r in records if r["kind"] == "loss"}
    assert losses == {"exact", "ridgefill", "splice:both", "cut"}


def test_each_invocation_records_what_it_planned_and_what_was_left(run):
    from sgl_ridgefill.eval.analysis import progress

    _, records, _, _ = run
    sent = sum(r["kind"] in ("needle", "loss") for r in records)
    plans = [r for r in records if r["kind"] == "plan"]
    assert [(p["requests"], p["pending"]) for p in plans] == [(sent, sent), (sent, 0)]  # the first run, the resumed one
    assert progress(records)["requests"] == progress(records)["done"] == sent


def test_splice_both_scores_like_exact_and_ridgefill_does_not(run):
    from sgl_ridgefill.eval.metrics import TokenScores

    _, records, _, _ = run
    scores = {r["arm"]: TokenScores.from_json(r["scores"]) for r in records if r["kind"] == "loss"}
    exact, both, rf = scores["exact"].logprobs[1:], scores["splice:both"].logprobs[1:], scores["ridgefill"].logprobs[1:]
    assert len(exact) == 63
    assert max(abs(a - b) for a, b in zip(exact, both)) < 0.05  # bf16 server: same values, other summation order
    assert max(abs(a - b) for a, b in zip(exact, rf)) > 0.05
    assert all(math.isfinite(x) for x in exact)


def test_report_and_resume(run):
    out, _, first, again = run
    report = (out / "REPORT.md").read_text()
    assert "byte-identical" in report
    assert any(p.suffix == ".png" for p in out.iterdir())
    assert "0 request(s)" in again.stdout, again.stdout[-2000:]
    assert "check passed" in first.stdout


@pytest.mark.slow  # a second eval run (about 2.5 min); the module's run covers the suite in CI
def test_another_run_reuses_the_exact_arm_and_sends_only_the_others(run, tiny_models, tmp_path):
    out, records, _, _ = run
    done = _eval(tiny_models("qwen2"), tmp_path, "--exact-from", str(out))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    theirs = [r for r in records if r.get("arm") in ("exact", "cut")]
    assert f"--exact-from: reused {sum(r['kind'] == 'needle' for r in theirs)} needle and 2 loss record(s)" in done.stdout
    ours = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    copied = [r for r in ours if r.get("copied_from")]
    assert {(r["kind"], r.get("sample") or r.get("doc"), r["arm"]) for r in copied} == {
        (r["kind"], r.get("sample") or r.get("doc"), r["arm"]) for r in theirs}
    assert all(r["copied_from"] == str(out) for r in copied)
    sent = sum(r["kind"] in ("needle", "loss") for r in records) - len(theirs)  # every other arm, once each
    assert f"{sent} request(s) in" in done.stdout, done.stdout[-2000:]
    assert ours[0]["fill_flops_per_row"] > 0


@pytest.mark.slow  # a third eval run (about 3.5 min)
def test_a_rows_selection_of_ones_own_is_served_recorded_and_kept_on_resume(run, tiny_models, tmp_path):
    out, _, _, _ = run
    model = tiny_models("qwen2")
    bad = _eval(model, tmp_path / "bad", "--rows-select", "nearest()")
    assert bad.returncode != 0 and "--rows-select 'nearest()' is not a selection" in bad.stderr
    assert "unknown selector 'nearest'" in bad.stderr and "starting" not in bad.stdout  # refused before any server
    select = "digits() budget 8"
    done = _eval(model, tmp_path / "own", "--rows-select", select, "--needle-arms", "ridgefill+rows",
                 "--loss-arms", "exact", "--exact-from", str(out))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    records = [json.loads(line) for line in (tmp_path / "own" / "results.jsonl").read_text().splitlines()]
    assert (records[0]["rows_select"], records[0]["rows_fraction"]) == (select, None)
    assert f"  select {select}\n" in (tmp_path / "own" / "eval-rows.rfpolicy").read_text()
    rows = [r["exact_rows"] for r in records if r.get("arm") == "ridgefill+rows" and r.get("region") == "filled"]
    assert rows and all(1 <= n <= 8 + 1 for n in rows)  # the digits, at most 8 of them, and the sink row
    again = _eval(model, tmp_path / "own", "--needle-arms", "ridgefill+rows", "--loss-arms", "exact")
    assert again.returncode != 0 and "rows_select: 'digits() budget 8' -> None" in again.stderr


@pytest.fixture(scope="module")
def engine_run(tiny_models, tmp_path_factory, run):
    model = tiny_models("qwen2")
    out = tmp_path_factory.mktemp("eval-engine")
    done = _eval(model, out, "--engine")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    return out, [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()], done


@pytest.mark.slow  # two more engines, about 90 s
def test_offline_engines_check_and_score_like_the_servers(run, engine_run):
    """``--engine``: the stock engine's check passes, every arm runs, and the RidgeFill engine scores each
    document's tail exactly as the RidgeFill server did (same weights, maps, dtype and kernels)."""
    from sgl_ridgefill.eval.metrics import TokenScores

    _, server_records, _, _ = run
    out, records, done = engine_run
    assert records[0]["server"].startswith("offline sglang.Engine") and records[1]["kind"] == "check"
    assert records[1]["passed"], records[1]
    assert "starting the stock engine" in done.stdout and "check passed" in done.stdout
    key = lambda r: (r["kind"], r.get("sample") or r.get("doc"), r["arm"])  # noqa: E731
    wanted = {key(r) for r in server_records if r["kind"] in ("needle", "loss")}
    assert {key(r) for r in records if r["kind"] in ("needle", "loss")} == wanted
    served = {r["arm"]: TokenScores.from_json(r["scores"]).logprobs for r in server_records if r["kind"] == "loss"}
    offline = {r["arm"]: TokenScores.from_json(r["scores"]).logprobs for r in records if r["kind"] == "loss"}
    for arm in ("exact", "ridgefill", "splice:both"):
        assert max(abs(a - b) for a, b in zip(served[arm][1:], offline[arm][1:])) < 1e-3, arm
    assert (out / "REPORT.md").exists()


def test_engine_mode_refuses_a_server_url(tiny_models, tmp_path):
    model = tiny_models("qwen2")
    done = _eval(model, tmp_path, "--engine", "--url", "http://127.0.0.1:9")
    assert done.returncode != 0 and "--engine runs its own engines" in done.stderr
