"""Summary tables and the report from synthetic ``results.jsonl`` records with known numbers."""

from __future__ import annotations

import json

import numpy as np
import pytest
from scipy import stats

from sgl_ridgefill.eval.analysis import latest_records, load_records, summarize
from sgl_ridgefill.eval.metrics import TokenScores
from sgl_ridgefill.eval.report import write_report
from sgl_ridgefill.eval.results_md import render_results_md
from sgl_ridgefill.eval.stats import stratified_paired_bootstrap

N_RESAMPLES = 500
TASKS = ("t1", "t2")
# Filled-region scores per arm for samples f0..f3 at 4096 tokens (the same in both tasks).
FILLED = {
    "exact": (100, 100, 100, 100),
    "identity": (0, 0, 100, 0),
    "ridgefill": (100, 100, 100, 0),
    "ridgefill+rows": (100, 100, 100, 100),
    "ridgefill+random": (100, 0, 100, 0),
}

# Documents: N = 64 tokens, T = 16 scored tail tokens (positions 48..63).
N, T = 64, 16
KEY_OFFSETS = {"d0": (0, 1), "d1": (5,), "d2": (), "d3": (9,)}
# Per arm: (loss on ordinary tokens, loss on key tokens), in nat.
LOSSES = {
    "exact": (1.0, 1.0),
    "cut": (1.0, 4.0),
    "identity": (2.0, 5.0),
    "ridgefill": (1.5, 3.0),
    "splice:keys": (1.25, 2.0),
    "splice:values": (1.0, 1.0),
}


def _needle(length, task, sample, arm, region, score, position):
    return {"kind": "needle", "length": length, "task": task, "haystack": "essays", "sample": sample, "arm": arm,
            "region": region, "depth": position / length, "position": position, "score": float(score),
            "output": "", "seconds": 0.1}


def _needle_records():
    records = [_needle(4096, "t1", "f3", "ridgefill", "filled", 100, 900)]  # replaced by a later duplicate
    for task in TASKS:
        for arm, scores in FILLED.items():
            for i, score in enumerate(scores):
                records.append(_needle(4096, task, f"f{i}", arm, "filled", score, 500 + 700 * i))
            tail = 0 if (arm, task) == ("identity", "t1") else 100
            records.append(_needle(4096, task, "tl0", arm, "tail", tail, 3500))
            records.append(_needle(4096, task, "s0", arm, "straddle", 0, 3070))
        for arm in ("exact", "ridgefill"):
            for i in range(2):
                records.append(_needle(8192, task, f"f{i}", arm, "filled", 100, 1000 + 2000 * i))
    return records


def _prompt(doc):
    ids = np.arange(N, dtype=np.int64) + {"d0": 1000, "d1": 2000, "d2": 3000, "d3": 4000}[doc]
    if doc == "d1":
        ids[56:64] = ids[10:18]  # the tail's last 8 tokens copy an earlier span: offsets 8..15 are not new
    return ids


def _scores(doc, arm):
    token_ids = _prompt(doc)[N - T:]
    base, key = LOSSES[arm]
    losses = np.full(T, base)
    losses[list(KEY_OFFSETS[doc])] = key
    # Top-2 lists: exact ranks the true token first; ridgefill flips the order on key tokens, identity on
    # every token of d0.
    flipped = np.zeros(T, dtype=bool)
    if arm == "ridgefill":
        flipped[list(KEY_OFFSETS[doc])] = True
    if arm == "identity" and doc == "d0":
        flipped[:] = True
    first = np.where(flipped, 7, token_ids)
    second = np.where(flipped, token_ids, 7)
    top_ids = np.stack([first, second], axis=1)
    top_logprobs = np.tile([-0.1, -3.0], (T, 1))
    start = 0 if arm == "cut" else N - T  # the cut record counts from its own shorter prompt
    return TokenScores(start, token_ids, -losses, top_ids, top_logprobs)


def _document_records(docs=("d0", "d1", "d2"), with_doc=("d0", "d1", "d2")):
    records = []
    for doc in docs:
        if doc in with_doc:
            records.append({"kind": "doc", "length": N, "doc": doc, "source": "synthetic",
                            "prompt_ids": _prompt(doc).tolist()})
        for arm in LOSSES:
            records.append({"kind": "loss", "length": N, "doc": doc, "arm": arm,
                            "scores": _scores(doc, arm).to_json(), "seconds": 0.2})
    return records


META = {"kind": "meta", "model": "tiny", "model_path": "/models/tiny", "split": 12, "tail": 1024,
        "lengths": [4096, 8192], "maps": "maps/tiny", "rows_policy": "norm", "rows_fraction": 0.05,
        "longtail_tail": {"4096": 1300}, "started": "2025-01-01T00:00:00", "command": "sgl-ridgefill eval ...",
        "server": "http://127.0.0.1:30000"}
CHECK = {"kind": "check", "passed": True, "prompts": 5, "compared": "output token ids", "mismatches": []}


@pytest.fixture(scope="module")
def records():
    return [META, CHECK, *_needle_records(), *_document_records()]


@pytest.fixture(scope="module")
def summary(records):
    return summarize(records, n_resamples=N_RESAMPLES)


