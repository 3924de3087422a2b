"""``python -m sgl_ridgefill.eval.results --report-only``: reports rewritten from raw results, then joined."""

from __future__ import annotations

import json

from sgl_ridgefill.eval import results
from tests.eval.test_analysis import CHECK, META, _document_records, _needle_records


def test_report_only_rewrites_reports_from_raw_results_and_joins_them(tmp_path, capsys):
    runs, docs = tmp_path / "runs", tmp_path / "docs"
    first, second = results.RUNS[0].name, results.RUNS[1].name
    (runs / first).mkdir(parents=True)
    records = [META, CHECK, *_needle_records(), *_document_records()]
    (runs / first / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))

    assert results.main(["--runs-dir", str(runs), "--docs", str(docs), "--only", f"{first},{second}",
                         "--report-only"]) == 0
    assert f"{second}: no results" in capsys.readouterr().out
    report = docs / "results" / first / "REPORT.md"
    assert "byte-identical" in report.read_text()
    assert (docs / "results" / first / "summary.json").exists() and not (docs / "results" / second).exists()
    assert f"results/{first}/" in (docs / "RESULTS.md").read_text()
    assert not (runs / "maps").exists()  # nothing fitted, no server started


def test_the_split_comparison_renders_from_partial_results_with_runs_not_made_as_not_run(tmp_path, capsys):
    """A choose-split run stopped early (no stock check yet, two samples, no loss) still gets its report and
    its row; the runs never started read "not run"."""
    runs, docs = tmp_path / "runs", tmp_path / "docs"
    group = [r for r in results.RUNS if r.group == results.CHOOSE_SPLIT]
    first = group[0]
    meta = {"kind": "meta", "model": first.model, "split": first.split, "tail": 1024, "num_layers": 24,
            "lengths": [4096], "map_kind": "residual", "rows_fraction": 0.1, "preset": "quality"}
    needles = [{"kind": "needle", "length": 4096, "task": "niah_single", "haystack": "noise", "sample": f"s{i}",
                "prompt_sha": f"h{i}", "arm": arm, "region": "filled", "depth": 0.2, "position": 800,
                "score": 100.0 if arm == "exact" or i == 0 else 0.0, "output": " 1234568.", "answers": ["1234567"],
                "seconds": 1.0} for i in range(2) for arm in ("exact", "ridgefill")]
    (runs / first.name).mkdir(parents=True)
    (runs / first.name / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [meta, *needles]))

    assert results.main(["--runs-dir", str(runs), "--docs", str(docs), "--only-group", results.CHOOSE_SPLIT,
                         "--report-only"]) == 0
    out = capsys.readouterr().out
    assert all(f"{r.name}: no results" in out for r in group[1:])
    text = (docs / "RESULTS.md").read_text()
    section = text[text.index("## Choosing the split"):]
    assert (f"| {first.model} | residual | 12/24 | 4096 | attention 10 % | 2 | 100.0 [100.0, 100.0] | "
            "50.0 [0.0, 100.0] | – |") in section
    for run in group[1:]:
        rows = f"`{run.rows_select}`" if run.rows_select else "attention 10 %"
        assert f"| {run.model} | {run.map_kind} | {run.split} | 4096 | {rows} | not run |" in section
    assert "Check not run" in (docs / "results" / first.name / "REPORT.md").read_text()


