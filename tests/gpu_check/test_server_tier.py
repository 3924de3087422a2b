"""The server tier's plan (server command lines, environments, request schedule) with a fake launcher that
starts the benchmark tests' fake server instead of SGLang."""

from __future__ import annotations

import argparse
import contextlib
import json
import pathlib

import pytest

from sgl_ridgefill.bench.runner import make_prompt, pair_order
from sgl_ridgefill.gpu_check.cli import add_arguments, run_server
from sgl_ridgefill.gpu_check.server import IDENTITY_SEED_OFFSET, ServerCheckConfig, server_specs
from tests.bench.fake_server import FakeServer

VOCAB = 5000
CONFIG_JSON = {
    "num_hidden_layers": 24, "hidden_size": 896, "num_attention_heads": 14, "num_key_value_heads": 2,
    "intermediate_size": 4864, "vocab_size": VOCAB, "max_position_embeddings": 4096,
}


@pytest.fixture()
def folders(tmp_path: pathlib.Path) -> tuple[pathlib.Path, pathlib.Path]:
    model, maps = tmp_path / "model", tmp_path / "maps"
    model.mkdir()
    maps.mkdir()
    (model / "config.json").write_text(json.dumps(CONFIG_JSON))
    (maps / "manifest.json").write_text(json.dumps({"default_split": 6}))
    return model, maps


class FakeLauncher:
    """Records every server spec and serves it with a fake server (stock answers can be made to differ)."""

    def __init__(self, model: pathlib.Path, *, stock_output: list[int] | None = None) -> None:
        self.model, self.stock_output = model, stock_output
        self.started: list = []  # (spec, fake server)

    @contextlib.contextmanager
    def __call__(self, spec):
        output = self.stock_output if (self.stock_output and not spec.ridgefill) else None
        with FakeServer(str(self.model), exact_s=0.0, ridgefill_s=0.0, output_ids=output) as fake:
            self.started.append((spec, fake))
            yield fake.url


