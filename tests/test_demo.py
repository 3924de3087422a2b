"""``sgl-ridgefill demo``'s choices, without a server: which maps, how long a prompt, how many calibration
tokens, from the shipped maps' check and a stated matmul rate."""

from __future__ import annotations

import argparse
import pathlib

import pytest

from sgl_ridgefill import demo
from sgl_ridgefill.tools.flops import ModelDims
from sgl_ridgefill.tools.sizing import Throughput
from sgl_ridgefill.shipped_maps import Fit

QWEN_05B = ModelDims(num_layers=24, hidden_size=896, num_heads=14, num_kv_heads=2, head_dim=64,
                     intermediate_size=4864, vocab_size=151936)


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    demo.add_subparser(parser.add_subparsers())
    return parser.parse_args(["demo", *argv])


class _FixedRate:
    dims = QWEN_05B
    throughput = Throughput(28.5, "float32", 2, 10)


@pytest.fixture()
def calls(monkeypatch):
    seen: list[tuple] = []

    def ensure(model_dir, name, split, tokens, cache, dtype):
        seen.append((name, split, tokens, dtype))
        return cache / "fitted"

    monkeypatch.setattr(demo, "ensure_maps", ensure)
    return seen


def test_defaults_adapt_to_the_machine():
    args = _args()
    assert (args.tokens, args.calib_tokens, args.dtype, args.calibrate) == (None, None, "auto", False)
    assert (args.budget_s, args.split, args.tail) == (150.0, 12, 1024)
    assert _args("--tokens", "4096", "--calib-tokens", "50000").tokens == 4096
    with pytest.raises(SystemExit):
        _args("--tokens", "0")


def test_matching_shipped_maps_are_used_without_calibrating(monkeypatch, calls, capsys, tmp_path):
    monkeypatch.setattr("sgl_ridgefill.shipped_maps.check_fit", lambda maps, model: Fit(True))
    chosen = demo.choose_maps(_args(), tmp_path / "model", tmp_path, "float32", _FixedRate())
    assert chosen.name == "qwen2.5-coder-0.5b-s12" and calls == []
    assert "shipped maps" in capsys.readouterr().out


def test_mismatching_shipped_maps_are_refitted_within_the_budget(monkeypatch, calls, capsys, tmp_path):
    monkeypatch.setattr("sgl_ridgefill.shipped_maps.check_fit",
                        lambda maps, model: Fit(False, "model weights: checksum differs"))
    chosen = demo.choose_maps(_args(), tmp_path / "model", tmp_path, "float32", _FixedRate())
    out = capsys.readouterr().out
    assert "the shipped maps do not match the converted model (model weights: checksum differs); fitting" in out
    assert chosen == tmp_path / "fitted" and calls == [("qwen2.5-coder-0.5b", 12, 20_000, "float32")]


def test_calibrate_forces_fitting_and_other_splits_fit_their_own(monkeypatch, calls, capsys, tmp_path):
    monkeypatch.setattr("sgl_ridgefill.shipped_maps.check_fit", lambda maps, model: pytest.fail("not checked"))
    demo.choose_maps(_args("--calibrate", "--calib-tokens", "200000"), tmp_path, tmp_path, "bfloat16", _FixedRate())
    demo.choose_maps(_args("--split", "6", "--calib-tokens", "30000"), tmp_path, tmp_path, "float32", _FixedRate())
    assert calls == [("qwen2.5-coder-0.5b", 12, 200_000, "bfloat16"), ("qwen2.5-coder-0.5b", 6, 30_000, "float32")]
    out = capsys.readouterr().out
    assert "--calibrate: fitting maps on this machine" in out and "no maps ship for qwen2.5-coder-0.5b at split 6" in out


def test_cpu_line_names_capability_and_bfloat16():
    from sgl_ridgefill.cpu.dtype import CpuFeatures

    line = demo.cpu_line(CpuFeatures("AVX2", avx512_bf16=False, amx=False), 2)
    assert line.startswith("CPU: ") and line.endswith("; capability AVX2; native bfloat16: no; 2 thread(s)")
    assert "native bfloat16: yes (AMX)" in demo.cpu_line(CpuFeatures("AVX512", True, True), 2)