def test_run_definitions_name_their_maps_kind_and_split():
    group = {r.name: r for r in results.RUNS if r.group == results.CHOOSE_SPLIT}
    assert {(r.model, r.map_kind, r.split) for r in group.values()} == {
        ("qwen2.5-coder-0.5b", kind, split) for kind, split in (
            ("residual", 12), ("residual", 14), ("residual", 16), ("normalised", 12), ("kv", 12), ("kv+context", 12))
    } | {("smollm2-135m", "residual", 15), ("smollm2-135m", "kv+context", 15)}
    assert next(iter(group)).startswith("qwen2.5-0.5b-residual-s12")  # the reference runs first
    residual = [r for r in group.values() if r.map_kind == "residual" and r.model == "qwen2.5-coder-0.5b"]
    assert {r.maps_name() for r in residual} == {"qwen2.5-coder-0.5b-s12-14-16-200k"}  # one calibration pass
    kv = group["qwen2.5-0.5b-kv-context-s12-q"]
    assert kv.maps_name() == "qwen2.5-coder-0.5b-kv-context-s12-14-16-200k"
    assert {r.stats_name() for r in group.values()} == {  # one statistics pass per model
        "qwen2.5-coder-0.5b-s12-14-16-200k", "smollm2-135m-s15-200k"}
    maps, stats = results.pathlib.Path("/m"), results.pathlib.Path("/s")
    collect, fit = kv.calibrate_commands(maps, stats)
    assert collect[4:] == ["stats", "--model", "qwen2.5-coder-0.5b", "--corpus", "builtin", "--splits", "12,14,16",
                           "--max-tokens", "200000", "--kinds", "all", "--stats", "/s"]
    assert fit[4:] == ["fit", "--stats", "/s", "--kind", "kv+context", "--out", "/m", "--force"]
    old_run = next(r for r in results.RUNS if r.group != results.CHOOSE_SPLIT)
    (one,) = old_run.calibrate_commands(maps, stats)
    assert "--kind" not in one and "--kinds" not in one and one[-3:] == ["--out", "/m", "--force"]
    assert all("--preset" in r.extra and "quality" in r.extra for r in group.values())
    needle_arms = {name: r.extra[r.extra.index("--needle-arms") + 1] for name, r in group.items()}
    oracle = {name for name, arms in needle_arms.items() if "ridgefill+needle-rows" in arms}
    assert oracle == {"qwen2.5-0.5b-residual-s12-q", "qwen2.5-0.5b-kv-context-s12-q"}  # the reference and the best kind
    lexical = group["qwen2.5-0.5b-kv-context-s12-lexical-q"]
    assert lexical.rows_select == results.LEXICAL_ROWS and kv.rows_select is None
    assert lexical.maps_name() == kv.maps_name()  # the same maps, another rows selection
    pooled = {name: r for name, r in group.items() if r.rows_select == results.POOLED_ROWS}
    assert set(pooled) == {"qwen2.5-0.5b-kv-context-s12-pooled-q", "qwen2.5-0.5b-residual-s12-pooled-q",
                           "smollm2-135m-kv-context-s15-pooled-q", "qwen2.5-0.5b-kv-context-s12-pooled-fresh-q"}
    assert "pool=8" in results.POOLED_ROWS and pooled["qwen2.5-0.5b-kv-context-s12-pooled-q"].maps_name() == kv.maps_name()
    import pytest

    with pytest.raises(ValueError, match="map kind 'linear' is not one of"):
        results.Run("x", "m", (12,), 12, (4096,), map_kind="linear")
    with pytest.raises(ValueError, match="split 14 is not among its maps' splits"):
        results.Run("x", "m", (12,), 14, (4096,))


def test_list_prints_each_runs_commands(tmp_path, capsys):
    assert results.main(["--runs-dir", str(tmp_path), "--only-group", results.CHOOSE_SPLIT, "--list"]) == 0
    out = capsys.readouterr().out
    assert out.count("sgl_ridgefill.cli calibrate stats") == 14 and out.count("sgl_ridgefill.cli calibrate fit") == 14
    assert out.count("--preset quality") == 14 and out.count("--rows-select") == 6
    assert "--splits 12,14,16" in out and "fit --stats" in out and "--kind kv+context" in out
    assert not (tmp_path / "maps").exists()


def test_a_group_run_reuses_the_exact_arm_of_the_siblings_made_so_far(tmp_path, capsys):
    group = [r for r in results.RUNS if r.group == results.CHOOSE_SPLIT]
    first, second = group[0], group[1]
    assert results.exact_sources(first, results.RUNS, tmp_path) == ()
    (tmp_path / second.name).mkdir()
    (tmp_path / second.name / "results.jsonl").write_text("")
    assert results.exact_sources(first, results.RUNS, tmp_path) == (tmp_path / second.name,)
    assert results.exact_sources(second, results.RUNS, tmp_path) == ()  # never itself
    outside = next(r for r in results.RUNS if not r.group)
    assert results.exact_sources(outside, results.RUNS, tmp_path) == ()
    other_model = next(r for r in group if r.model != first.model)
    assert results.exact_sources(other_model, results.RUNS, tmp_path) == ()
    command = first.eval_command(tmp_path / "m", tmp_path / first.name, exact_from=(tmp_path / second.name,))
    assert command[-2:] == ["--exact-from", str(tmp_path / second.name)]
    assert "--exact-from" not in first.eval_command(tmp_path / "m", tmp_path / first.name, report_only=True,
                                                    exact_from=(tmp_path / second.name,))
    assert results.main(["--runs-dir", str(tmp_path), "--only", first.name, "--list"]) == 0
    assert f"--exact-from {tmp_path / second.name}" in capsys.readouterr().out