def _row(rows, **match):
    """The one row matching ``match``; rows broken down by haystack match the pooled one ("all") unless
    ``haystack`` is given."""
    match.setdefault("haystack", "all")
    found = [r for r in rows if all(r.get(k, "all" if k == "haystack" else None) == v for k, v in match.items())]
    assert len(found) == 1, (match, found)
    return found[0]


def _loss_expected(arm):
    """Per-document mean losses (key, new, all) by hand: d0 all new, d1 new on offsets 0..7."""
    b, k = LOSSES[arm]
    key = [k, k]
    new = [(2 * k + 14 * b) / 16, (k + 7 * b) / 8, b]
    every = [(2 * k + 14 * b) / 16, (k + 15 * b) / 16, b]
    return key, new, every


# ---------------------------------------------------------------------------------------------- records


def test_load_records_skips_a_truncated_last_line(tmp_path):
    path = tmp_path / "results.jsonl"
    path.write_text(json.dumps(META) + "\n" + json.dumps(CHECK) + "\n" + '{"kind": "needle", "len')
    assert [r["kind"] for r in load_records(path)] == ["meta", "check"]


def test_load_records_rejects_a_malformed_middle_line(tmp_path):
    path = tmp_path / "results.jsonl"
    path.write_text(json.dumps(META) + "\n{oops\n" + json.dumps(CHECK) + "\n")
    with pytest.raises(ValueError, match=r"results.jsonl:2"):
        load_records(path)


def test_a_later_duplicate_replaces_an_earlier_record(records):
    latest = latest_records(records)
    hits = [r for r in latest if r["kind"] == "needle" and r["length"] == 4096 and r["task"] == "t1"
            and r["sample"] == "f3" and r["arm"] == "ridgefill"]
    assert len(hits) == 1 and hits[0]["score"] == 0.0


def test_summary_is_json_serialisable(summary):
    text = json.dumps(summary, allow_nan=False)
    assert json.loads(text)["check"]["prompts"] == 5


# -------------------------------------------------------------------------------------------- retrieval


def test_retrieval_means_and_counts(summary):
    rows = summary["retrieval"]
    r = _row(rows, length=4096, task="all", arm="ridgefill", region="filled")
    assert (r["n"], r["mean"]) == (8, 75.0)
    assert r["low"] <= r["mean"] <= r["high"]
    assert _row(rows, length=4096, task="t1", arm="identity", region="filled")["mean"] == 25.0
    assert _row(rows, length=4096, task="all", arm="identity", region="tail")["mean"] == 50.0
    exact = _row(rows, length=4096, task="all", arm="exact", region="filled")
    assert (exact["mean"], exact["low"], exact["high"]) == (100.0, 100.0, 100.0)
    assert not [r for r in rows if r["region"] == "straddle"]
    assert _row(rows, length=8192, task="all", arm="ridgefill", region="filled")["n"] == 4


def test_retrieval_diffs_paired_on_samples(summary):
    rows = summary["retrieval_diffs"]
    r = _row(rows, length=4096, arm="ridgefill", vs="identity")
    assert (r["n"], r["diff"], r["b01"], r["b10"]) == (8, 50.0, 0, 4)
    assert r["mcnemar_p"] == pytest.approx(stats.binomtest(4, 4, 0.5).pvalue)
    r = _row(rows, length=4096, arm="ridgefill", vs="exact")
    assert (r["diff"], r["b01"], r["b10"]) == (-25.0, 2, 0)
    assert _row(rows, length=4096, arm="ridgefill+rows", vs="ridgefill+random")["diff"] == 50.0
    pooled = _row(rows, length="all", arm="ridgefill", vs="exact")
    assert pooled["n"] == 12 and pooled["diff"] == pytest.approx(-200 / 12)
    # Arms the run never reached give no rows.
    assert not [r for r in rows if "nofill+longtail" in (r["arm"], r["vs"]) or r["arm"] == "identity+rows"]


# ------------------------------------------------------------------------------------------------- loss


def test_loss_means_medians_and_counts(summary):
    rows = summary["loss"]
    for arm in LOSSES:
        key, new, every = _loss_expected(arm)
        k = _row(rows, length=N, arm=arm, metric="key")
        assert (k["n_docs"], k["n_tokens"], k["docs_without_tokens"]) == (2, 3, 1)
        assert k["mean"] == pytest.approx(np.mean(key))
        n = _row(rows, length=N, arm=arm, metric="new")
        assert (n["n_docs"], n["n_tokens"]) == (3, 16 + 8 + 16)
        assert n["mean"] == pytest.approx(np.mean(new)) and n["median"] == pytest.approx(np.median(new))
        a = _row(rows, length=N, arm=arm, metric="all")
        assert a["mean"] == pytest.approx(np.mean(every)) and a["n_tokens"] == 3 * T


def test_loss_diffs_are_paired_over_documents(summary):
    rows = summary["loss_diffs"]
    r = _row(rows, length=N, metric="all", arm="ridgefill", vs="exact")
    assert r["n"] == 3 and r["diff"] == pytest.approx(np.mean(_loss_expected("ridgefill")[2]) - 1.0)
    r = _row(rows, length=N, metric="key", arm="ridgefill", vs="identity")
    assert (r["n"], r["diff"], r["low"], r["high"]) == (2, -2.0, -2.0, -2.0)  # every difference is -2
    assert not [r for r in rows if r["vs"] == "nofill+longtail"]


