"""``calibrate`` on a Qwen3.5 hybrid, then ``calibrate terminal-state``: maps for every upper layer (attention
and Gated DeltaNet) from one pass, and ``ΔM`` equal to a brute-force mean of exact-minus-filled states
computed with the hybrid oracle's own conv and recurrence (``tests/support/reference.py``)."""

from __future__ import annotations

import argparse

import pytest
import torch

from sgl_ridgefill.calibration import cli as calibration_cli
from sgl_ridgefill.calibration.capture import capture_layer_inputs
from sgl_ridgefill.calibration.terminal import measure_offsets, state_snapshots
from sgl_ridgefill.maps import load_maps
from sgl_ridgefill.maps.terminal import read_terminal_offsets, terminal_entries
from tests.support.models import make_tiny_checkpoint
from tests.support.reference import HybridReference

SPLIT, INTERVAL = 3, 32


def _run(argv):
    parser = argparse.ArgumentParser(prog="sgl-ridgefill")
    calibration_cli.add_subparser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory, tiny_model):
    path = make_tiny_checkpoint(tmp_path_factory.mktemp("hybrid") / "qwen3_5", family="qwen3_5", num_layers=8,
                                hidden_size=64, with_tokenizer=False)
    for f in tiny_model.iterdir():  # the session's trained tokenizer
        if f.name.startswith("tokenizer") or f.name == "special_tokens_map.json":
            (path / f.name).write_bytes(f.read_bytes())
    from transformers import AutoModelForCausalLM

    return path, AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def test_state_snapshots_equal_the_oracles_recurrence(hybrid):
    _, model = hybrid
    ref = HybridReference(model)
    x = torch.randn(70, 64, generator=torch.Generator().manual_seed(0))
    layer = 5
    got = state_snapshots(model, layer, x, [32, 64, 70])
    mixed, _, g, beta = ref._gdn_parts(layer, x)
    window, state = ref._empty(layer)
    prev = 0
    for t, snap in zip((32, 64, 70), got):
        _, window, state = ref._gdn_run(layer, mixed[prev:t], g[prev:t], beta[prev:t], window, state)
        torch.testing.assert_close(snap, state, atol=2e-5, rtol=1e-4)
        prev = t


def test_offsets_are_the_mean_exact_minus_filled_state(hybrid):
    _, model = hybrid
    gen = torch.Generator().manual_seed(1)
    d, upper = 64, 8 - SPLIT
    maps = (torch.eye(d).expand(upper, d, d) + 0.05 * torch.randn(upper, d, d, generator=gen), 0.02 * torch.randn(upper, d, generator=gen))
    prompts = [torch.randint(5, 1000, (n,), generator=gen).tolist() for n in (70, 40, 20)]  # the last has no snapshot
    result = measure_offsets(model, maps, SPLIT, prompts, INTERVAL)
    assert sorted(result.offsets) == [4, 5, 6] and result.snapshots == 3
    for layer, delta in result.offsets.items():
        total = torch.zeros_like(delta)
        for ids in prompts[:2]:
            xs = capture_layer_inputs(model, torch.tensor(ids), [SPLIT, layer])
            x_hat = xs[SPLIT] @ maps[0][layer - SPLIT].T + maps[1][layer - SPLIT]
            at = list(range(INTERVAL, len(ids) + 1, INTERVAL))
            total += (state_snapshots(model, layer, xs[layer], at) - state_snapshots(model, layer, x_hat, at)).sum(0)
        torch.testing.assert_close(delta, total / 3)
        assert delta.abs().max() > 1e-4  # the fill moves the state


def test_calibrate_then_terminal_state(hybrid, text_corpus, tmp_path, capsys):
    """One pass fits maps for every upper layer, Gated DeltaNet included; the offsets land in the folder,
    listed with their sha256 and how they were measured, on documents the pass did not read."""
    path, _ = hybrid
    out = tmp_path / "maps"
    rc = _run(["calibrate", "--model", str(path), "--corpus", str(text_corpus), "--splits", str(SPLIT), "--out", str(out),
               "--max-tokens", "500", "--doc-tokens", "128", "--heldout-docs", "1", "--max-doc-pieces", "1",
               "--dtype", "float32", "--no-progress"])
    assert rc == 0, capsys.readouterr().err
    folder = load_maps(out)
    assert folder.layers(SPLIT) == tuple(range(SPLIT, 8))  # attention layers 3, 7 and GDN layers 4..6
    rc = _run(["calibrate", "terminal-state", "--maps", str(out), "--model", str(path), "--corpus", str(text_corpus),
               "--prompts", "2", "--interval", "64", "--prompt-tokens", "256"])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    folder = load_maps(out)  # sha256 of every listed file checked, the offsets file included
    assert terminal_entries(folder.manifest) == [("terminal_state.safetensors", SPLIT, "ridgefill")]
    record = folder.manifest["terminal_state"]["terminal_state.safetensors"][f"split{SPLIT}.ridgefill"]
    read = set(folder.manifest["calibration"]["read_ids"])
    assert len(record["prompts"]) == 2 and not read & set(record["prompts"])
    assert record["interval"] == 64 and record["snapshots"] >= 2
    assert record["device"] == "cpu" and "device: cpu (model and statistics)" in captured.err  # auto, no GPU here
    offsets = read_terminal_offsets(out)[(SPLIT, "ridgefill")]
    assert sorted(offsets) == [4, 5, 6] and offsets[4].shape == (4, 16, 16)
    if not torch.cuda.is_available():
        rc = _run(["calibrate", "terminal-state", "--maps", str(out), "--model", str(path), "--corpus",
                   str(text_corpus), "--device", "cuda"])
        err = capsys.readouterr().err
        assert rc == 1 and "--device cuda: this machine has no CUDA device" in err, err


def test_kv_kinds_are_refused_for_a_hybrid(hybrid, text_corpus, tmp_path, capsys):
    """A Gated DeltaNet layer needs its input, which maps of K and V do not give: one line, exit 1."""
    path, _ = hybrid
    rc = _run(["calibrate", "--model", str(path), "--corpus", str(text_corpus), "--splits", str(SPLIT),
               "--out", str(tmp_path / "maps"), "--kind", "kv", "--max-tokens", "500", "--doc-tokens", "128",
               "--heldout-docs", "1", "--dtype", "float32", "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 1 and "Gated DeltaNet" in err and "fit residual or normalised maps" in err, err
    assert not (tmp_path / "maps").exists()
