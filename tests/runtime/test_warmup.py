"""The startup warm-up: every entry compiles (here: launches, under the Triton interpreter) the kernels it
names, and off CUDA nothing runs."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import torch

from sgl_ridgefill.runtime.warmup import WARMUPS, warm_up
from tests.runtime.warmup_cases import CASES
from tests.support.interpreter import run_cases


@pytest.fixture(scope="module")
def results() -> dict:
    return run_cases("tests.runtime.warmup_cases", env={"OMP_NUM_THREADS": "1"})


@pytest.mark.parametrize("name", list(CASES))
def test_every_warmup_launches_its_kernels(results, name):
    assert results[name]["launches"] >= 2, "each warm-up runs two shapes: a multiple of 16 and another"
    assert results[name]["interpreted"]


def test_no_warmup_on_a_cpu(caplog):
    rt = SimpleNamespace(adapter=SimpleNamespace(model=SimpleNamespace(
        embed_tokens=SimpleNamespace(weight=torch.zeros(1)))))
    with caplog.at_level(logging.INFO, logger="sgl_ridgefill"):
        assert warm_up(rt, None) == []
    assert "RidgeFill warm-up: no Triton kernel to compile on cpu" in caplog.text
    assert [w.name for w in WARMUPS] == ["groups (SGLang's Triton extend kernel, masked)", "attention statistics", "maps"]
