"""Calibration of every map kind: features, targets, sink rows, the fit, the folder, the CLI.

The maps are checked against a direct float64 ridge on (z, y) rows materialised here, independently of
``targets.py``: features by hand (u = x / rms(x), the row before, the running mean), targets through the
model's own ``input_layernorm`` / ``k_proj`` / ``v_proj``.
"""

from __future__ import annotations

import argparse
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
    collect_stats,
    fit_split,
    load_model,
    load_stats,
    resolve,
    ridge_maps,
)
from sgl_ridgefill.calibration import cli as calibration_cli
from sgl_ridgefill.calibration.stats import STATS_FILE
from sgl_ridgefill.calibration.targets import Accumulator, KVProjection, kv_projections, sink_rule
from sgl_ridgefill.maps import MapsError, load_maps
from sgl_ridgefill.maps.kinds import MAP_KINDS, map_kind, sink_rows
from sgl_ridgefill.runtime.maps_store import MapsStore

D, KV_DIM, LAYERS, SPLIT = 64, 16, 4, 2
KINDS = tuple(MAP_KINDS)
NO_SINKS = {"first_rows": 0, "norm_ratio": float("inf")}


def _quiet(message: str) -> None:
    pass


@pytest.fixture(scope="module")
def kv_model(tiny_model, tmp_path_factory):
    """A 4-layer Qwen3 (K norm) with one K/V head: kv_dim 16, so 2 * kv_dim != d; the tiny tokenizer."""
    from transformers import AutoModelForCausalLM, Qwen3Config

    path = tmp_path_factory.mktemp("kv_model")
    config = Qwen3Config(hidden_size=D, intermediate_size=2 * D, num_hidden_layers=LAYERS, num_attention_heads=4,
                         num_key_value_heads=1, head_dim=KV_DIM, vocab_size=1024, max_position_embeddings=4096,
                         bos_token_id=1, eos_token_id=0, initializer_range=0.05)
    torch.manual_seed(3)
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(path)
    for f in tiny_model.iterdir():
        if f.name.startswith("tokenizer") or f.name == "special_tokens_map.json":
            shutil.copy(f, path / f.name)
    return path


@pytest.fixture(scope="module")
def loaded(kv_model):
    model, _, _ = load_model(kv_model, "float32")
    return model


def _pieces(lengths, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(2, 1024, (n,), generator=g) for n in lengths]


# --- features and targets, materialised by hand --------------------------------------------------------


def _u(x):
    x = x.float()
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


def _features_by_hand(kind, x):
    if kind.features == "x":
        return x.double()
    u = _u(x).double()
    if not kind.context:
        return u
    lag = torch.cat([torch.zeros_like(u[:1]), u[:-1]])
    mean, e = torch.empty_like(u), torch.zeros_like(u[0])
    for j in range(u.shape[0]):
        e = 0.9 * e + 0.1 * u[j]
        mean[j] = e
    return torch.cat([u, lag, mean], dim=1)


def _kv_by_hand(layer, x):
    with torch.no_grad():
        h = layer.input_layernorm(x)
        return torch.cat([layer.self_attn.k_proj(h), layer.self_attn.v_proj(h)], dim=1).double()


def _target_by_hand(model, kind, l, x):
    if kind.target == "x":
        return x.double()
    if kind.target == "u":
        return _u(x).double()
    return _kv_by_hand(model.model.layers[l], x)


def _rows_by_hand(model, pieces, kind, sink):
    """``(z [n, d_in], {l: y_l}, {l: p_l}, sink mask [n])`` over the pieces, every row."""
    zs, ys, ps, sinks = [], {}, {}, []
    for ids in pieces:
        states = capture_layer_inputs(model, ids, range(SPLIT, LAYERS))
        x = states[SPLIT]
        zs.append(_features_by_hand(kind, x))
        sinks.append(sink_rows(torch.arange(len(ids)), x, **sink))
        for l in range(SPLIT, LAYERS):
            ys.setdefault(l, []).append(_target_by_hand(model, kind, l, states[l]))
            ps.setdefault(l, []).append(_target_by_hand(model, kind, l, x))
    cat = lambda d: {l: torch.cat(v) for l, v in d.items()}  # noqa: E731
    return torch.cat(zs), cat(ys), cat(ps), torch.cat(sinks)


