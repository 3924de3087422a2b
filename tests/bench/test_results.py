"""Benchmarks recorded per CPU: the machine in bench.json, the per-CPU folder name, and docs/BENCHMARKS.md
regenerated from the folders (synthetic bench.json files; no server)."""

from __future__ import annotations

import argparse
import json
import os
import pathlib

import pytest

from sgl_ridgefill.bench import results
from sgl_ridgefill.bench.cli import add_subparser, command_line
from sgl_ridgefill.tools.machine import folder_name, machine_record, process_environment, served_dtype

from .fake_server import FakeServer
from .test_runner import CONFIG_JSON


def _summary(length: int, exact: float, filled: float, ratios: tuple[float, ...], layer: float, flop: float) -> dict:
    speedup = exact / filled
    return {"length": length, "exact_median": exact, "ridgefill_median": filled, "speedup": speedup,
            "pair_ratios": list(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios), "layer_bound": layer,
            "flop_bound": flop, "layer_fraction": speedup / layer, "flop_fraction": speedup / flop, "cache_hits": 0}


def _report(machine: dict, summaries: list[dict]) -> dict:
    return {
        "config": {"lengths": [s["length"] for s in summaries], "pairs": 3, "split": 12, "tail": 1024, "flush": True},
        "model": {"num_layers": 24},
        "server": {"model_path": "/cache/qwen2.5-coder-0.5b"},
        "summary": summaries,
        "records": [],
        "machine": machine,
        "command": "sgl-ridgefill bench --serve qwen2.5-coder-0.5b --dtype auto --lengths 2048,4096 --pairs 3 --out "
                   "'docs/bench/{capability}-{dtype}'",
    }


AMX_MACHINE = {"cpu_model": "Intel(R) Xeon(R) Processor", "capability": "AVX512", "native_bf16": True,
               "bf16_hardware": "AMX", "isa_caps": {}, "dtype": "bfloat16", "threads": 2, "usable_cores": 2,
               "server_on_this_machine": True}
AVX2_MACHINE = {"cpu_model": "AMD EPYC 7B13", "capability": "AVX2", "native_bf16": False, "bf16_hardware": None,
                "isa_caps": {}, "dtype": "float32", "threads": 2, "usable_cores": 2, "server_on_this_machine": True}


@pytest.fixture()
def bench_dir(tmp_path: pathlib.Path) -> pathlib.Path:
    root = tmp_path / "bench"
    for machine, rows in (
        (AMX_MACHINE, [_summary(2048, 4.66, 4.25, (1.05, 1.13, 1.10), 1.33, 1.28),
                       _summary(4096, 10.86, 8.53, (1.22, 1.30, 1.27), 1.60, 1.51)]),
        (AVX2_MACHINE, [_summary(2048, 60.0, 48.0, (1.2, 1.3, 1.25), 1.33, 1.28)]),
    ):
        folder = root / folder_name(machine)
        folder.mkdir(parents=True)
        (folder / "bench.json").write_text(json.dumps(_report(machine, rows)))
    return root


def test_folder_names_follow_capability_and_dtype():
    assert folder_name(AMX_MACHINE) == "avx512-bfloat16"
    assert folder_name(AVX2_MACHINE) == "avx2-float32"


def test_page_has_one_table_per_folder_with_every_column(bench_dir):
    page = results.render(results.load_folders(bench_dir))
    assert page.index("## `avx2-float32`") < page.index("## `avx512-bfloat16`")
    assert "| 2,048 | 4.66 s | 4.25 s | 1.10× (1.05–1.13) | 1.33× | 82% | 1.28× | 86% |" in page
    assert "| 4,096 | 10.86 s | 8.53 s | 1.27× (1.22–1.30) | 1.60× | 80% | 1.51× | 84% |" in page
    assert ("CPU AMD EPYC 7B13; PyTorch capability AVX2; native bfloat16 no; dtype float32; 2 thread(s)." in page)
    assert "native bfloat16 yes (AMX); dtype bfloat16" in page
    assert results.FOLDER_COMMAND in page and "Made with `sgl-ridgefill bench --serve" in page


def test_the_header_states_the_split_and_tail_the_requests_ran_at():
    report = _report(AMX_MACHINE, [_summary(2048, 4.66, 4.25, (1.05, 1.13, 1.10), 1.33, 1.28)])
    assert "S = 12, T = 1024;" in results.section("plain", report)
    report["config"].update(splits_by_length={"2048": 14}, rf_params={"tail": 512})
    assert "S = 12 (14 at 2,048 tokens), T = 512;" in results.section("by-length", report)
    report["config"]["rf_params"] = {"split": 16, "tail": 256}
    assert "S = 16, T = 256;" in results.section("asked", report)


def test_regeneration_and_check(bench_dir, tmp_path, capsys):
    out = tmp_path / "BENCHMARKS.md"
    assert results.main(["--bench-dir", str(bench_dir), "--out", str(out), "--check"]) == 1
    assert results.main(["--bench-dir", str(bench_dir), "--out", str(out)]) == 0
    assert results.main(["--bench-dir", str(bench_dir), "--out", str(out), "--check"]) == 0
    (bench_dir / "avx2-float32" / "bench.json").write_text("{")
    assert results.main(["--bench-dir", str(bench_dir), "--out", str(out)]) == 1
    assert "is not valid JSON" in capsys.readouterr().err