def test_loss_diffs_resample_documents_within_their_source():
    def diff_row(sources, docs):
        records = [{**r, "source": sources[r["doc"]]} if r["kind"] == "doc" else r
                   for r in _document_records(docs, with_doc=docs)]
        return _row(summarize(records, n_resamples=N_RESAMPLES)["loss_diffs"], length=N, metric="all",
                    arm="ridgefill", vs="exact")

    docs = ("d0", "d1", "d2", "d3")
    per_doc = {"d0": (2 * 3.0 + 14 * 1.5) / 16, "d1": (3.0 + 15 * 1.5) / 16, "d2": 1.5, "d3": (3.0 + 15 * 1.5) / 16}
    diffs = np.array([per_doc[d] for d in docs]) - 1.0  # exact loses 1 nat on every token
    split = diff_row({"d0": "a", "d1": "a", "d2": "b", "d3": "b"}, docs)
    want = stratified_paired_bootstrap(diffs, np.zeros(4), ["a", "a", "b", "b"], n_resamples=N_RESAMPLES)
    assert (split["diff"], split["low"], split["high"]) == pytest.approx((want.estimate, want.low, want.high))
    pooled = diff_row({d: "a" for d in docs}, docs)
    assert pooled["diff"] == pytest.approx(split["diff"]) and (pooled["low"], pooled["high"]) != (split["low"], split["high"])
    # A source with one document would carry no variance: the documents are pooled.
    lone = diff_row({"d0": "a", "d1": "a", "d2": "a", "d3": "b"}, docs)
    assert (lone["low"], lone["high"]) == pytest.approx((pooled["low"], pooled["high"]))


def test_documents_without_a_doc_record_are_unmeasured_for_new_tokens():
    summary = summarize(_document_records(with_doc=("d0", "d1")), n_resamples=N_RESAMPLES)
    new = _row(summary["loss"], length=N, arm="ridgefill", metric="new")
    assert (new["n_docs"], new["docs_unmeasured"]) == (2, 1)


def test_misaligned_scores_raise():
    records = _document_records(docs=("d0",))
    s = _scores("d0", "ridgefill")
    shifted = TokenScores(N - T - 1, s.token_ids, s.logprobs, s.top_ids, s.top_logprobs).to_json()
    records = [{**r, "scores": shifted} if r.get("arm") == "ridgefill" else r for r in records]
    with pytest.raises(ValueError, match="start"):
        summarize(records, n_resamples=N_RESAMPLES)


def test_agreement_top1_kl_and_difference_against_identity(summary):
    rows = summary["agreement"]
    rf = _row(rows, length=N, arm="ridgefill")
    assert (rf["n_docs"], rf["n_tokens"]) == (3, 3 * T)
    assert rf["top1"] == pytest.approx(45 / 48)
    assert rf["top1_doc_mean"] == pytest.approx((14 / 16 + 15 / 16 + 1) / 3)
    assert rf["kl_median"] == pytest.approx(0.0, abs=1e-9) and rf["kl_mean"] > 0
    assert rf["vs_identity_diff"] == pytest.approx((14 / 16 - 0 + 15 / 16 - 1 + 0) / 3)
    ident = _row(rows, length=N, arm="identity")
    assert ident["top1"] == pytest.approx(32 / 48) and ident["vs_identity_diff"] is None
    assert not [r for r in rows if r["arm"] == "exact"]


def test_splice_shares(summary):
    rows = summary["splice"]
    keys = _row(rows, length=N, arm="splice:keys", metric="key")
    assert (keys["n_docs"], keys["loss"], keys["ridgefill"], keys["exact"]) == (2, 2.0, 3.0, 1.0)
    assert keys["share"] == pytest.approx(0.5)
    assert _row(rows, length=N, arm="splice:values", metric="new")["share"] == pytest.approx(1.0)
    _, new_rf, _ = _loss_expected("ridgefill")
    _, new_s, _ = _loss_expected("splice:keys")
    expected = (np.mean(new_rf) - np.mean(new_s)) / (np.mean(new_rf) - 1.0)
    assert _row(rows, length=N, arm="splice:keys", metric="new")["share"] == pytest.approx(expected)
    assert not [r for r in rows if r["arm"] in ("splice:both", "splice:key_norm")]


def test_share_is_none_when_ridgefill_matches_exact():
    records = [r for r in _document_records() if r.get("arm") != "ridgefill"]
    for r in _document_records():
        if r["kind"] == "loss" and r["arm"] == "exact":
            records.append({**r, "arm": "ridgefill"})
    rows = summarize(records, n_resamples=N_RESAMPLES)["splice"]
    assert rows and all(r["share"] is None for r in rows)


def test_missing_everything_gives_empty_tables():
    summary = summarize([], n_resamples=N_RESAMPLES)
    assert summary["meta"] is None and summary["check"] is None
    assert all(summary[k] == [] for k in ("retrieval", "retrieval_diffs", "exact_rows", "loss", "loss_diffs",
                                          "agreement", "splice"))


# ----------------------------------------------------------------------------------------------- report


