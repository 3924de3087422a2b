"""SGLang's Triton extend and decode kernels, fed by the planner, against the reference attention on CPU.

The kernels run under ``TRITON_INTERPRET=1``, which must be set before triton decorates a kernel and would
leak into every other test of this process, so the cases run once in a child process
(``tests/attention/sglang_triton_cases.py``) and each case becomes one test here.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

from tests.attention.sglang_triton_cases import CASES

ROOT = pathlib.Path(__file__).resolve().parents[2]
# float32 throughout: only the accumulation order differs from the float64 reference.
TOL = 2e-5


@pytest.fixture(scope="module")
def results() -> dict:
    # One intra-op thread: the tensors are tiny, and a thread pool only adds synchronisation on a busy machine.
    env = {**os.environ, "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "tests.attention.sglang_triton_cases"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )
    if proc.returncode != 0:
        pytest.fail(f"SGLang kernel cases failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    if "skip" in report:
        pytest.skip(report["skip"])
    return report["cases"]


@pytest.mark.parametrize("name", list(CASES))
def test_sglang_kernel_matches_reference(results: dict, name: str) -> None:
    result = results[name]
    assert result["launches"] > 0, "no SGLang kernel was launched"
    assert result["interpreted"], "a launched kernel was not an interpreted Triton function"
    assert result["finite"], result
    assert result["err"] <= TOL, result