def test_the_list_says_what_is_left_of_each_run(tmp_path):
    import os

    from sgl_ridgefill.eval.results import RUNS, run_status

    run, runs, docs = RUNS[0], tmp_path / "runs", tmp_path / "docs"
    assert run_status(run, runs, docs) == "not started"
    (docs / "results" / run.name).mkdir(parents=True)
    (docs / "results" / run.name / "REPORT.md").write_text("r")
    assert run_status(run, runs, docs) == "reported; raw results not on this machine"
    (runs / run.name).mkdir(parents=True)
    results = runs / run.name / "results.jsonl"
    results.write_text('{"kind": "meta"}\n{"kind": "check"}\n')  # a run from before plans were recorded
    assert run_status(run, runs, docs) == "started: 2 records so far (rerun to resume)"
    results.write_text('{"kind": "meta"}\n{}\n{"kind": "check"}\n')
    assert run_status(run, runs, docs) == (f"started: 3 records so far (rerun to resume; unreadable: {results}:2: a "
                                           "record must be a JSON object with a 'kind', got '{}')")
    results.write_text('{"kind": "meta"}\n{"kind": "check"}\n')
    (runs / run.name / "REPORT.md").write_text("r")
    os.utime(results, (1, 1))
    assert run_status(run, runs, docs) == "done: 2 records, reported"


def test_the_list_says_how_many_requests_are_left_and_about_how_long_they_take(tmp_path):
    import json

    from sgl_ridgefill.eval.results import RUNS, run_status
    from sgl_ridgefill.eval.runner import plan_record

    run, runs, docs = RUNS[0], tmp_path / "runs", tmp_path / "docs"
    needle = {"kind": "needle", "length": 4096, "task": "t", "arm": "exact", "session": "s"}
    records = [{"kind": "meta"}, plan_record(requests=336, pending=336),
               *({**needle, "sample": f"x{i}", "at": 100.0 + 36 * i} for i in range(6))]
    kept = docs / "results" / run.name / results.RAW
    kept.parent.mkdir(parents=True)
    kept.write_text("".join(json.dumps(r) + "\n" for r in records))
    assert run_status(run, runs, docs) == ("6 of 336 requests kept in the repository (330 left, about 3.3 h at 36 s "
                                           "each; rerun to resume or finish)")
    (runs / run.name).mkdir(parents=True)
    (runs / run.name / results.RAW).write_text(kept.read_text())
    assert run_status(run, runs, docs) == ("started: 6 of 336 requests (330 left, about 3.3 h at 36 s each; rerun "
                                           "to resume)")


def test_the_list_says_when_this_cpu_would_take_longer_for_a_bfloat16_run(tmp_path, monkeypatch):
    """The pace is the recording machine's; a bfloat16 run resumed on a CPU without native bfloat16 keeps its
    dtype and runs its matmuls in software, which the list says beside it."""
    import json

    from sgl_ridgefill.cpu import dtype as cpu_dtype
    from sgl_ridgefill.eval.runner import plan_record

    run, docs = results.RUNS[0], tmp_path / "docs"
    needle = {"kind": "needle", "length": 4096, "task": "t", "arm": "exact", "session": "s"}
    records = [{"kind": "meta", "dtype": "bfloat16", "cpu": "Xeon", "cpu_capability": "AVX512"},
               plan_record(requests=10, pending=10),
               *({**needle, "sample": f"x{i}", "at": 100.0 + 36 * i} for i in range(6))]
    kept = docs / "results" / run.name / results.RAW
    kept.parent.mkdir(parents=True)
    kept.write_text("".join(json.dumps(r) + "\n" for r in records))
    monkeypatch.setattr(cpu_dtype, "native_bf16", lambda features=None: False)
    assert results.run_status(run, tmp_path / "runs", docs) == (
        "6 of 10 requests kept in the repository (4 left, about 2 min at 36 s each, Xeon (AVX512)'s pace: this CPU has "
        "no native bfloat16 and runs the run's bfloat16 matmuls through float32, ~1.2x its own float32's time; rerun "
        "to resume or finish)")
    monkeypatch.setattr(cpu_dtype, "native_bf16", lambda features=None: True)
    assert "this CPU" not in results.run_status(run, tmp_path / "runs", docs)