def test_report_files_and_text(tmp_path, summary, records):
    path = write_report(summary, tmp_path / "run", title="tiny, split 12", records=records)
    text = path.read_text()
    assert path.name == "REPORT.md"
    for png in ("retrieval_filled.png", "retrieval_depth.png", "loss.png", "splice.png"):
        assert (tmp_path / "run" / png).stat().st_size > 1000
        assert f"]({png})" in text
    assert text.index("byte-identical to stock on 5 prompts") < text.index("## Setup")
    assert "| 4096 | all | ridgefill | identity | 8 | +50.0 [" in text
    assert "75.0 [" in text
    conclusions = text.split("## What the numbers say")[1]
    assert "RidgeFill at least 20 points above identity: **met**" in conclusions
    assert "RidgeFill within 5 points of exact: **not met**" in conclusions
    assert "RidgeFill with rows within 2 points of exact: **met**" in conclusions
    assert "no fill with an equal-cost longer tail, filled-region retrieval: not measured." in conclusions
    assert "Key-token loss of RidgeFill below identity (nat): **met** (difference -2.000" in conclusions


def test_report_says_loudly_when_the_check_failed(tmp_path):
    failed = {**CHECK, "passed": False, "mismatches": ["prompt 3: token 17 differs"]}
    summary = summarize([META, failed], n_resamples=N_RESAMPLES)
    text = write_report(summary, tmp_path, title="t").read_text()
    assert "CHECK FAILED" in text and "prompt 3: token 17 differs" in text
    assert "not measured" in text and not list(tmp_path.glob("*.png"))


def test_render_results_md_rewrites_links(tmp_path, summary):
    dirs = [tmp_path / "runs" / "a", tmp_path / "runs" / "b"]
    for d, title in zip(dirs, ("model A", "model B")):
        write_report(summary, d, title=title)
    out = render_results_md(dirs, tmp_path / "docs" / "RESULTS.md", command="python -m sgl_ridgefill.eval.render x")
    text = out.read_text()
    assert text.startswith("# ") and "python -m sgl_ridgefill.eval.render x" in text
    # Each report's section is headed by its run's folder: runs of one model and split are told apart.
    assert "\n## a: model A" in text and "\n## b: model B" in text and "\n### Setup" in text
    assert "](../runs/a/retrieval_filled.png)" in text and "](../runs/b/splice.png)" in text
    assert (out.parent / "../runs/b/splice.png").exists()


def test_results_md_overview_has_a_row_per_run_and_length(tmp_path, summary):
    dirs = [tmp_path / "runs" / "a", tmp_path / "runs" / "b"]
    for d in dirs:
        write_report(summary, d, title="model")
    (dirs[0] / "summary.json").write_text(json.dumps(summary))  # b has none: left out of the overview
    text = render_results_md(dirs, tmp_path / "RESULTS.md", command="x").read_text()
    overview = text[text.index("## Overview"):text.index("\n## a: model")]
    rows = [line for line in overview.splitlines() if line.startswith("| a | tiny |")]  # the run, then the model
    assert len(rows) == 3  # lengths 64 (documents), 4096 and 8192 (needles)
    by_length = {row.split(" | ")[4]: row for row in rows}  # run, model, map kind, split, tokens
    assert all(row.startswith("| a | tiny | residual | 12/? |") for row in rows)  # a run written before map kinds
    # exact, ridgefill, identity, nofill (not run), ridgefill+rows, ridgefill+random; then RidgeFill - identity
    assert "| 8 | 100.0 | 75.0 | 25.0 | – | 100.0 | 50.0 | +50.0 [" in by_length["4096"]  # 4 samples x 2 tasks
    assert by_length["64"].endswith("| – | -2.00 [-2.00, -2.00] | 50 % |")
    assert "](results_overview.png)" in overview and (tmp_path / "results_overview.png").stat().st_size > 0
    (dirs[0] / "summary.json").unlink()
    text = render_results_md(dirs, tmp_path / "RESULTS.md", command="x").read_text()
    assert "## Overview" not in text and not (tmp_path / "results_overview.png").exists()


# ------------------------------------------------------------------------------------------ diagnostics


def test_per_layer_splices_name_their_layers_and_sit_beside_the_all_layer_splice(tmp_path):
    records = _document_records()
    records += [{**r, "arm": "splice:keys@13-17"} for r in records if r.get("arm") == "splice:keys"]
    summary = summarize(records, n_resamples=N_RESAMPLES)
    rows = summary["splice"]
    ranged = _row(rows, length=N, arm="splice:keys@13-17", metric="key")
    assert (ranged["kind"], ranged["layers"], ranged["share"]) == ("keys", "13-17", pytest.approx(0.5))
    assert _row(rows, length=N, arm="splice:keys", metric="key")["layers"] == "all"
    assert [r["arm"] for r in rows if r["metric"] == "key"] == ["splice:keys", "splice:keys@13-17", "splice:values"]
    text = write_report(summary, tmp_path / "run", title="t").read_text()
    assert f"| {N} | splice:keys@13-17 | 13-17 | key | 2 |" in text
    (tmp_path / "run" / "summary.json").write_text(json.dumps(summary))
    results = render_results_md([tmp_path / "run"], tmp_path / "RESULTS.md", command="x").read_text()
    assert "| 50 % (13-17: 50 %) |" in results


