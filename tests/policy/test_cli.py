"""The policy command: exit codes, output, and explain's numbers worked by hand."""

from __future__ import annotations

import json

import pytest

from sgl_ridgefill import cli
from sgl_ridgefill.policy import builtin_policy_names, builtin_policy_path, compile_policy, load_policy
from sgl_ridgefill.cli import main
from sgl_ridgefill.policy.explain import explain_policy
from sgl_ridgefill.policy.manifest import read_maps_facts

ROWS = str(builtin_policy_path("llama-3.1-8b-rows"))


def run(capsys, *argv):
    code = main(["policy", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_check(capsys):
    code, out, err = run(capsys, "check", ROWS)
    assert (code, err) == (0, "")
    assert out == 'ok: policy "llama-3.1-8b-rows": arm ridgefill, split 12, tail 4096, cache auto, 1 selector(s)\n'
    code, out, _ = run(capsys, "check", "qwen3.8-27b")  # a shipped name works too
    assert code == 0 and "value_rescale c=512" in out


@pytest.mark.parametrize("name", builtin_policy_names())
def test_every_shipped_policy_checks_standalone(capsys, name):
    code = cli.main(["policy", "check", str(builtin_policy_path(name))])
    out = capsys.readouterr()
    assert (code, out.err) == (0, "")
    assert out.out.startswith(f'ok: policy "{name}": ')


def test_check_without_maps_leaves_a_maps_split_unchecked(capsys, tmp_path):
    code, out, err = run(capsys, "check", "plain")
    assert (code, err) == (0, "")
    assert out == (
        'ok: policy "plain": arm ridgefill, split from the maps folder (not checked without --maps), '
        "tail 1024, cache no_insert\n"
    )
    code, out, _ = run(capsys, "check", "plain", "--maps", str(_manifest(tmp_path / "maps")))
    assert code == 0 and ", split 12, " in out


def test_check_failure_prints_the_message_and_no_traceback(capsys, tmp_path):
    bad = tmp_path / "bad.rfpolicy"
    bad.write_text('policy "p" {\n  split 12\n  select atention_topk()\n}\n')
    code, out, err = run(capsys, "check", str(bad))
    assert code == 1 and out == ""
    assert err.startswith(f"{bad}:3:10: error: unknown selector 'atention_topk'; did you mean 'attention_topk'?\n")
    assert "Traceback" not in err


def _manifest(folder, quant="bf16", group_size=None):
    entry = {"file": "maps-split12.safetensors", "layers": list(range(12, 32)), "quant": quant}
    if group_size:
        entry["group_size"] = group_size
    folder.mkdir(exist_ok=True)
    (folder / "manifest.json").write_text(
        json.dumps({"num_layers": 32, "d_in": 4096, "d_out": 4096, "default_split": 12, "splits": {"12": entry}})
    )
    return folder


def test_check_against_a_maps_folder(capsys, tmp_path):
    maps = _manifest(tmp_path / "maps")
    other = tmp_path / "p.rfpolicy"
    other.write_text('policy "p" { split 16 }')
    code, _, err = run(capsys, "check", str(other), "--maps", str(maps))
    assert code == 1 and "split 16 has no maps in the maps folder, which has split 12" in err
    code, out, _ = run(capsys, "check", ROWS, "--maps", str(maps))
    assert code == 0


def test_fmt_print_write_and_check(capsys, tmp_path):
    path = tmp_path / "x.rfpolicy"
    path.write_text('policy "x" { split 12   tail 64 }')
    code, out, _ = run(capsys, "fmt", str(path))
    assert (code, out) == (0, 'policy "x" {\n  split 12\n  tail 64\n}\n')
    assert run(capsys, "fmt", "--check", str(path))[0] == 1
    code, out, _ = run(capsys, "fmt", "--write", str(path))
    assert (code, out) == (0, f"formatted {path}\n")
    assert path.read_text() == 'policy "x" {\n  split 12\n  tail 64\n}\n'
    assert run(capsys, "fmt", "--check", str(path))[0] == 0
    path.write_text('policy "x" { split }')
    code, _, err = run(capsys, "fmt", "--write", str(path))
    assert code == 1 and "unexpected '}'; expected a number" in err
    assert path.read_text() == 'policy "x" { split }'


def test_explain_numbers_by_hand():
    policy = compile_policy(load_policy(ROWS))
    e = explain_policy(policy, tokens=16384, num_layers=32)
    # r = 12/32 + (20/32) * 4096/16384 = 0.375 + 0.15625; 10 % of the 12288-row prefix = 1229 rows
    # (1228.8 rounded) add (20/32) * 1229/16384.
    assert e.r == pytest.approx(0.53125)
    assert e.bound == pytest.approx(1 / 0.53125)
    assert e.exact_rows == 1229
    assert e.rows_share == pytest.approx(0.625 * 1229 / 16384)
    assert (e.prefix_rows, e.tail_rows) == (12288, 4096)
    short = explain_policy(policy, tokens=1000, num_layers=32)
    assert short.tail_rows == 1000 and short.r == pytest.approx(1.0) and short.exact_rows == 0


def test_check_and_explain_show_a_split_by_prompt_length(capsys, tmp_path):
    path = tmp_path / "long.rfpolicy"
    path.write_text('policy "long" { split 12 split 16 from 8192 tokens }')
    code, out, _ = run(capsys, "check", str(path))
    assert code == 0 and ", split 12 (16 from 8192 tokens), " in out
    policy = compile_policy(load_policy(str(path)))
    assert explain_policy(policy, tokens=8191, num_layers=32).split == 12
    assert explain_policy(policy, tokens=8192, num_layers=32).split == 16
    code, out, _ = run(capsys, "explain", str(path), "--tokens", "16384", "--layers", "32")
    assert code == 0 and "split 16 of 32 layers" in out


def test_explain_output(capsys, tmp_path):
    code, out, _ = run(capsys, "explain", ROWS, "--tokens", "16384", "--layers", "32")
    assert code == 0
    assert "  r = S/L + (1 - S/L)*T/N = 0.3750 + 0.6250 * 0.2500 = 0.5312   bound 1/r = 1.88x" in out
    assert "  exact prefix rows: about 1229 of 12288" in out
    assert "  with exact rows: r = 0.5781   bound 1.73x" in out
    assert "attention_topk(layers=[3, 7, 11], pool=0, q=64, query=\"last\", sentence=0, share=10%): The prefix rows that receive" in out
    assert "attention received from the last 64 prompt tokens, summed over heads of layers 3, 7, 11" in out
    assert "maps: size unknown" in out
    code, out, _ = run(capsys, "explain", ROWS, "--tokens", "16384", "--maps", str(_manifest(tmp_path / "bf16")))
    # 20 layers * (4096 * 4096 * 2 + 4096 * 4) bytes = 671,416,320 B.
    assert code == 0 and "maps: 20 upper layers, 640.31 MiB stored as bf16" in out
    code, out, _ = run(capsys, "explain", ROWS, "--tokens", "16384", "--maps", str(_manifest(tmp_path / "q", "int8", 128)))
    # 20 * (4096 * 4096 + 4096 * 32 scales * 4 + 4096 * 4) bytes = 346,357,760 B.
    assert "maps: 20 upper layers, 330.31 MiB stored as int8" in out


def test_explain_needs_layers(capsys):
    code, _, err = run(capsys, "explain", ROWS, "--tokens", "100")
    assert code == 1 and err == "error: explain needs the model's layer count: pass --maps DIR or --layers L\n"


def test_manifest_reading_is_lenient(tmp_path):
    (tmp_path / "manifest.json").write_text(json.dumps({"splits": [8, "x"], "num_layers": "24"}))
    facts = read_maps_facts(tmp_path)
    assert facts.maps_info().splits == (8,) and facts.maps_info().default_split == 8
    assert facts.map_bytes(8) is None  # no shapes given
    (tmp_path / "manifest.json").write_text("{")
    with pytest.raises(ValueError, match="the maps manifest is not valid JSON"):
        read_maps_facts(tmp_path)