def test_a_run_resumes_from_the_records_the_repository_keeps(tmp_path, monkeypatch):
    """A run stopped on one machine: its records are kept beside its report, seed the next machine's results
    folder, serve as a sibling's exact arm, and go back to the repository with the report."""
    docs, runs = tmp_path / "docs", tmp_path / "runs"
    group = [r for r in results.RUNS if r.group == results.SELECTION_LAYERS and r.model == "smollm2-135m"]
    first, second = group[0], group[1]
    kept = docs / "results" / first.name / results.RAW
    kept.parent.mkdir(parents=True)
    kept.write_text('{"kind": "meta"}\n{"kind": "session", "seconds": 1.0, "requests": 0}\n')
    assert "2 records kept in the repository" in results.run_status(first, runs, docs)
    assert results.exact_sources(second, results.RUNS, runs, docs) == (kept.parent,)
    (runs / "maps" / first.maps_name()).mkdir(parents=True)
    (runs / "maps" / first.maps_name() / "manifest.json").write_text("{}")
    ran = []

    def fake_eval(cmd, ok=(0,)):  # the eval appends a record and writes its report
        ran.append(cmd)
        out = runs / first.name
        with (out / results.RAW).open("a") as f:
            f.write('{"kind": "session", "seconds": 2.0, "requests": 1}\n')
        (out / "REPORT.md").write_text("# r\n")

    monkeypatch.setattr(results, "_sh", fake_eval)
    results.run_one(first, runs, docs)
    assert len(ran) == 1 and (runs / first.name / results.RAW).read_text().count("\n") == 3
    assert kept.read_text() == (runs / first.name / results.RAW).read_text()
    assert (docs / "results" / first.name / "REPORT.md").exists()


def test_maps_fitted_again_for_a_resumed_run_are_fitted_in_the_dtype_its_records_were_measured_in(tmp_path, monkeypatch, capsys):
    """On a machine whose CPU would pick another dtype, the maps a resumed run needs are fitted from the same
    dtype's activations as those its records read; so are a new run's whose exact arm comes from a sibling."""
    docs, runs = tmp_path / "docs", tmp_path / "runs"
    run = next(r for r in results.RUNS if r.name == "qwen2.5-0.5b-s12-16k-longdocs-q")
    fresh = next(r for r in results.RUNS if r.name == "qwen2.5-0.5b-s12-32k-q")
    kept = docs / "results" / run.name / results.RAW
    kept.parent.mkdir(parents=True)
    kept.write_text('{"kind": "meta", "dtype": "bfloat16"}\n')
    ran = []

    def fake(cmd, ok=(0,)):
        ran.append(cmd)
        (runs / fresh.name).mkdir(parents=True, exist_ok=True)

    monkeypatch.setattr(results, "_sh", fake)
    results.run_one(run, runs, docs)
    results.run_one(fresh, runs, docs)
    calibrate = [c for c in ran if c[3] == "calibrate"]
    assert [c[c.index("--dtype") + 1] if "--dtype" in c else None for c in calibrate] == ["bfloat16", "bfloat16"]
    # A run not started fits its maps in its own CPU's dtype, unless it reuses a sibling's exact arm: then in
    # that arm's dtype, which its answers are paired with.
    assert results.recorded_dtype(fresh, tmp_path / "no-runs", tmp_path / "no-docs") is None
    alone = next(r for r in results.RUNS if not r.group)
    assert results.recorded_dtype(alone, runs, docs) is None
    assert results.main(["--list", "--only", run.name, "--runs-dir", str(tmp_path / "elsewhere"), "--docs", str(docs)]) == 0
    assert "--max-tokens 200000 --dtype bfloat16" in capsys.readouterr().out


