"""Fixtures for tests that start real SGLang engines on CPU: tiny random checkpoints and maps folders."""

from __future__ import annotations

import functools

import pytest
import torch

from sgl_ridgefill.bench.synthetic import make_tiny_checkpoint, make_tiny_maps
from tests.support.reference import Reference

SPLIT = 2
NUM_LAYERS = 4


@functools.lru_cache(maxsize=None)
def _load_hf(path: str):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)


class TinyModel:
    """A random checkpoint, its HF twin, the reference oracle and a maps folder at ``SPLIT``."""

    def __init__(self, root, family: str):
        from sgl_ridgefill.maps import load_maps

        self.family = family
        self.path = make_tiny_checkpoint(root / family, family=family, num_layers=NUM_LAYERS)
        self.hf = _load_hf(str(self.path))
        self.ref = Reference(self.hf)
        # The maps are stored in bf16, which rounds them, so the reference reads them back.
        self.maps_dir = make_tiny_maps(self.path, root / f"{family}-maps", split=SPLIT)
        a_stored, b_stored = load_maps(self.maps_dir).load_split(SPLIT, dtype=torch.float32)
        self.maps = (a_stored, b_stored)

    def expected_top(self, ids, k: int = 3, **kw) -> list[tuple[float, int]]:
        kw.setdefault("maps", self.maps)
        logits = self.ref.last_logits(ids, **kw)
        top = logits.log_softmax(-1).topk(k)
        return list(zip(top.values.tolist(), top.indices.tolist()))


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    cache: dict[str, TinyModel] = {}

    def get(family: str) -> TinyModel:
        if family not in cache:
            cache[family] = TinyModel(root, family)
        return cache[family]

    return get


def assert_top_close(got: dict, expected: list[tuple[float, int]], atol: float = 2e-3) -> None:
    assert "error" not in got, got.get("error")
    got_top = got["top"]
    assert [t for _, t in got_top] == [t for _, t in expected], (got_top, expected)
    for (lp_got, _), (lp_exp, _) in zip(got_top, expected):
        assert abs(lp_got - lp_exp) <= atol, (got_top, expected)


def assert_decode_matches(model: TinyModel, expect: dict, got: dict, *, tail: int, steps: int = 2) -> None:
    """Decode steps run the full model over the prefilled cache: step ``j``'s top tokens equal the oracle's
    on the prompt plus the first ``j`` output tokens, whose rows join the exact tail."""
    ids = list(expect["ids"])
    kw = {k: v for k, v in expect.items() if k != "ids"}
    for step in range(1, steps + 1):
        ids.append(got["output_ids"][step - 1])
        assert_top_close({"top": got["tops"][step]}, model.expected_top(ids, split=SPLIT, tail=tail + step, **kw))