def test_needle_row_oracle_is_paired_against_ridgefill(tmp_path):
    scores = {"exact": (100, 100, 100, 100), "ridgefill": (0, 100, 0, 100),
              "ridgefill+needle-rows": (100, 100, 100, 0), "ridgefill+needle-random": (0, 100, 0, 0)}
    records = [{**_needle(4096, "t1", f"f{i}", arm, "filled", s, 500 + 100 * i), "exact_rows": 20 + i}
               for arm, values in scores.items() for i, s in enumerate(values) if arm != "exact"]
    records += [_needle(4096, "t1", f"f{i}", "exact", "filled", 100, 500 + 100 * i) for i in range(4)]
    summary = summarize(records, n_resamples=N_RESAMPLES)
    rows = summary["retrieval_diffs"]
    oracle = _row(rows, length=4096, arm="ridgefill+needle-rows", vs="ridgefill")
    assert (oracle["n"], oracle["diff"], oracle["b01"], oracle["b10"]) == (4, 25.0, 1, 2)
    assert _row(rows, length=4096, arm="ridgefill+needle-random", vs="ridgefill")["diff"] == -25.0
    assert _row(rows, length=4096, arm="ridgefill+needle-rows", vs="ridgefill+needle-random")["diff"] == 50.0
    assert _row(rows, length=4096, arm="ridgefill+needle-rows", vs="exact")["diff"] == -25.0
    # The rows the server ran, per arm (the exact arm reports none).
    assert [(r["arm"], r["n"], r["mean"], r["min"], r["max"]) for r in summary["exact_rows"]] == [
        (arm, 4, 21.5, 20, 23) for arm in ("ridgefill", "ridgefill+needle-rows", "ridgefill+needle-random")]
    text = write_report(summary, tmp_path, title="t").read_text()
    assert "| 4096 | ridgefill+needle-rows | 4 | 21.5 | 20 | 23 |" in text


def test_retrieval_is_broken_down_by_haystack(tmp_path):
    """noise: RidgeFill finds 1 of 4 needles, text: 3 of 4; exact finds all of them."""
    ridgefill = {"noise": (100, 0, 0, 0), "text": (100, 100, 100, 0)}
    records = []
    for haystack, scores in ridgefill.items():
        for i, score in enumerate(scores):
            sample = f"t1/{haystack}/4096/{i}/0"
            records.append({**_needle(4096, "t1", sample, "ridgefill", "filled", score, 500), "haystack": haystack})
            records.append({**_needle(4096, "t1", sample, "exact", "filled", 100, 500), "haystack": haystack})
        tail = f"t1/{haystack}/4096/9/0"
        records += [{**_needle(4096, "t1", tail, arm, "tail", 100, 3500), "haystack": haystack}
                    for arm in ("exact", "ridgefill")]
    summary = summarize(records, n_resamples=N_RESAMPLES)
    rows = summary["retrieval"]
    assert _row(rows, length=4096, task="all", arm="ridgefill", region="filled")["mean"] == 50.0
    noise = _row(rows, length=4096, task="all", haystack="noise", arm="ridgefill", region="filled")
    assert (noise["n"], noise["mean"]) == (4, 25.0)
    assert _row(rows, length=4096, task="all", haystack="text", arm="ridgefill", region="filled")["mean"] == 75.0
    assert _row(rows, length=4096, task="all", haystack="text", arm="ridgefill", region="tail")["n"] == 1
    assert not [r for r in rows if r["task"] != "all" and r["haystack"] != "all"]  # no task x haystack cross
    diffs = summary["retrieval_diffs"]
    assert _row(diffs, length=4096, arm="ridgefill", vs="exact")["diff"] == -50.0
    assert _row(diffs, length=4096, haystack="noise", arm="ridgefill", vs="exact")["diff"] == -75.0
    text_row = _row(diffs, length=4096, haystack="text", arm="ridgefill", vs="exact")
    assert (text_row["n"], text_row["diff"], text_row["b01"]) == (4, -25.0, 1)

    report = write_report(summary, tmp_path, title="t").read_text()
    filled = report[report.index("## Needle retrieval, filled region"):report.index("## Needle retrieval, tail")]
    assert "Per haystack (filled region" in filled
    assert "| noise | ridgefill | 25.0 [" in filled and "| text | ridgefill | 75.0 [" in filled
    tail = report[report.index("## Needle retrieval, tail"):report.index("## Paired retrieval")]
    assert "| noise | ridgefill | 100.0 (1) |" in tail  # one sample: no interval
    assert "| 4096 | noise | ridgefill | exact | 4 | -75.0 [" in report
    conclusions = report.split("## What the numbers say")[1]
    assert "- RidgeFill within 5 points of exact: **not met** (difference -50.0" in conclusions
    assert "  - noise haystack: **not met** (difference -75.0" in conclusions
    assert "  - text haystack: **not met** (difference -25.0" in conclusions
    # Summaries written before the breakdown (rows without "haystack") still render.
    old = {**summary, "retrieval": [{k: v for k, v in r.items() if k != "haystack"} for r in rows
                                    if r["haystack"] == "all"],
           "retrieval_diffs": [{k: v for k, v in r.items() if k != "haystack"} for r in diffs if r["haystack"] == "all"]}
    again = write_report(old, tmp_path / "old", title="t").read_text()
    assert "Per haystack" not in again and "| 4096 | all | ridgefill | exact | 8 | -50.0 [" in again