def test_the_selection_layer_runs_read_their_own_layers_below_the_split(tmp_path):
    group = [r for r in results.RUNS if r.group == results.SELECTION_LAYERS]
    layer_names = [f"smollm2-135m-kv-context-s15-l{'-'.join(map(str, l))}-q" for l in results.SMOL_LAYER_SETS]
    smol = [r for r in group if r.name in layer_names]
    assert [r.name for r in smol] == layer_names
    # The shipped selection with a reserve inside its budget, paired with the layer runs' exact arm.
    reserves = [r for r in group if r.model == "smollm2-135m" and r.name not in layer_names]
    assert [r.name for r in reserves] == ["smollm2-135m-kv-context-s15-l3-7-11-digits-q",
                                          "smollm2-135m-kv-context-s15-l3-7-11-lexical-q"]
    for run, reserve in zip(reserves, ("digits() up to 3%", "lexical_net() up to 3%")):
        assert run.rows_select == results.POOLED_TAIL_ROWS + " reserve " + reserve
        assert run.extra[run.extra.index("--needle-arms") + 1] == "ridgefill+rows"
        assert run.map_kind == "kv+context" and run.split == 15
        sources = results.exact_sources(run, results.RUNS, tmp_path, results.REPO_DOCS)
        assert results.REPO_DOCS / "results" / "smollm2-135m-kv-context-s15-l3-7-11-q" in sources
    for run, layers in zip(smol, results.SMOL_LAYER_SETS):
        shown = f"layers=[{', '.join(map(str, layers))}]"
        assert run.rows_select.count(shown) == 2 and max(layers) < run.split and run.map_kind == "kv+context"
    assert results.POOLED_TAIL_ROWS == results.pooled_tail_rows((3, 7, 11))
    assert [("exact" in r.extra[r.extra.index("--needle-arms") + 1]) for r in smol] == [True, False, False]
    # Qwen2.5-Coder-1.5B: its shipped-selection run holds the exact arm its layer runs are paired with.
    qwen = [r for r in group if r.model == "qwen2.5-coder-1.5b"]
    assert [r.name for r in qwen] == ["qwen2.5-1.5b-s14-q"] + [
        f"qwen2.5-1.5b-s14-l{'-'.join(map(str, l))}-q" for l in results.QWEN_1_5B_LAYER_SETS] + [
        "qwen2.5-1.5b-s14-l3-7-11-lexical-q", "qwen2.5-1.5b-s14-l3-7-11-sentence-q"]
    # The shipped layers with the lexical reserve that held SmolLM2's prose needles.
    assert qwen[-2].rows_select == results.POOLED_TAIL_ROWS + " reserve lexical_net() up to 3%"
    # ... and with every short sentence taken whole behind its peak, in both of the selection's rankings.
    assert qwen[-1].rows_select == results.sentence_rows() == results.POOLED_TAIL_ROWS.replace(
        "pool=8)", "pool=8, sentence=32)")
    assert qwen[-1].rows_select.count("sentence=32") == 2
    for run, layers in zip(qwen[1:], [*results.QWEN_1_5B_LAYER_SETS, (3, 7, 11), (3, 7, 11)]):
        shown = f"layers=[{', '.join(map(str, layers))}]"
        assert run.rows_select.count(shown) == 2 and max(layers) < run.split
        assert run.extra[run.extra.index("--needle-arms") + 1] == "ridgefill+rows"
        # Paired with the shared run's exact arm (a sibling layer run already in the repository may add its own).
        sources = results.exact_sources(run, results.RUNS, tmp_path, results.REPO_DOCS)
        assert sources[0] == results.REPO_DOCS / "results" / "qwen2.5-1.5b-s14-q"
        assert all(s.name.startswith("qwen2.5-1.5b-s14-") and s.name != run.name for s in sources)


