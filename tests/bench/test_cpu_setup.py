"""The CPU server setup: launcher defaults (``--sleep-on-idle``) and the intra-op thread count."""

from __future__ import annotations

import os

import pytest

from sgl_ridgefill.cpu.environment import CPU_SERVER_ARGS, cpu_environment, server_cli_args, usable_cores
from sgl_ridgefill.cpu.launch_server import cpu_flags


def test_launcher_adds_sleep_on_idle_as_a_switch():
    argv = cpu_flags(["--model-path", "m"])
    assert argv.count("--sleep-on-idle") == 1
    after = argv[argv.index("--sleep-on-idle") + 1 :]
    assert not after or after[0].startswith("--")  # a store_true flag takes no value
    assert argv[argv.index("--attention-backend") + 1] == "ridgefill_cpu"


def test_launcher_keeps_the_callers_flags():
    argv = cpu_flags(["--attention-backend=torch_native", "--sleep-on-idle"])
    assert argv.count("--sleep-on-idle") == 1
    assert "--attention-backend" not in argv and "--attention-backend=torch_native" in argv


def test_launcher_adds_the_hybrid_flags_for_a_hybrid_model(tmp_path):
    import json

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3_5_text", "architectures": ["Qwen3_5ForCausalLM"]}))
    argv = cpu_flags(["--model-path", str(tmp_path)])
    assert argv[argv.index("--mamba-radix-cache-strategy") + 1] == "no_buffer"
    assert "--disable-overlap-schedule" in argv
    dense = tmp_path / "dense"
    dense.mkdir()
    (dense / "config.json").write_text(json.dumps({"model_type": "llama"}))
    assert "--disable-overlap-schedule" not in cpu_flags(["--model-path", str(dense)])


def test_launcher_gives_a_long_cpu_prefill_time_before_the_watchdog_stops_the_server():
    """SGLang's scheduler watchdog kills the server when one forward runs past ``--watchdog-timeout`` (300 s
    by default); one 32K prefill on two CPU cores ran past that. The launcher and the CPU engines give it an
    hour unless the caller sets it."""
    import inspect

    from sglang.srt.server_args import ServerArgs

    stock = inspect.signature(ServerArgs).parameters["watchdog_timeout"].default
    argv = cpu_flags(["--model-path", "m"])
    assert float(argv[argv.index("--watchdog-timeout") + 1]) >= 3600 > stock
    assert CPU_SERVER_ARGS["watchdog_timeout"] >= 3600
    mine = cpu_flags(["--model-path", "m", "--watchdog-timeout", "60"])
    assert mine.count("--watchdog-timeout") == 1 and mine[mine.index("--watchdog-timeout") + 1] == "60"


def test_server_cli_args_match_the_launcher():
    assert "--sleep-on-idle" in server_cli_args() and CPU_SERVER_ARGS["sleep_on_idle"] is True


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="needs CPU affinity (Linux)")
def test_threads_follow_the_cpu_affinity():
    assert usable_cores() == len(os.sched_getaffinity(0))
    assert cpu_environment({})["OMP_NUM_THREADS"] == str(len(os.sched_getaffinity(0)))


def test_threads_given_or_inherited():
    assert cpu_environment({"OMP_NUM_THREADS": "1"})["OMP_NUM_THREADS"] == "1"
    assert cpu_environment({"OMP_NUM_THREADS": "1"}, threads=3)["OMP_NUM_THREADS"] == "3"
