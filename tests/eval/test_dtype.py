"""``sgl-ridgefill eval`` runs its local servers and engines in this CPU's dtype unless told otherwise."""

from __future__ import annotations

import argparse
import pathlib

from sgl_ridgefill.cpu.dtype import choose_dtype
from sgl_ridgefill.eval import cli
from sgl_ridgefill.eval.shared_exact import source_dtype


def _args(**kw) -> argparse.Namespace:
    base = dict(url=None, engine=False, dtype="auto")
    base.update(kw)
    return argparse.Namespace(**base)


def test_local_servers_get_this_cpus_dtype_and_say_why(capsys):
    assert cli._dtype(_args()) == choose_dtype().dtype
    assert capsys.readouterr().out == choose_dtype().line() + "\n"


def test_the_users_dtype_wins_and_reaches_the_servers(capsys):
    assert cli._dtype(_args(dtype="float32")) == "float32"
    assert capsys.readouterr().out == "dtype: float32 (chosen with --dtype)\n"
    flags = cli._server_flags(pathlib.Path("/m"), 4096, "float32")
    assert flags[flags.index("--dtype") + 1] == "float32"
    assert cli._serving_settings(pathlib.Path("/m"), 4096, "bfloat16")["dtype"] == "bfloat16"


def test_a_remote_server_runs_what_it_was_started_with(capsys):
    assert cli._dtype(_args(url="http://127.0.0.1:9")) == "auto"
    assert capsys.readouterr().out == ""


def test_the_flag_defaults_to_auto():
    parser = argparse.ArgumentParser()
    cli.add_subparser(parser.add_subparsers())
    args = parser.parse_args(["eval", "--model", "m", "--maps", "d", "--out", "o"])
    assert args.dtype == "auto"


def test_local_cpu_servers_leave_room_for_a_larger_models_weights():
    # Qwen2.5-Coder-1.5B's bfloat16 weights take 28 % of the memory free before SGLang loads them when the
    # RidgeFill server already runs beside it; the pool is capped by --max-total-tokens whatever the fraction.
    from sgl_ridgefill.cpu.launch_server_process import MEM_FRACTION_STATIC

    for dtype in ("bfloat16", "float32"):
        settings = cli._serving_settings(pathlib.Path("/m"), 4096, dtype)
        assert settings["mem_fraction_static"] == MEM_FRACTION_STATIC > 0.3
        assert settings["max_total_tokens"] == 4096 + 2048


def test_a_gpu_engine_lets_sglang_size_its_memory():
    # An 8B model's weights alone are 16 GB: a fixed small fraction of an 80 GB GPU cannot hold them.
    assert "mem_fraction_static" not in cli._serving_settings(pathlib.Path("/m"), 4096, "bfloat16", cpu=False)


def test_a_run_paired_with_anothers_exact_arm_runs_in_its_dtype(tmp_path, capsys):
    """A new run that reuses a sibling's exact arm (--exact-from) is measured in that arm's dtype: records of
    another dtype are not reused, and its rows would have nothing to be paired with."""
    for name, dtype in (("a", "bfloat16"), ("b", "bfloat16"), ("c", "float32")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "results.jsonl").write_text(f'{{"kind": "meta", "dtype": "{dtype}"}}\n')
    assert source_dtype([tmp_path / "a", tmp_path / "b", tmp_path / "missing"]) == "bfloat16"
    assert source_dtype([tmp_path / "a", tmp_path / "c"]) is None  # they disagree: this CPU's pick
    assert source_dtype([]) is None
    assert cli._dtype(_args(), None, "bfloat16") == "bfloat16"
    assert "the exact arm it reuses (--exact-from) was measured in it" in capsys.readouterr().out


def test_a_plan_names_where_bfloat16_matmuls_run_and_the_maps_it_fills_with(monkeypatch, tmp_path):
    import json

    from sgl_ridgefill.cpu import matmul

    monkeypatch.setattr(matmul, "through_float32", lambda features=None: True)
    assert cli._cpu(_args(resolved_dtype="bfloat16"))["bf16_matmuls"] == "through float32"
    assert "bf16_matmuls" not in cli._cpu(_args(resolved_dtype="float32"))
    monkeypatch.setattr(matmul, "through_float32", lambda features=None: False)
    assert "bf16_matmuls" not in cli._cpu(_args(resolved_dtype="bfloat16"))
    assert cli._cpu(_args(url="http://127.0.0.1:9", resolved_dtype="bfloat16")) == {}

    manifest = {"splits": {"12": {"file": "maps-split12.safetensors", "heldout": {"mean_r2": 0.852353823}}},
                "files": {"maps-split12.safetensors": "dab684883f3fa0cd49df1cd68548bb40c750dd6af7f464eacb386cf3388b6d49"}}
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    assert cli._maps_fingerprint(tmp_path, 12) == {"sha256": "dab684883f3fa0cd", "heldout_r2": 0.8524}
    assert cli._maps_fingerprint(tmp_path, 14) == {}
