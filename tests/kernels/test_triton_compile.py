"""The GPU path of every Triton kernel compiles for sm_90 (no GPU needed), in a subprocess."""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import subprocess
import sys

import pytest

from tests.kernels.sm90_compile import _variants

ROOT = pathlib.Path(__file__).resolve().parents[2]
# H100/H200 shared memory per block (227 KiB usable).
MAX_SHARED = 227 * 1024


def _ptxas_available() -> bool:
    spec = importlib.util.find_spec("triton")
    if spec is None:
        return False
    return (pathlib.Path(spec.origin).parent / "backends" / "nvidia" / "bin" / "ptxas").exists()


@pytest.fixture(scope="module")
def results() -> dict:
    if not _ptxas_available():
        pytest.skip("triton with its bundled ptxas is not installed")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    command = [sys.executable, "-m", "tests.kernels.sm90_compile"]
    proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        pytest.fail(f"sm_90 compilation script failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("label", list(_variants()))
def test_kernel_compiles_for_sm90(results: dict, label: str) -> None:
    result = results[label]
    assert result["compiled"], result.get("error")
    assert 0 <= result["shared_bytes"] <= MAX_SHARED
    assert result["tensor_cores"], "tensor-core use differs from what the variant is meant to do"