def _direct_ridge(z, y, lam):
    mz, my = z.mean(0), y.mean(0)
    zc, yc = z - mz, y - my
    alpha = lam * torch.trace(zc.T @ zc) / z.shape[1]
    a = torch.linalg.solve(zc.T @ zc + alpha * torch.eye(z.shape[1], dtype=z.dtype), zc.T @ yc).T
    return a, my - a @ mz


def _r2(y, pred):
    return float(1 - ((y - pred) ** 2).sum() / ((y - y.mean(0)) ** 2).sum())


def _accumulate(model, pieces, kinds, sink, *, every=False):
    projections = kv_projections(model, range(SPLIT, LAYERS))
    accumulator = Accumulator(kinds, projections, sink)
    zeros = lambda k: SplitStats.zeros(SPLIT, LAYERS, map_kind(k).d_in(D), map_kind(k).d_out(D, KV_DIM))  # noqa: E731
    normal, all_rows = {k: zeros(k) for k in kinds}, {k: zeros(k) for k in kinds}
    sinks = 0
    for ids in pieces:
        states = capture_layer_inputs(model, ids, range(SPLIT, LAYERS))
        sinks += accumulator.add(states, SPLIT, normal, all_rows if every else None)
    return normal, all_rows, sinks


# --- tests ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
def test_kv_targets_are_what_the_models_own_projections_give(tiny_models, family):
    model, _, _ = load_model(tiny_models[family], "float32")
    if family == "qwen2":  # K/V projection biases (zero in a fresh checkpoint) are part of K and V
        with torch.no_grad():
            for layer in model.model.layers:
                layer.self_attn.k_proj.bias.normal_(0, 0.3)
                layer.self_attn.v_proj.bias.normal_(0, 0.3)
    states = capture_layer_inputs(model, _pieces([29], 0)[0], [1, 2, 3])
    for l in (1, 2, 3):
        projection = KVProjection.of(model.model.layers[l])
        kv = projection(states[l])
        assert kv.dtype == torch.float32
        torch.testing.assert_close(kv.double(), _kv_by_hand(model.model.layers[l], states[l]), rtol=1e-5, atol=1e-6)
        # The split layer's own map in u-space: exact up to the norm's epsilon.
        a, b = projection.exact_map()
        torch.testing.assert_close(_u(states[l]).double() @ a.T + b, kv.double(), rtol=1e-4, atol=1e-5)
    assert projection.bias.abs().sum() > 0 if family == "qwen2" else not projection.bias.any()
    # In a bfloat16 model the targets are still computed in float32, close to what the model gives.
    bf16, _, _ = load_model(tiny_models[family], "bfloat16")
    states = capture_layer_inputs(bf16, _pieces([29], 0)[0], [2])
    layer = bf16.model.layers[2]
    with torch.no_grad():
        exact = layer.self_attn.k_proj(layer.input_layernorm(states[2])).float()
    torch.testing.assert_close(KVProjection.of(layer)(states[2])[:, : exact.shape[1]], exact, rtol=0.05, atol=0.02)


