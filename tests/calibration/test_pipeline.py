from __future__ import annotations

import json
import shutil

import pytest
import torch

from sgl_ridgefill.calibration import (
    CalibrationConfig,
    CalibrationError,
    SplitStats,
    calibrate,
    capture_layer_inputs,
    load_model,
    load_stats,
    resolve,
)
from sgl_ridgefill.calibration import statpass
from sgl_ridgefill.calibration.corpus import folder_corpus, iter_pieces
from sgl_ridgefill.calibration.targets import Accumulator, sink_rule
from sgl_ridgefill.maps import load_maps, model_fingerprint
from sgl_ridgefill.models.recipes import MODELS
from sgl_ridgefill.maps.fingerprint import hf_fingerprint_layers

SPLITS = (2, 1)


def _config(model, corpus, out, **overrides):
    settings = dict(model=str(model), corpus=str(corpus), splits=SPLITS, out_dir=out, max_tokens=10**6,
                    doc_tokens=256, min_doc_tokens=32, heldout_docs=2, progress=False, checkpoint_seconds=0.0,
                    dtype="float32")  # explicit: the default (auto) depends on this CPU
    settings.update(overrides)
    return CalibrationConfig(**settings)


def _quiet(message: str) -> None:
    pass


@pytest.fixture(scope="module")
def calibrated(tiny_model, text_corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("run") / "maps"
    result = calibrate(_config(tiny_model, text_corpus, out), log=_quiet)
    return result


def test_folder_loads_and_records_the_run(calibrated, tiny_model):
    folder = load_maps(calibrated.out_dir)
    assert folder.splits == (1, 2) and folder.default_split == 2
    manifest = folder.manifest
    assert manifest["stats_dir"] == str(calibrated.stats_dir.resolve())
    assert calibrated.stats_dir == calibrated.out_dir.parent / "maps.stats"
    calibration = manifest["calibration"]
    assert calibration["heldout_documents"] == 2
    assert calibration["longest_document_tokens"] == 256
    assert calibration["skipped_short_documents"] == 1  # tiny.txt
    assert calibration["corpus_exhausted"] is True
    assert calibration["max_doc_pieces"] == 4
    read = calibration["corpus"]["read"]["folder"]
    assert read == {"documents": calibration["documents"], "tokens": calibration["tokens"]}
    assert calibration["pieces"] <= 4 * calibration["documents"]
    assert calibration["corpus"]["sources"][0]["documents_available"] == 9
    assert calibration["documents"] + calibration["heldout_documents"] + 1 == 9
    assert manifest["map_kind"] == "residual" and folder.kind.name == "residual"
    assert manifest["sink"] == {"first_rows": 1, "norm_ratio": 10.0}
    for split in ("1", "2"):
        entry = manifest["splits"][split]
        assert entry["lambda"] in (1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 3e-1, 1.0)
        # Sink rows (the first of every piece at least) are left out of the fit and of the normal-row scores.
        sinks = entry["sink_rows"]
        assert sinks["train"] >= calibration["pieces"] and sinks["heldout"] >= 2
        assert entry["train_rows"] == calibration["tokens"] - sinks["train"]
        assert entry["heldout"]["rows"] == calibration["heldout_tokens"] - sinks["heldout"]
        assert entry["heldout"]["rows_all"] == calibration["heldout_tokens"]
        layers = entry["heldout"]["layers"]
        assert list(layers) == [str(l) for l in range(int(split), 4)]
        assert layers[split]["r2"] == pytest.approx(1.0) and layers[split]["r2_identity"] == pytest.approx(1.0)
        for l in range(int(split) + 1, 4):
            assert -10 < layers[str(l)]["r2"] < 1 and -10 < layers[str(l)]["r2_identity"] < 1
    counts = folder.token_counts()
    assert int(counts.sum()) == calibration["tokens"] + calibration["heldout_tokens"]
    model, tokenizer, config = load_model(tiny_model, "bfloat16")
    fp = model_fingerprint(config, model.get_input_embeddings().weight, model.model.norm.weight, hf_fingerprint_layers(model))
    assert folder.check_model(fp) == []
    assert manifest["model"]["layers"]["count"] == 4
    A, b = folder.load_split(1, dtype=torch.float32)
    assert A.shape == (3, 64, 64) and torch.equal(A[0], torch.eye(64))


def test_maps_fitted_in_float32_serve_the_model_loaded_in_either_dtype(calibrated, tiny_model):
    """The manifest records the calibration dtype; the fingerprint does not depend on it: maps fitted in
    float32 pass the check against a bfloat16 load of the same checkpoint, and against a float32 load."""
    from sgl_ridgefill.calibration.pipeline import model_folder_fingerprints

    folder = load_maps(calibrated.out_dir)
    assert folder.calibration_dtype == "float32" and folder.manifest["calibration"]["dtype"] == "float32"
    model, tokenizer, config = load_model(tiny_model, "bfloat16")
    assert model.get_input_embeddings().weight.dtype == torch.bfloat16
    bf16 = model_fingerprint(config, model.get_input_embeddings().weight, model.model.norm.weight, hf_fingerprint_layers(model))
    assert folder.check_model(bf16) == []
    model32, _, _ = load_model(tiny_model, "float32")
    fp32 = model_fingerprint(config, model32.get_input_embeddings().weight, model32.model.norm.weight,
                             hf_fingerprint_layers(model32))
    assert folder.check_model(fp32) == [] and fp32["layers"] == bf16["layers"]
    model_fp, tokenizer_fp = model_folder_fingerprints(tiny_model)
    assert folder.check_model(model_fp) == [] and folder.check_tokenizer(tokenizer_fp) == []


def test_rows_of_a_document_never_reach_both_sides(calibrated, tiny_model, text_corpus):
    """Recompute both sides' statistics directly, document by document, from the recorded split."""
    state = load_stats(calibrated.stats_dir)
    heldout_ids = state.progress["heldout_ids"]
    skipped = {doc_id for doc_id, _ in state.progress["skipped_short"]}
    train_ids = [i for i in state.progress["done"] if i not in heldout_ids and i not in skipped]
    assert not set(heldout_ids) & set(train_ids)
    assert len(train_ids) == state.progress["train"]["documents"]
    model, tokenizer, _ = load_model(tiny_model, "float32")  # the calibration dtype
    docs = {d.id: d for d in folder_corpus(text_corpus).documents}
    layers = [1, 2, 3]

    def direct(ids_by_doc):
        out = {s: {"residual": SplitStats.zeros(s, 4, 64)} for s in SPLITS}
        accumulator = Accumulator(("residual",), {}, sink_rule())
        for pieces in ids_by_doc:
            for piece in pieces:
                states = capture_layer_inputs(model, torch.tensor(piece), layers)
                for s in SPLITS:
                    accumulator.add(states, s, out[s])
        return out

    tokens = lambda doc_id: tokenizer(docs[doc_id].text(), add_special_tokens=True)["input_ids"]  # noqa: E731
    heldout = direct([[tokens(i)[:256]] for i in heldout_ids])
    train = direct([list(iter_pieces(tokens(i), 256, 32))[:4] for i in train_ids])  # max_doc_pieces = 4
    for s in SPLITS:
        for name in ("count", "sum_x", "sum_y", "xtx", "xty", "yy", "py", "pp"):
            for ours, theirs in ((state.heldout, heldout), (state.train, train)):
                assert torch.allclose(getattr(ours[s, "residual"], name), getattr(theirs[s]["residual"], name),
                                      rtol=1e-10, atol=1e-8)


def test_interrupted_pass_resumes_to_the_same_statistics(calibrated, tiny_model, text_corpus, tmp_path, monkeypatch):
    calls = {"n": 0}
    real = statpass.capture_layer_inputs

    def flaky(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 12:  # 2 held-out pieces, then a few pieces per training document
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(statpass, "capture_layer_inputs", flaky)
    out = tmp_path / "maps"
    with pytest.raises(KeyboardInterrupt):
        calibrate(_config(tiny_model, text_corpus, out), log=_quiet)
    assert not out.exists()
    partial = load_stats(tmp_path / "maps.stats")
    assert 0 < partial.progress["train"]["documents"] < 6
    assert partial.progress["train"]["pieces"] < 10
    monkeypatch.setattr(statpass, "capture_layer_inputs", real)
    messages = []
    calibrate(_config(tiny_model, text_corpus, out), log=messages.append)
    assert any(m.startswith("resuming from") for m in messages)
    resumed, reference = load_stats(tmp_path / "maps.stats"), load_stats(calibrated.stats_dir)
    assert resumed.progress["done"] == reference.progress["done"]
    assert torch.equal(resumed.token_counts, reference.token_counts)
    # The same pieces in the same order: equal up to float64 rounding. Not bitwise: on a 2-core AVX-512
    # machine the sums of two passes over the same rows differed in their last bits only while another job
    # loaded the CPU (the BLAS may split a reduction by the threads it gets). A lost or repeated piece moves
    # the count and the sums by whole rows.
    for s in SPLITS:
        for side in ("train", "heldout", "heldout_all"):
            ours, theirs = getattr(resumed, side)[s, "residual"], getattr(reference, side)[s, "residual"]
            assert torch.equal(ours.count, theirs.count)
            for name in ("sum_x", "xtx", "xty", "yy", "py", "pp"):
                torch.testing.assert_close(getattr(ours, name), getattr(theirs, name), rtol=1e-12, atol=1e-9)


def test_stats_of_another_setup_are_not_mixed_in(calibrated, tiny_model, text_corpus, tmp_path):
    stats = tmp_path / "stats"
    shutil.copytree(calibrated.stats_dir, stats)
    config = _config(tiny_model, text_corpus, tmp_path / "maps", stats_dir=stats, doc_tokens=128)
    with pytest.raises(CalibrationError) as info:
        calibrate(config, log=_quiet)
    assert str(info.value) == (
        f"--stats {stats} holds statistics of a different calibration (differs in: doc_tokens); "
        "pass --force to discard them, or choose another --stats folder"
    )
    assert not (tmp_path / "maps").exists()
    messages = []
    forced = _config(tiny_model, text_corpus, tmp_path / "maps", stats_dir=stats, doc_tokens=128, max_tokens=500, force=True)
    calibrate(forced, log=messages.append)
    assert any("--force: discarding statistics" in m for m in messages)
    assert load_stats(stats).run["doc_tokens"] == 128


def test_stats_saved_before_per_layer_fingerprints_resume_and_gain_them(calibrated, tiny_model, text_corpus, tmp_path):
    stats = tmp_path / "stats"
    shutil.copytree(calibrated.stats_dir, stats)
    state = load_stats(stats)
    full = dict(state.run["model"])
    del state.run["model"]["layers"]
    state.save(stats)
    messages = []
    calibrate(_config(tiny_model, text_corpus, tmp_path / "maps", stats_dir=stats), log=messages.append)
    assert any(m.startswith("resuming from") for m in messages)
    assert f"{stats}: recording the per-layer model fingerprint these statistics predate" in messages
    assert load_stats(stats).run["model"] == full
    assert load_maps(tmp_path / "maps").manifest["model"] == full


def test_resolve_with_another_lambda_needs_no_text(calibrated, tmp_path):
    out = resolve(calibrated.stats_dir, tmp_path / "again", 0.5, quant="int8", log=_quiet).out_dir
    folder = load_maps(out)
    assert folder.manifest["splits"]["2"]["lambda"] == 0.5
    assert folder.manifest["splits"]["2"]["lambda_chosen_on_heldout"] is False
    assert folder.load_split_int8(2) is not None
    assert folder.manifest["calibration"]["tokens"] == load_maps(calibrated.out_dir).manifest["calibration"]["tokens"]
    with pytest.raises(CalibrationError) as info:
        resolve(calibrated.stats_dir, tmp_path / "other", 0.5, splits=(3,), log=_quiet)
    assert str(info.value) == f"--splits: the statistics in {calibrated.stats_dir} cover split(s) 1, 2, not 3"
    with pytest.raises(CalibrationError) as info:
        resolve(calibrated.stats_dir, out, 0.5, log=_quiet)
    assert str(info.value) == f"--out {out} already exists (use --force to replace it)"


def test_user_errors_are_clear_and_leave_nothing(tiny_model, text_corpus, tmp_path):
    with pytest.raises(CalibrationError) as info:
        calibrate(_config(tiny_model, text_corpus, tmp_path / "m", splits=(4,)), log=_quiet)
    assert str(info.value) == f"--splits: split 4 is outside 1..3 for model {tiny_model} (4 layers)"
    with pytest.raises(CalibrationError) as info:
        _config(tiny_model, text_corpus, tmp_path / "m", lam=0.0)
    assert str(info.value) == "--lambda must be a positive number or 'auto', got 0.0"
    with pytest.raises(CalibrationError) as info:
        _config(tiny_model, text_corpus, tmp_path / "m", lam=-1.0)
    assert str(info.value) == "--lambda must be a positive number or 'auto', got -1.0"
    with pytest.raises(CalibrationError, match="--heldout-docs >= 1 or a --lambda value"):
        _config(tiny_model, text_corpus, tmp_path / "m", heldout_docs=0)
    bad_model = tmp_path / "gpt2"
    bad_model.mkdir()
    (bad_model / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"]}))
    with pytest.raises(CalibrationError, match="architecture GPT2LMHeadModel is not supported"):
        calibrate(_config(bad_model, text_corpus, tmp_path / "m"), log=_quiet)
    with pytest.raises(ValueError) as info:
        calibrate(_config("no-such-model", text_corpus, tmp_path / "m"), log=_quiet)
    assert str(info.value) == (
        f"--model no-such-model: no such folder, and not a known model name (known: {', '.join(sorted(MODELS))})"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gpt2"]


def test_small_corpora_are_refused(tiny_model, tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("short one")
    (corpus / "b.txt").write_text("another short one")
    with pytest.raises(CalibrationError) as info:
        calibrate(_config(tiny_model, corpus, tmp_path / "m", heldout_docs=2), log=_quiet)
    assert str(info.value) == (
        f"--corpus {corpus.resolve()} has 2 document(s); --heldout-docs 2 needs at least 3 (2 held out, the rest to fit)"
    )
    (corpus / "c.txt").write_text("a third")
    with pytest.raises(CalibrationError) as info:
        calibrate(_config(tiny_model, corpus, tmp_path / "m", heldout_docs=1), log=_quiet)
    assert str(info.value) == (
        f"--corpus {corpus.resolve()}: only 0 document(s) have at least --min-doc-tokens 32 tokens; "
        "--heldout-docs 1 needs 1 of them, plus more to fit the maps"
    )
    import inspect
    import json as json_module

    (corpus / "d.txt").write_text(inspect.getsource(json_module)[:1500])
    with pytest.raises(CalibrationError) as info:
        calibrate(_config(tiny_model, corpus, tmp_path / "m", heldout_docs=1, lam=0.1), log=_quiet)
    message = str(info.value)
    assert message.startswith(f"--corpus {corpus.resolve()} is too small: 0 training tokens from 0 document(s); 3 document(s) were shorter than --min-doc-tokens 32 (")
    assert message.endswith("fitting d_in=64 needs at least 64 rows (100x that is recommended)")
    assert not (tmp_path / "m").exists()
