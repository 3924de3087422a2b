"""The CPU environment of a server process: what it sets, and that a user's own values win."""

from __future__ import annotations

from sgl_ridgefill.cpu.environment import MALLOC_ENV, SHIM_DIR, cpu_environment


def test_defaults_for_a_cpu_server() -> None:
    env = cpu_environment({"PATH": "/bin"}, threads=2)
    assert env["OMP_NUM_THREADS"] == "2" and env["OMP_WAIT_POLICY"] == "PASSIVE"
    assert env["PYTHONPATH"].split(":")[0] == str(SHIM_DIR) and env["SGLANG_USE_CPU_ENGINE"] == "1"
    # glibc keeps freed memory: every allocation from the heap, never trimmed
    assert env["MALLOC_MMAP_THRESHOLD_"] == str(1 << 32) and env["MALLOC_TRIM_THRESHOLD_"] == str(1 << 36)
    assert set(MALLOC_ENV) <= set(env) and env["PATH"] == "/bin"


def test_a_users_own_settings_are_kept() -> None:
    mine = {"OMP_WAIT_POLICY": "ACTIVE", "MALLOC_MMAP_THRESHOLD_": "131072", "OMP_NUM_THREADS": "1"}
    env = cpu_environment(mine)
    assert {k: env[k] for k in mine} == mine
    assert env["MALLOC_TRIM_THRESHOLD_"] == MALLOC_ENV["MALLOC_TRIM_THRESHOLD_"]