@pytest.mark.parametrize("kind_name", KINDS)
def test_maps_and_scores_equal_a_direct_ridge_on_the_rows(loaded, kind_name):
    kind = map_kind(kind_name)
    train_pieces, heldout_pieces = _pieces([90, 71, 64, 55], 1), _pieces([60, 47], 2)
    train, _, train_sinks = _accumulate(loaded, train_pieces, (kind_name,), sink_rule())
    heldout, heldout_all, _ = _accumulate(loaded, heldout_pieces, (kind_name,), sink_rule(), every=True)
    z, ys, _, sinks = _rows_by_hand(loaded, train_pieces, kind, sink_rule())
    assert train_sinks == int(sinks.sum()) >= len(train_pieces)  # every piece's first row at least
    assert train[kind_name].rows == int((~sinks).sum())
    lam = 0.01
    A, b, _ = ridge_maps(train[kind_name], lam)
    keep = ~sinks
    for i, l in enumerate(range(SPLIT, LAYERS)):
        a_ref, b_ref = _direct_ridge(z[keep], ys[l][keep], lam)
        torch.testing.assert_close(A[i], a_ref, rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(b[i], b_ref, rtol=1e-6, atol=1e-7)

    projections = kv_projections(loaded, [SPLIT])
    exact = projections[SPLIT].exact_map() if kind.predicts_kv else None
    fit = fit_split(train[kind_name], heldout[kind_name], lam, kind=kind_name, exact=exact,
                    heldout_all=heldout_all[kind_name])
    assert fit.A.shape == (LAYERS - SPLIT, kind.d_out(D, KV_DIM), kind.d_in(D))
    if kind.predicts_kv:  # layer S: its own K/V projection of u_S, zero on the context features
        assert torch.equal(fit.A[0, :, :D], exact[0]) and torch.equal(fit.b[0], exact[1])
        assert not fit.A[0, :, D:].any()
    else:
        assert torch.equal(fit.A[0], torch.eye(D, dtype=torch.float64)) and not fit.b[0].any()
    # Held-out R^2 from the statistics against predictions on the rows, normal rows and all rows.
    zh, yh, ph, hsinks = _rows_by_hand(loaded, heldout_pieces, kind, sink_rule())
    assert hsinks.any() and heldout_all[kind_name].rows == heldout[kind_name].rows + int(hsinks.sum())
    for rows, r2, r2_identity in ((~hsinks, fit.r2, fit.r2_identity), (slice(None), fit.r2_all, fit.r2_identity_all)):
        for i, l in enumerate(range(SPLIT, LAYERS)):
            y, p = yh[l][rows], ph[l][rows]
            assert r2_identity[i] == pytest.approx(_r2(y, p), abs=1e-9)
            if i == 0:
                assert r2[0] == pytest.approx(1.0, abs=1e-6) and r2_identity[0] == pytest.approx(1.0, abs=1e-9)
                continue
            pred = zh[rows] @ fit.A[i].T + fit.b[i]
            assert r2[i] == pytest.approx(_r2(y, pred), abs=1e-6)  # the features: float32, as served


@pytest.mark.parametrize("kind_name", KINDS)
def test_a_planted_sink_row_does_not_reach_the_training_statistics(loaded, kind_name):
    """Row 17 of a piece is made massive (split state x 2^10 or 2^12) with garbage upper-layer states: the
    training statistics do not move (its u_S, and with it the neighbours' context, is scale-free)."""
    ids = _pieces([80], 5)[0]
    clean = capture_layer_inputs(loaded, ids, range(SPLIT, LAYERS))
    accumulator = Accumulator((kind_name,), kv_projections(loaded, range(SPLIT, LAYERS)), sink_rule())
    kind = map_kind(kind_name)

    def planted(scale, seed, sink):
        states = {l: x.clone() for l, x in clean.items()}
        states[SPLIT][17] *= scale
        g = torch.Generator().manual_seed(seed)
        for l in range(SPLIT + 1, LAYERS):
            states[l][17] = 1e3 * torch.randn(D, generator=g)
        stats = SplitStats.zeros(SPLIT, LAYERS, kind.d_in(D), kind.d_out(D, KV_DIM))
        every = SplitStats.zeros(SPLIT, LAYERS, kind.d_in(D), kind.d_out(D, KV_DIM))
        accumulator.sink = sink
        return accumulator.add(states, SPLIT, {kind_name: stats}, {kind_name: every}), stats, every

    n1, one, all1 = planted(2.0**10, 0, sink_rule())
    n2, two, all2 = planted(2.0**12, 1, sink_rule())
    assert n1 == n2 == 2 and one.rows == 78  # position 0 and the planted row
    for name in ("count", "sum_x", "sum_y", "xtx", "xty", "yy", "py", "pp"):
        torch.testing.assert_close(getattr(one, name), getattr(two, name), rtol=1e-6, atol=1e-8)
    assert all1.rows == 80  # the held-out "all rows" keep it
    assert not all(torch.allclose(getattr(all1, name), getattr(all2, name)) for name in ("sum_x", "xty"))
    A1, b1, _ = ridge_maps(one, 0.01)
    A2, b2, _ = ridge_maps(two, 0.01)
    torch.testing.assert_close(A1, A2, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(b1, b2, rtol=1e-5, atol=1e-7)
    # Without the sink rule the planted row dominates the fit.
    _, kept, _ = planted(2.0**10, 0, NO_SINKS)
    assert kept.rows == 80
    A3, _, _ = ridge_maps(kept, 0.01)
    assert (A3[1:] - A1[1:]).abs().max() > 10 * (A2[1:] - A1[1:]).abs().max()


def test_context_features_start_fresh_with_every_piece(loaded):
    kind = map_kind("kv+context")
    first, second = _pieces([40, 33], 6)
    x = capture_layer_inputs(loaded, second, [SPLIT])[SPLIT]
    z = Accumulator((kind.name,), {}, NO_SINKS).features(kind, x)
    torch.testing.assert_close(z, _features_by_hand(kind, x), rtol=1e-5, atol=1e-6)
    assert not z[0, D : 2 * D].any()  # no row before the first of a piece
    torch.testing.assert_close(z[0, 2 * D :], 0.1 * z[0, :D], rtol=1e-6, atol=1e-7)  # the running mean starts at 0
    # Two pieces read in a row add up to the two read alone, and differ from one piece of both.
    both, _, _ = _accumulate(loaded, [first, second], ("kv+context",), NO_SINKS)
    alone = [_accumulate(loaded, [piece], ("kv+context",), NO_SINKS)[0]["kv+context"] for piece in (first, second)]
    joined, _, _ = _accumulate(loaded, [torch.cat([first, second])], ("kv+context",), NO_SINKS)
    torch.testing.assert_close(both["kv+context"].xtx, alone[0].xtx + alone[1].xtx)
    torch.testing.assert_close(both["kv+context"].xty, alone[0].xty + alone[1].xty)
    assert not torch.allclose(both["kv+context"].xtx, joined["kv+context"].xtx)


# --- the pass, the folder, the CLI ---------------------------------------------------------------------


def _config(model, corpus, out, **overrides):
    settings = dict(model=str(model), corpus=str(corpus), splits=(SPLIT,), out_dir=out, max_tokens=2000,
                    doc_tokens=256, min_doc_tokens=32, heldout_docs=2, progress=False, checkpoint_seconds=0.0,
                    dtype="float32")
    settings.update(overrides)
    return CalibrationConfig(**settings)


@pytest.fixture(scope="module")
def all_kinds(kv_model, text_corpus, tmp_path_factory):
    """Statistics of every kind from one pass (``calibrate stats --kinds all``)."""
    stats = tmp_path_factory.mktemp("all") / "stats"
    collect_stats(_config(kv_model, text_corpus, None, stats_dir=stats, kinds=KINDS), log=_quiet)
    return stats


def test_one_pass_serves_every_kind_and_the_runtime_accepts_each_folder(all_kinds, tmp_path):
    state = load_stats(all_kinds)
    assert state.kinds == KINDS and state.run["kv_dim"] == KV_DIM and state.run["sink"] == sink_rule()
    assert state.progress["train"]["sinks"][str(SPLIT)] >= state.progress["train"]["pieces"]
    for kind_name in KINDS:
        kind = map_kind(kind_name)
        out = resolve(all_kinds, tmp_path / kind_name, None, kind=kind_name, log=_quiet).out_dir
        folder = load_maps(out)
        assert folder.kind is kind and folder.sink == sink_rule()
        assert (folder.d_in, folder.d_out) == (kind.d_in(D), kind.d_out(D, KV_DIM))
        entry = folder.manifest["splits"][str(SPLIT)]
        assert entry["sink_rows"] == {side: state.progress[side]["sinks"][str(SPLIT)] for side in ("train", "heldout")}
        assert entry["train_rows"] == state.progress["train"]["tokens"] - entry["sink_rows"]["train"]
        scores = entry["heldout"]
        assert scores["rows"] + entry["sink_rows"]["heldout"] == scores["rows_all"] == state.progress["heldout"]["tokens"]
        assert {"r2", "r2_identity", "r2_all_rows", "r2_identity_all_rows"} == set(scores["layers"][str(SPLIT + 1)])
        store = MapsStore(folder, [SPLIT], dtype=torch.float32, device="cpu", hidden_size=D, kv_dim=KV_DIM)
        z = torch.randn(3, kind.d_in(D))
        assert store.predict(SPLIT, SPLIT + 1, z).shape == (3, kind.d_out(D, KV_DIM))
        if kind.predicts_kv:
            with pytest.raises(MapsError, match="the maps were fitted for another model"):
                MapsStore(folder, [SPLIT], dtype=torch.float32, device="cpu", hidden_size=D, kv_dim=2 * KV_DIM)


def test_calibrate_one_kind_and_resume_from_statistics_of_more(all_kinds, kv_model, text_corpus, tmp_path):
    stats = tmp_path / "stats"
    shutil.copytree(all_kinds, stats)
    messages = []
    result = calibrate(_config(kv_model, text_corpus, tmp_path / "maps", stats_dir=stats, kinds=("kv",)),
                       log=messages.append)
    assert any(m.startswith("resuming from") and "kinds residual, normalised, kv, kv+context" in m for m in messages)
    assert load_maps(result.out_dir).kind.name == "kv"
    assert load_stats(stats).kinds == KINDS  # still every kind
    # A pass of the residual kind only cannot serve kv: the run identity includes the kinds.
    residual = tmp_path / "residual.stats"
    collect_stats(_config(kv_model, text_corpus, None, stats_dir=residual, max_tokens=300), log=_quiet)
    with pytest.raises(CalibrationError) as info:
        calibrate(_config(kv_model, text_corpus, tmp_path / "kv", stats_dir=residual, max_tokens=300, kinds=("kv",)),
                  log=_quiet)
    assert str(info.value) == (
        f"--stats {residual} holds statistics of a different calibration (differs in: kinds: they hold residual, not "
        "kv); pass --force to discard them, or choose another --stats folder"
    )
    with pytest.raises(CalibrationError) as info:
        resolve(residual, tmp_path / "kv", None, kind="kv", log=_quiet)
    assert str(info.value) == (
        f"--kind kv: the statistics in {residual} hold kind(s) residual, not kv; accumulate it with "
        "`sgl-ridgefill calibrate stats ... --kinds residual,kv`"
    )
    assert not (tmp_path / "kv").exists()


def test_statistics_of_an_older_format_ask_for_a_new_pass(all_kinds, tmp_path):
    from safetensors.torch import save_file

    old = tmp_path / "old"
    old.mkdir()
    header = {"format": "sgl-ridgefill-stats", "version": 1, "run": {}, "progress": {}}
    save_file({"token_counts": torch.zeros(3, dtype=torch.int64)}, str(old / STATS_FILE),
              metadata={"ridgefill": json.dumps(header)})
    with pytest.raises(CalibrationError) as info:
        load_stats(old)
    assert str(info.value) == (
        f"--stats {old}: {STATS_FILE} was written by an older sgl-ridgefill (stats version 1; this one reads version 2, "
        "with statistics per map kind and sink rows left out): re-run calibrate stats with --force to rebuild them"
    )


def _run(argv):
    parser = argparse.ArgumentParser(prog="sgl-ridgefill")
    calibration_cli.add_subparser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


def test_cli_kinds_and_kind(all_kinds, kv_model, text_corpus, tmp_path, capsys):
    stats = tmp_path / "stats"
    rc = _run(["calibrate", "stats", "--model", str(kv_model), "--corpus", str(text_corpus), "--splits", "3",
               "--stats", str(stats), "--kinds", "residual,kv+context", "--max-tokens", "300", "--doc-tokens", "128",
               "--heldout-docs", "1", "--dtype", "float32", "--no-progress"])
    captured = capsys.readouterr()
    assert rc == 0 and captured.out.strip() == str(stats)
    assert load_stats(stats).kinds == ("residual", "kv+context")
    rc = _run(["calibrate", "fit", "--stats", str(stats), "--out", str(tmp_path / "m"), "--kind", "kv+context"])
    captured = capsys.readouterr()
    assert rc == 0 and load_maps(tmp_path / "m").kind.name == "kv+context"
    assert "normal rows (sinks left out)   all rows" in captured.err
    rc = _run(["calibrate", "resolve", "--stats", str(stats), "--out", str(tmp_path / "n"), "--kind", "normalised"])
    assert rc == 1
    assert capsys.readouterr().err == (
        f"sgl-ridgefill calibrate: error: --kind normalised: the statistics in {stats} hold kind(s) residual, "
        "kv+context, not normalised; accumulate it with `sgl-ridgefill calibrate stats ... --kinds "
        "residual,kv+context,normalised`\n"
    )
    for argv, message in (
        (["calibrate", "stats", "--stats", "s", "--kinds", "kv,keys"],
         "argument --kinds: unknown map kind 'keys'; known: residual, normalised, kv, kv+context, or all"),
        (["calibrate", "fit", "--stats", "s", "--out", "o", "--kind", "all"],
         "argument --kind: unknown map kind 'all'; known: residual, normalised, kv, kv+context"),
        (["calibrate", "--kind", "kv-context"],
         "argument --kind: unknown map kind 'kv-context'; known: residual, normalised, kv, kv+context"),
    ):
        with pytest.raises(SystemExit) as info:
            _run(argv)
        assert info.value.code == 2
        assert message in capsys.readouterr().err
    rc = _run(["calibrate", "stats", "--stats", str(tmp_path / "s"), "--kinds", "all"])
    assert rc == 2
    assert capsys.readouterr().err == (
        "sgl-ridgefill calibrate: error: the following arguments are required: --model, --corpus, --splits\n"
    )