def test_each_samples_scores_are_kept_for_comparisons_across_runs(summary):
    samples = {(s["length"], s["task"], s["sample"]): s for s in summary["samples"]}
    f3 = samples[(4096, "t1", "f3")]
    assert f3["scores"]["ridgefill"] == 0.0 and f3["scores"]["exact"] == 100.0  # the later duplicate wins
    assert (f3["haystack"], f3["region"], f3["prompt_sha"]) == ("essays", "filled", None)  # records without a hash
    assert len(samples) == 2 * 6 + 2 * 2  # 4096: f0..f3, tl0, s0 per task; 8192: f0, f1 per task


def test_the_needle_row_oracle_is_read():
    from sgl_ridgefill.eval.markdown import signed
    from sgl_ridgefill.eval.report import _oracle_reading

    pts = signed(".1f")
    lever = _oracle_reading({"diff": 10.4, "low": 4.2, "high": 17.7, "n": 96},
                            {"diff": -3.1, "low": -8.3, "high": -1.0, "n": 96}, pts)
    assert lever.startswith("- Needle-row oracle: the needles' own rows exact minus as many random rows, filled-region "
                            "retrieval: +10.4 [+4.2, +17.7] points over 96 samples (needle rows exact minus exact: "
                            "-3.1 [-8.3, -1.0]): the needles' own keys are the lever")
    assert "haystack's keys" in _oracle_reading({"diff": 0.0, "low": 0.0, "high": 0.0, "n": 96}, None, pts)
    assert "do not say" in _oracle_reading({"diff": 2.0, "low": -1.0, "high": 5.0, "n": 96}, None, pts)


def test_needle_rows_the_selection_ran_exactly(tmp_path):
    """Records carry the needle rows the server watched and how many of them ran exactly: the summary says
    what share of the needle the selection found, in how many samples all of it, and the score either way."""
    watched = [(4, 4, 100), (4, 4, 100), (4, 2, 0), (4, 0, 100)]
    records = [{**_needle(4096, "t1", f"f{i}", "ridgefill+rows", "filled", s, 500 + 100 * i), "exact_rows": 30,
                "needle_rows": w, "needle_rows_exact": e} for i, (w, e, s) in enumerate(watched)]
    records += [_needle(4096, "t1", f"f{i}", "exact", "filled", 100, 500 + 100 * i) for i in range(4)]
    (row,) = summarize(records, n_resamples=N_RESAMPLES)["exact_rows"]
    assert (row["needle_share"], row["needle_whole"], row["needle_watched"]) == (0.625, 2, 4)
    assert (row["score_whole"], row["score_partial"]) == (100.0, 50.0)
    text = write_report(summarize(records, n_resamples=N_RESAMPLES), tmp_path, title="t").read_text()
    assert "| 4096 | ridgefill+rows | 4 | 30.0 | 30 | 30 | 62 % | 2 / 4 | 100.0 / 50.0 |" in text


def test_wall_time_counts_a_session_stopped_before_it_recorded_its_end(tmp_path):
    """A session killed mid-run (the machine taken away) never writes its session record: its requests carry
    the session and their time into it, so the run's wall time counts it up to its last finished request."""
    from sgl_ridgefill.eval.analysis import wall_time
    from sgl_ridgefill.eval.runner import ResultStore, session_record

    clock = iter([100.0, 160.0, 220.0, 1000.0, 1030.0, 1041.0]).__next__
    store = ResultStore(tmp_path / "results.jsonl", clock=clock)
    store.add({"kind": "meta", "model": "m", "split": 2, "tail": 8})
    store.add({**_needle(4096, "t1", "c0", "exact", "filled", 100, 500), "copied_from": "elsewhere"})
    store.begin_session()  # t = 100
    store.add(_needle(4096, "t1", "f0", "ridgefill", "filled", 100, 500))  # t = 160
    store.add(_needle(4096, "t1", "f1", "ridgefill", "filled", 100, 500))  # t = 220; then killed
    resumed = ResultStore(tmp_path / "results.jsonl", clock=clock)
    resumed.begin_session()  # t = 1000
    resumed.add(_needle(4096, "t1", "f2", "ridgefill", "filled", 100, 500))  # t = 1030
    resumed.add(resumed.end_session())  # t = 1041: this session's own record
    records = load_records(tmp_path / "results.jsonl")
    assert wall_time(records) == {"sessions": 2, "seconds": 161.0, "requests": 3, "stopped": 1}
    report = write_report(summarize(records, n_resamples=N_RESAMPLES), tmp_path, title="t", records=records).read_text()
    assert ("| wall time | 2.7 min in 2 session(s), 3 request(s); 1 session stopped early, counted to its last "
            "request |") in report
    assert session_record(1.0, 0)["kind"] == "session"


def test_wall_time_names_the_requests_of_older_stopped_sessions_it_cannot_time(tmp_path):
    """Records from before sessions were named: the requests just before a session record are its own (its
    count of them); those before them ran in sessions stopped before their end, whose wall time is lost: the
    report says how many and what the requests alone took."""
    from sgl_ridgefill.eval.analysis import wall_time

    lost = [{**_needle(4096, "t1", f"a{i}", "ridgefill", "filled", 100, 500), "seconds": 30.0} for i in range(4)]
    kept = [{**_needle(4096, "t1", f"b{i}", "ridgefill", "filled", 100, 500), "seconds": 20.0} for i in range(2)]
    records = [{"kind": "meta"}, *lost, *kept, {"kind": "session", "seconds": 60.0, "requests": 2}]
    assert wall_time(records) == {"sessions": 1, "seconds": 60.0, "requests": 2, "untimed_requests": 4,
                                  "untimed_request_seconds": 120.0}
    text = write_report(summarize(records, n_resamples=N_RESAMPLES), tmp_path, title="t", records=records).read_text()
    assert ("| wall time | 1.0 min in 1 session(s), 2 request(s); 4 more request(s) ran in sessions stopped before "
            "wall time was kept per request (2.0 min of request time) |") in text