def _args(model: pathlib.Path, maps: pathlib.Path, out: pathlib.Path, *extra: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args([
        "--tier", "server", "--model-path", str(model), "--ridgefill-maps", str(maps), "--out", str(out),
        "--lengths", "64,128", "--pairs", "2", "--split", "6", "--tail", "32", "--identity-prompts", "2",
        "--server-args", "--mem-fraction-static 0.8", *extra,
    ])


def test_server_command_lines(folders) -> None:
    model, maps = folders
    cfg = ServerCheckConfig(model_path=model, maps_path=maps, split=6, tail=32, python="python3",
                            server_args=("--mem-fraction-static", "0.8"))
    stock, ridgefill = server_specs(cfg, "flashinfer", plugins="smg-servicer")
    common = ["--model-path", str(model), "--attention-backend", "flashinfer", "--skip-tokenizer-init",
              "--mem-fraction-static", "0.8"]
    assert list(stock.command) == list(ridgefill.command) == ["python3", "-m", "sglang.launch_server"]
    assert list(stock.flags) == common
    assert list(ridgefill.flags) == [*common, "--prefill-backend", "ridgefill", "--ridgefill-maps", str(maps),
                                     "--ridgefill-split", "6", "--ridgefill-tail", "32",
                                     "--ridgefill-request-policies", "llama-3.1-8b-rows,plain"]
    # Stock leaves this plugin out; neither server inherits RidgeFill variables or a plugin list.
    base = {"RIDGEFILL_MAPS": "/elsewhere", "SGLANG_PLUGINS": "ridgefill", "PATH": "/bin"}
    assert stock.environment(base) == {"PATH": "/bin", "SGLANG_PLUGINS": "smg-servicer"}
    assert ridgefill.environment(base) == {"PATH": "/bin"}
    assert stock.command_line() == "SGLANG_PLUGINS=smg-servicer python3 -m sglang.launch_server " + " ".join(common)


def test_unknown_backend_is_refused(folders) -> None:
    with pytest.raises(ValueError, match=r"^--backends must name some of triton, flashinfer, fa3, got 'trtllm'$"):
        ServerCheckConfig(model_path=folders[0], maps_path=folders[1], backends=("trtllm",))


def test_the_schedule_per_backend(folders, tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    model, maps = folders
    launcher = FakeLauncher(model)
    assert run_server(_args(model, maps, tmp_path / "out", "--backends", "triton,fa3"), launcher=launcher) == 0
    assert [spec.name for spec, _ in launcher.started] == ["stock-triton", "ridgefill-triton", "stock-fa3", "ridgefill-fa3"]
    identity = [make_prompt(2048, VOCAB, 0, IDENTITY_SEED_OFFSET + i) for i in range(2)]
    for spec, fake in launcher.started:
        log = fake.log
        assert all(log[i] == ("flush",) for i in range(0, len(log), 2)), spec.name  # a flush before every request
        gens = [e for e in log if e[0] == "generate"]
        # First the identity prompts: stock without custom params, RidgeFill with RidgeFill off.
        assert [g[2] for g in gens[:2]] == [tuple(p) for p in identity]
        assert all(g[3] == (None if not spec.ridgefill else {"enabled": False}) for g in gens[:2])
        timed = gens[2:]
        if not spec.ridgefill:
            # One warm-up request, then every length's prompts once, stock (no custom params).
            want = [make_prompt(64, VOCAB, 0, -1)] + [make_prompt(n, VOCAB, 0, p) for n in (64, 128) for p in range(2)]
            assert [list(g[2]) for g in timed] == want and all(g[3] is None for g in timed)
        else:
            # The benchmark: a warm-up round, then each round of exact, the bare fill and the rows policy in
            # rotating order on the same prompts as stock.
            arms = ("exact", "bare", "ridgefill")
            timed = timed[3:]
            assert len(timed) == 2 * 2 * 3
            for k in range(4):
                round_ = timed[3 * k : 3 * k + 3]
                assert tuple(g[1] for g in round_) == pair_order(k % 2, arms)
                assert {g[2] for g in round_} == {tuple(make_prompt((64, 128)[k // 2], VOCAB, 0, k % 2))}
                params = {g[1]: g[3] for g in round_}
                assert params["ridgefill"] == {"policy": "llama-3.1-8b-rows", "split": 6, "tail": 32}
                assert params["bare"] == {"policy": "plain", "split": 6, "tail": 32}
    report = json.loads((tmp_path / "out" / "gpu-check.json").read_text())
    assert report["tier"] == "server" and set(report["backends"]) == {"triton", "fa3"}
    for backend, entry in report["backends"].items():
        assert "--prefill-backend ridgefill" in entry["commands"][f"ridgefill-{backend}"]
        assert entry["commands"][f"stock-{backend}"].startswith("SGLANG_PLUGINS=")
        assert entry["identity"] == {"prompts": 2, "identical": True, "differences": []}
        assert [(s["length"], s["arm"]) for s in entry["summary"]] == [
            (64, "bare"), (64, "ridgefill"), (128, "bare"), (128, "ridgefill")]
        assert {"layer_bound", "flop_bound", "layer_fraction", "flop_fraction"} <= set(entry["summary"][0])
        assert set(entry["stock_ttft"]) == {"64", "128"} and len(entry["stock_ttft"]["64"]) == 2
    table = (tmp_path / "out" / "gpu-check.txt").read_text()
    assert "triton: RidgeFill off vs stock over 2 prompts: identical" in table
    assert "stock s" in table.splitlines()[1]
    assert capsys.readouterr().out.count("identical") == 2


def test_a_difference_from_stock_fails_the_check(folders, tmp_path: pathlib.Path) -> None:
    model, maps = folders
    launcher = FakeLauncher(model, stock_output=[8])
    assert run_server(_args(model, maps, tmp_path / "out", "--backends", "triton"), launcher=launcher) == 1
    identity = json.loads((tmp_path / "out" / "gpu-check.json").read_text())["backends"]["triton"]["identity"]
    assert identity["identical"] is False
    assert identity["differences"][0] == "prompt 0: output_ids differ: stock [8] vs RidgeFill off [7]"


def test_a_server_that_does_not_start_is_reported_and_the_next_backend_runs(folders, tmp_path: pathlib.Path) -> None:
    model, maps = folders
    launcher = FakeLauncher(model)

    @contextlib.contextmanager
    def flaky(spec):
        if spec.backend == "fa3":
            raise RuntimeError("the server exited with code 1 while starting")
        with launcher(spec) as url:
            yield url

    assert run_server(_args(model, maps, tmp_path / "out", "--backends", "fa3,triton"), launcher=flaky) == 1
    report = json.loads((tmp_path / "out" / "gpu-check.json").read_text())
    assert report["backends"]["fa3"]["error"] == "RuntimeError: the server exited with code 1 while starting"
    assert report["backends"]["triton"]["identity"]["identical"] is True


def test_a_model_too_short_for_the_lengths_is_refused(folders, tmp_path: pathlib.Path, capsys) -> None:
    model, maps = folders
    args = _args(model, maps, tmp_path / "out", "--lengths", "8192")
    assert run_server(args, launcher=FakeLauncher(model)) == 1
    assert capsys.readouterr().err.strip() == (
        f"gpu-check: error: the model in {model} takes 4096 positions, fewer than the longest request (8208 tokens): "
        "shorten --lengths or use a model with a longer context"
    )


def test_random_llama_model_and_maps_are_made_once(tmp_path: pathlib.Path) -> None:
    from sgl_ridgefill.tools.synthetic import LLAMA_3_1_8B, RandomModelShape, make_model_and_maps
    from sgl_ridgefill.maps import load_maps

    # The server tier's default shape, shrunk: same family and settings, tiny sizes.
    shape = RandomModelShape(**{**vars(LLAMA_3_1_8B), "num_layers": 4, "hidden_size": 64, "num_heads": 4,
                                "num_kv_heads": 2, "intermediate_size": 96, "vocab_size": 300})
    model, maps = make_model_and_maps(tmp_path, shape, split=2)
    config = json.loads((model / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["tie_word_embeddings"] is False
    assert config["max_position_embeddings"] == 131072 and config["num_key_value_heads"] == 2
    folder = load_maps(maps)
    assert folder.splits == (2,) and folder.default_split == 2 and (folder.d_in, folder.d_out) == (64, 64)
    stamp = (model / "config.json").stat().st_mtime_ns
    assert make_model_and_maps(tmp_path, shape, split=2) == (model, maps)
    assert (model / "config.json").stat().st_mtime_ns == stamp