def test_the_first_models_length_runs_measure_the_split_and_selection_its_shipped_policy_makes():
    from sgl_ridgefill.eval.arms import rows_policy_text
    from sgl_ridgefill.policy import MapsInfo, ModelInfo, builtin_policy_path, compile_policy, load_policy, parse_policy

    target = {"maps": MapsInfo((6, 12, 14), 12, 24), "model": ModelInfo.dense(24)}
    shipped = compile_policy(load_policy(builtin_policy_path("qwen2.5-0.5b-rows")), **target)
    by_name = {r.name: r for r in results.RUNS}
    for name in ("qwen2.5-0.5b-s14-16k-q", "qwen2.5-0.5b-s14-32k-q"):
        run = by_name[name]
        (length,) = run.lengths
        assert shipped.split_for(length) == run.split and shipped.tail == results.TAIL
        text = rows_policy_text(run.split, results.TAIL, run.rows_select)
        assert compile_policy(parse_policy(text, "r.rfpolicy"), **target).selection == shipped.selection


def test_the_second_model_at_8k_measures_the_selection_its_shipped_policy_makes():
    from sgl_ridgefill.eval.arms import rows_policy_text
    from sgl_ridgefill.policy import MapsInfo, ModelInfo, builtin_policy_path, compile_policy, load_policy, parse_policy

    run = next(r for r in results.RUNS if r.name == "qwen2.5-1.5b-s14-8k-q")
    assert run.lengths == (8192,) and run.split == 14
    assert run.extra[run.extra.index("--needle-arms") + 1] == "exact,ridgefill,ridgefill+rows"
    target = {"maps": MapsInfo((14,), 14, 28), "model": ModelInfo.dense(28)}
    shipped = compile_policy(load_policy(builtin_policy_path("qwen2.5-1.5b-rows")), **target)
    assert (shipped.split, shipped.tail) == (run.split, results.TAIL)

    def selection(select: str):
        return compile_policy(parse_policy(rows_policy_text(14, results.TAIL, select), "r.rfpolicy"), **target).selection

    assert selection(run.rows_select) == shipped.selection
    # At 4K the policy's selection is the lexical-reserve run's; the first 4K run measured it without the reserve.
    by_name = {r.name: r for r in results.RUNS}
    assert selection(by_name["qwen2.5-1.5b-s14-l3-7-11-lexical-q"].rows_select) == shipped.selection
    assert selection(by_name["qwen2.5-1.5b-s14-q"].rows_select) != shipped.selection
    assert selection(results.reserve_rows(results.QWEN_1_5B_SHIPPED_RESERVE)) == shipped.selection