def test_progress_counts_the_requests_done_against_the_latest_plan_at_the_sessions_own_pace(tmp_path):
    """What ``results --list`` says is left of a run: every arm of every sample the latest session planned, the
    distinct requests done (copied exact records included), and the seconds between one request and the next
    in a session (the servers' start left out)."""
    from sgl_ridgefill.eval.analysis import progress
    from sgl_ridgefill.eval.runner import ResultStore, plan_record

    clock = iter([0.0, 300.0, 330.0, 360.0, 2000.0, 2500.0, 2540.0, 2541.0]).__next__
    store = ResultStore(tmp_path / "results.jsonl", clock=clock)
    store.add({"kind": "meta", "model": "m", "split": 2, "tail": 8})
    assert progress(load_records(tmp_path / "results.jsonl")) is None  # nothing planned yet
    store.add({**_needle(4096, "t1", "c0", "exact", "filled", 100, 500), "copied_from": "elsewhere"})
    store.begin_session()  # t = 0
    store.add(plan_record(requests=8, pending=7))
    store.add(_needle(4096, "t1", "f0", "ridgefill", "filled", 100, 500))  # t = 300: the servers started first
    assert progress(load_records(tmp_path / "results.jsonl")) == {"requests": 8, "done": 2, "pace": None}
    store.add(_needle(4096, "t1", "f1", "ridgefill", "filled", 100, 500))  # t = 330
    store.add(_needle(4096, "t1", "f2", "ridgefill", "filled", 100, 500))  # t = 360; then killed
    resumed = ResultStore(tmp_path / "results.jsonl", clock=clock)
    resumed.begin_session()  # t = 2000
    resumed.add(plan_record(requests=8, pending=5))
    resumed.add(_needle(4096, "t1", "f2", "ridgefill", "filled", 100, 500))  # t = 2500: the same request again
    resumed.add(_needle(4096, "t1", "f3", "ridgefill", "filled", 100, 500))  # t = 2540
    assert progress(load_records(tmp_path / "results.jsonl")) == {"requests": 8, "done": 5, "pace": 100 / 3}
    assert summarize(load_records(tmp_path / "results.jsonl"), n_resamples=N_RESAMPLES)["retrieval"]  # plan: ignored


def test_a_run_resumed_on_another_cpu_says_how_many_requests_each_cpu_measured(tmp_path):
    """Each session's plan names the CPU it runs on; where a run's requests ran on more than one, its wall time
    (and the report) says how many each measured, since the times per request are not one machine's."""
    from sgl_ridgefill.eval.analysis import wall_time
    from sgl_ridgefill.eval.runner import ResultStore, plan_record

    clock = iter([0.0, 30.0, 60.0, 70.0, 1000.0, 1200.0, 1210.0]).__next__
    store = ResultStore(tmp_path / "results.jsonl", clock=clock)
    store.add({"kind": "meta", "model": "m", "split": 2, "tail": 8, "cpu": "Xeon", "cpu_capability": "AVX512"})
    store.begin_session()  # t = 0
    store.add(plan_record(requests=3, pending=3, cpu={"cpu": "Xeon", "cpu_capability": "AVX512"}))
    store.add(_needle(4096, "t1", "f0", "ridgefill", "filled", 100, 500))  # t = 30
    store.add(_needle(4096, "t1", "f1", "ridgefill", "filled", 100, 500))  # t = 60
    store.add(store.end_session())  # t = 70
    assert "cpus" not in wall_time(load_records(tmp_path / "results.jsonl"))  # one CPU: the setup names it
    resumed = ResultStore(tmp_path / "results.jsonl", clock=clock)
    resumed.begin_session()  # t = 1000
    resumed.add(plan_record(requests=3, pending=1, cpu={"cpu": "EPYC", "cpu_capability": "AVX2"}))
    resumed.add(_needle(4096, "t1", "f2", "ridgefill", "filled", 100, 500))  # t = 1200
    resumed.add(resumed.end_session())  # t = 1210
    records = load_records(tmp_path / "results.jsonl")
    assert wall_time(records)["cpus"] == {"Xeon (AVX512)": 2, "EPYC (AVX2)": 1}
    report = write_report(summarize(records, n_resamples=N_RESAMPLES), tmp_path, title="t", records=records).read_text()
    assert "| wall time | 4.7 min in 2 session(s), 3 request(s); requests by CPU: Xeon (AVX512) 2, EPYC (AVX2) 1 |" in report