def test_an_empty_bench_dir_says_how_to_fill_it(tmp_path):
    page = results.render(results.load_folders(tmp_path))
    assert "No benchmark folder yet" in page and results.FOLDER_COMMAND in page


def test_the_committed_page_is_up_to_date():
    assert results.main(["--check"]) == 0, f"run {results.COMMAND}"


def test_served_dtype_resolves_auto_from_the_checkpoint():
    assert served_dtype({"dtype": "float32"}, {"torch_dtype": "bfloat16"}) == "float32"
    assert served_dtype({"dtype": "auto"}, {"torch_dtype": "bfloat16"}) == "bfloat16"
    assert served_dtype({}, {"dtype": "float32"}) == "float32"
    assert served_dtype({}, None) is None


def test_machine_record_reads_the_servers_environment():
    machine = machine_record(dtype="float32", server_env={"OMP_NUM_THREADS": "1", "ATEN_CPU_CAPABILITY": "avx2",
                                                          "ONEDNN_MAX_CPU_ISA": "AVX2"}, server_local=True)
    assert machine["threads"] == 1 and machine["capability"] == "AVX2" and machine["native_bf16"] is False
    assert machine["isa_caps"] == {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
    assert process_environment(os.getpid())["PATH"] == os.environ["PATH"]
    assert process_environment(2**31 - 1) is None


def test_cli_records_the_machine_and_expands_the_folder(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({**CONFIG_JSON, "torch_dtype": "bfloat16"}))
    parser = argparse.ArgumentParser(prog="sgl-ridgefill")
    add_subparser(parser.add_subparsers(dest="command"))
    pattern = str(tmp_path / "bench" / "{capability}-{dtype}")
    with FakeServer(str(model), exact_s=0.0, ridgefill_s=0.0) as fake:
        args = parser.parse_args(["bench", "--url", fake.url, "--lengths", "64", "--pairs", "1", "--warmup", "0",
                                  "--tail", "32", "--out", pattern])
        assert args.func(args) == 0
    (folder,) = (tmp_path / "bench").iterdir()
    report = json.loads((folder / "bench.json").read_text())
    machine = report["machine"]
    assert folder.name == folder_name(machine) and machine["dtype"] == "bfloat16"  # from config.json: no server info
    assert set(machine) >= {"cpu_model", "capability", "native_bf16", "dtype", "threads"}
    assert machine["server_on_this_machine"] is False
    assert report["command"] == command_line(args)
    assert report["command"].endswith("--tail 32 --warmup 0 --out " + f"'{pattern}'")


def test_serve_needs_maps(tmp_path, capsys):
    parser = argparse.ArgumentParser(prog="sgl-ridgefill")
    add_subparser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["bench", "--serve", str(tmp_path), "--out", str(tmp_path / "out")])
    assert args.func(args) == 1
    assert capsys.readouterr().err.strip().endswith("--serve needs --ridgefill-maps (the maps the server fills with)")


def test_serve_starts_a_cpu_server_in_the_chosen_dtype(tmp_path, monkeypatch):
    import contextlib
    import types

    from sgl_ridgefill.cpu import launch_server_process

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(CONFIG_JSON))
    seen = {}

    @contextlib.contextmanager
    def fake_running_server(flags, *, log_path, on_start):
        seen["flags"] = flags
        with FakeServer(str(model), exact_s=0.0, ridgefill_s=0.0) as fake:
            on_start(types.SimpleNamespace(pid=os.getpid()))
            yield fake.url

    (tmp_path / "maps").mkdir()
    (tmp_path / "maps" / "manifest.json").write_text(json.dumps({"default_split": 12}))
    monkeypatch.setattr(launch_server_process, "running_server", fake_running_server)
    monkeypatch.setenv("RIDGEFILL_CACHE_DIR", str(tmp_path / "cache"))
    parser = argparse.ArgumentParser(prog="sgl-ridgefill")
    add_subparser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["bench", "--serve", str(model), "--ridgefill-maps", str(tmp_path / "maps"), "--dtype",
                              "float32", "--lengths", "64", "--pairs", "1", "--warmup", "0", "--tail", "32",
                              "--out", str(tmp_path / "bench" / "{capability}-{dtype}")])
    assert args.func(args) == 0
    flags = seen["flags"]
    assert flags[flags.index("--dtype") + 1] == "float32" and "--prefill-backend" in flags
    assert "--skip-tokenizer-init" in flags  # a folder without a tokenizer (random weights): token ids only
    (folder,) = (tmp_path / "bench").iterdir()
    assert folder.name.endswith("-float32")
    report = json.loads((folder / "bench.json").read_text())
    assert report["machine"]["dtype"] == "float32" and report["machine"]["server_on_this_machine"] is True
    assert report["command"].startswith(f"sgl-ridgefill bench --serve {model} --dtype float32 --ridgefill-maps ")