def test_the_length_runs_and_maps_fitted_on_long_documents(tmp_path):
    import pytest

    group = {r.name: r for r in results.RUNS if r.group == results.LENGTH}
    assert set(group) == {"qwen2.5-0.5b-s12-16k-q", "qwen2.5-0.5b-s12-16k-longdocs-q", "qwen2.5-0.5b-s12-32k-q",
                          "qwen2.5-0.5b-s12-16k-loss-q", "qwen2.5-0.5b-s12-16k-sentence-q", "qwen2.5-0.5b-s14-16k-q",
                          "qwen2.5-0.5b-s12-16k-lexical-q", "qwen2.5-0.5b-s14-32k-q"}
    # The shipped selection at split 14: its rows arm on the 16K prompts, maps of its own split, the 16K exact arm.
    deeper = group["qwen2.5-0.5b-s14-16k-q"]
    assert deeper.split == 14 and deeper.lengths == (16384,) and deeper.rows_select == results.POOLED_TAIL_ROWS
    assert deeper.extra[deeper.extra.index("--needle-arms") + 1] == "ridgefill+rows"
    assert deeper.maps_name() != group["qwen2.5-0.5b-s12-16k-q"].maps_name()
    assert results.REPO_DOCS / "results" / "qwen2.5-0.5b-s12-16k-q" in results.exact_sources(
        deeper, results.RUNS, tmp_path / "elsewhere", results.REPO_DOCS)
    # The sentence selection at 16K: its rows arm on the 16K run's prompts and maps, paired with that run's exact arm.
    sentence = group["qwen2.5-0.5b-s12-16k-sentence-q"]
    assert sentence.rows_select == results.sentence_rows() and sentence.maps_name() == group[
        "qwen2.5-0.5b-s12-16k-q"].maps_name()
    assert sentence.extra[sentence.extra.index("--needle-arms") + 1] == "ridgefill+rows"
    assert results.REPO_DOCS / "results" / "qwen2.5-0.5b-s12-16k-q" in results.exact_sources(
        sentence, results.RUNS, tmp_path / "elsewhere", results.REPO_DOCS)
    # The shipped selection with the 1.5B policy's lexical reserve inside its budget: the 16K run's prompts and maps.
    lexical = group["qwen2.5-0.5b-s12-16k-lexical-q"]
    assert lexical.rows_select == results.reserve_rows(results.QWEN_1_5B_SHIPPED_RESERVE)
    assert lexical.maps_name() == group["qwen2.5-0.5b-s12-16k-q"].maps_name() and lexical.split == 12
    assert lexical.extra[lexical.extra.index("--needle-arms") + 1] == "ridgefill+rows"
    assert results.REPO_DOCS / "results" / "qwen2.5-0.5b-s12-16k-q" in results.exact_sources(
        lexical, results.RUNS, tmp_path / "elsewhere", results.REPO_DOCS)
    loss = group["qwen2.5-0.5b-s12-16k-loss-q"]
    # The key-token loss of the three arms at 16K, its needle grid's exact arm imported from the 16K run.
    assert loss.extra[loss.extra.index("--loss-arms") + 1] == "exact,ridgefill,ridgefill+rows"
    assert loss.extra[loss.extra.index("--needle-arms") + 1] == "exact"
    assert loss.extra[loss.extra.index("--docs") + 1] != "0"
    assert loss.maps_name() == group["qwen2.5-0.5b-s12-16k-q"].maps_name() and loss.lengths == (16384,)
    (tmp_path / "runs" / "qwen2.5-0.5b-s12-16k-q").mkdir(parents=True)
    (tmp_path / "runs" / "qwen2.5-0.5b-s12-16k-q" / results.RAW).write_text("{}\n")
    assert tmp_path / "runs" / "qwen2.5-0.5b-s12-16k-q" in results.exact_sources(loss, results.RUNS, tmp_path / "runs",
                                                                                tmp_path / "docs")
    assert group["qwen2.5-0.5b-s12-16k-q"].lengths == (16384,) and max(group["qwen2.5-0.5b-s12-32k-q"].lengths) < 32768
    long_docs = group["qwen2.5-0.5b-s12-16k-longdocs-q"]
    maps = tmp_path / long_docs.maps_name()
    (command,) = long_docs.calibrate_commands(maps, tmp_path / "stats")
    assert command[command.index("--doc-tokens") + 1] == "16384" and maps.name.endswith("-docs16k")
    assert long_docs.maps_name() != group["qwen2.5-0.5b-s12-16k-q"].maps_name()
    thirty_two = group["qwen2.5-0.5b-s12-32k-q"].extra
    assert thirty_two[thirty_two.index("--depths") + 1] == "4"  # 2 tasks x 2 haystacks x 2 seeds x (4 + 2) = 48 filled
    # At 32K the shipped rows policy runs at split 14: exact and the bare fill at split 12 (the rows selection still
    # recorded, as the run began with a rows arm), the shipped rows at split 14 on the same prompts, paired with them.
    assert thirty_two[thirty_two.index("--needle-arms") + 1] == "exact,ridgefill"
    assert thirty_two[thirty_two.index("--rows-select") + 1] == results.POOLED_TAIL_ROWS
    rows_32k = group["qwen2.5-0.5b-s14-32k-q"]
    assert (rows_32k.split, rows_32k.lengths, rows_32k.rows_select) == (14, (32640,), results.POOLED_TAIL_ROWS)
    assert rows_32k.extra[rows_32k.extra.index("--needle-arms") + 1] == "ridgefill+rows"
    assert rows_32k.extra[rows_32k.extra.index("--depths") + 1] == "4"
    assert rows_32k.maps_name() == deeper.maps_name()
    assert results.REPO_DOCS / "results" / "qwen2.5-0.5b-s12-32k-q" in results.exact_sources(
        rows_32k, results.RUNS, tmp_path / "elsewhere", results.REPO_DOCS)
    with pytest.raises(ValueError, match="calibrate_extra and maps_tag go together"):
        results.Run("x", "m", (12,), 12, (4096,), calibrate_extra=("--doc-tokens", "8192"))