def test_wall_time_adds_up_every_session_of_a_resumed_run(tmp_path):
    from sgl_ridgefill.eval.analysis import wall_time
    from sgl_ridgefill.eval.runner import ResultStore, session_record

    assert wall_time([{"kind": "meta"}]) is None  # a run from before sessions were recorded
    store = ResultStore(tmp_path / "results.jsonl")
    store.add({"kind": "meta", "model": "m", "split": 2, "tail": 8})
    store.add(session_record(90.04, 3))
    store.add(session_record(30.0, 1))  # resumed
    records = load_records(tmp_path / "results.jsonl")
    assert wall_time(records) == {"sessions": 2, "seconds": 120.0, "requests": 4}
    summary = summarize(records, n_resamples=N_RESAMPLES)
    assert summary["wall"] == {"sessions": 2, "seconds": 120.0, "requests": 4}
    report = write_report(summary, tmp_path, title="t", records=records).read_text()
    assert "| wall time | 2.0 min in 2 session(s), 4 request(s) |" in report


def _resumed_with_fingerprinted_maps(tmp_path, first_plan):
    """Records of a run: two requests in a session that recorded ``first_plan``, then one in a resumed
    session whose plan names its CPU (bfloat16 matmuls through float32) and its maps' fingerprint."""
    from sgl_ridgefill.eval.runner import ResultStore, plan_record

    clock = iter([0.0, 30.0, 60.0, 70.0, 1000.0, 1200.0, 1210.0]).__next__
    store = ResultStore(tmp_path / "results.jsonl", clock=clock)
    store.add({"kind": "meta", "model": "m", "split": 2, "tail": 8, "cpu": "Xeon", "cpu_capability": "AVX512"})
    store.begin_session()
    store.add(first_plan)
    store.add(_needle(4096, "t1", "f0", "ridgefill", "filled", 100, 500))
    store.add(_needle(4096, "t1", "f1", "ridgefill", "filled", 100, 500))
    store.add(store.end_session())
    resumed = ResultStore(tmp_path / "results.jsonl", clock=clock)
    resumed.begin_session()
    resumed.add(plan_record(requests=3, pending=1, cpu={"cpu": "Xeon", "cpu_capability": "AVX512",
                                                        "bf16_matmuls": "through float32"},
                            maps={"sha256": "0123456789abcdef", "heldout_r2": 0.8523}))
    resumed.add(_needle(4096, "t1", "f2", "ridgefill", "filled", 100, 500))
    resumed.add(resumed.end_session())
    return load_records(tmp_path / "results.jsonl")


def test_a_run_resumed_with_maps_fitted_again_says_which_maps_measured_which_requests(tmp_path):
    """Maps are fitted again wherever a run resumes (they live in the machine's cache): each session's plan
    carries the maps' fingerprint and where its bfloat16 matmuls ran, and where the sessions differ the wall
    time (and the report) says how many requests each measured, so a resumed run is not read as one fit's."""
    from sgl_ridgefill.eval.analysis import wall_time
    from sgl_ridgefill.eval.runner import plan_record

    before_fingerprints = plan_record(requests=3, pending=3, cpu={"cpu": "Xeon", "cpu_capability": "AVX512"})
    records = _resumed_with_fingerprinted_maps(tmp_path, before_fingerprints)
    wall = wall_time(records)
    assert wall["cpus"] == {"Xeon (AVX512)": 2, "Xeon (AVX512; bfloat16 matmuls through float32)": 1}
    assert wall["maps"] == {"not recorded": 2, "0123456789abcdef (held-out R² 0.8523)": 1}
    report = write_report(summarize(records, n_resamples=N_RESAMPLES), tmp_path, title="t", records=records).read_text()
    assert ("requests by CPU: Xeon (AVX512) 2, Xeon (AVX512; bfloat16 matmuls through float32) 1; requests by maps: "
            "not recorded 2, 0123456789abcdef (held-out R² 0.8523) 1 |") in report


def test_one_fit_of_the_maps_is_not_listed(tmp_path):
    from sgl_ridgefill.eval.analysis import wall_time
    from sgl_ridgefill.eval.runner import ResultStore, plan_record

    clock = iter([0.0, 30.0, 70.0, 1000.0, 1200.0, 1210.0]).__next__
    store = ResultStore(tmp_path / "results.jsonl", clock=clock)
    maps = {"sha256": "0123456789abcdef", "heldout_r2": 0.8523}
    for name in ("f0", "f1"):
        store.begin_session()
        store.add(plan_record(requests=2, pending=1, maps=maps))
        store.add(_needle(4096, "t1", name, "ridgefill", "filled", 100, 500))
        store.add(store.end_session())
    assert "maps" not in wall_time(load_records(tmp_path / "results.jsonl"))


def test_requests_from_before_plans_named_their_machine_and_maps_are_counted_as_not_recorded(tmp_path):
    """A run begun before plans named their session (its requests then carried no record of the CPU or the
    maps) and resumed with a plan that does: the report counts the earlier requests as not recorded rather
    than leaving the breakdown out, so the resumed session's figures are not read as the whole run's."""
    from sgl_ridgefill.eval.analysis import wall_time

    older_plan = {"kind": "plan", "requests": 3, "pending": 3}  # no session, CPU or maps
    wall = wall_time(_resumed_with_fingerprinted_maps(tmp_path, older_plan))
    assert wall["cpus"] == {"not recorded": 2, "Xeon (AVX512; bfloat16 matmuls through float32)": 1}
    assert wall["maps"] == {"not recorded": 2, "0123456789abcdef (held-out R² 0.8523)": 1}
