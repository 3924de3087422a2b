"""Fixtures for tests that start real SGLang engines on CPU: tiny random checkpoints and maps folders."""

from __future__ import annotations

import functools

import pytest
import torch

from sgl_ridgefill.tools.synthetic import make_tiny_checkpoint, make_tiny_maps, near_identity_maps
from tests.support.reference import Reference

SPLIT = 2
NUM_LAYERS = 4


def random_maps(hf_model, split: int, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Maps near the identity with enough noise that RidgeFill and identity fill differ (those of
    ``make_tiny_maps``, for every upper layer of ``hf_model``)."""
    cfg = hf_model.config
    return near_identity_maps(cfg.num_hidden_layers - split, cfg.hidden_size, noise=0.05, bias_noise=0.02, seed=seed)


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


# The engine tests' attention selection: 10 % of the prefix by the attention of the last Q prompt tokens in
# layers 0 and 1 (``attention_policy``), and the rows it must choose (``attention_rows``).
Q = 8
ATTENTION_SELECT = f"attention_topk(q={Q}, share=10%, layers=[0, 1])"


def attention_policy(name: str, *, tail: int, select: str = ATTENTION_SELECT) -> str:
    """A ``.rfpolicy`` text at the engine tests' split and the given tail."""
    return f"""
policy "{name}" {{
  arm ridgefill
  split {SPLIT}
  tail {tail}
  select {select}
}}
"""


def attention_rows(model: TinyModel, ids: list[int], *, tail: int) -> list[int]:
    """The prefix rows :data:`ATTENTION_SELECT` chooses for ``ids``, from the PyTorch reference."""
    n = len(ids)
    scores = model.ref.attention_received(ids, layers=(0, 1), q_rows=range(n - Q, n))[: n - tail]
    return sorted(torch.topk(scores, round(0.10 * (n - tail))).indices.tolist())


def policy_env(model: TinyModel, tmp_path_factory, name: str, text: str, **variables: str) -> dict:
    """The ``RIDGEFILL_*`` environment of an engine serving the policy ``text`` (written to a temporary file
    ``name.rfpolicy``) with ``model``'s maps; ``variables``: more variables (``RIDGEFILL_DIAGNOSTICS="1"``)."""
    path = tmp_path_factory.mktemp(name) / f"{name}.rfpolicy"
    path.write_text(text)
    return {"RIDGEFILL_PREFILL_BACKEND": "ridgefill", "RIDGEFILL_MAPS": str(model.maps_dir),
            "RIDGEFILL_POLICY": str(path), **variables}


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


# --------------------------------------------------------------------------- Gated DeltaNet hybrids (Qwen3.5)
HYBRID_SPLIT = 3  # upper layers: 3 and 7 attention, 4..6 Gated DeltaNet
HYBRID_LAYERS = 8
HYBRID_HIDDEN = 64
TERMINAL_FILE = "terminal_state.safetensors"

# What a CPU engine needs for a hybrid model besides cpu_engine_kwargs (the CPU recipe for Gated DeltaNet).
# The static fraction is of the memory free at startup: a larger share than the dense tests' 0.05 keeps a
# shared machine's fluctuations from leaving the state cache nothing (the KV pool stays capped by
# max_total_tokens).
HYBRID_ENGINE_KWARGS = dict(mamba_radix_cache_strategy="no_buffer", disable_overlap_schedule=True,
                            max_mamba_cache_size=32, mem_fraction_static=0.25)
HYBRID_ENV = {"SGLANG_MAMBA_CONV_DTYPE": "float32"}  # a float32 conv window, as transformers keeps it


def random_offsets(hf_model, split: int, seed: int = 2) -> dict[int, torch.Tensor]:
    """Terminal-state offsets ``ΔM_l`` ``[HV, V, K]`` for every upper GDN layer: random, large enough to move
    the tail's output (what the runtime must add is ρ ΔM, whatever ΔM is)."""
    cfg = hf_model.config
    gen = torch.Generator().manual_seed(seed)
    shape = (cfg.linear_num_value_heads, cfg.linear_value_head_dim, cfg.linear_key_head_dim)
    return {l: 0.5 * torch.randn(shape, generator=gen) for l, kind in enumerate(cfg.layer_types)
            if l >= split and kind == "linear_attention"}


class TinyHybrid:
    """A random Qwen3.5 (or Qwen3-Next) checkpoint, its HF twin, the hybrid oracle, maps at ``HYBRID_SPLIT`` for every upper
    layer, and terminal-state offsets (random) in the maps folder."""

    def __init__(self, root, family: str = "qwen3_5"):
        from sgl_ridgefill.maps import SplitMaps, hf_fingerprint_layers, load_maps, model_fingerprint, write_maps_folder
        from sgl_ridgefill.maps.terminal import write_terminal_offsets
        from tests.support.reference import HybridReference

        self.family = family
        self.path = make_tiny_checkpoint(root / family, family=family, num_layers=HYBRID_LAYERS,
                                         hidden_size=HYBRID_HIDDEN)
        self.hf = _load_hf(str(self.path))
        self.ref = HybridReference(self.hf)
        a, b = random_maps(self.hf, HYBRID_SPLIT)
        hf = self.hf
        fingerprint = model_fingerprint(
            hf.config.to_dict(), hf.model.embed_tokens.weight, hf.model.norm.weight, hf_fingerprint_layers(hf)
        )
        self.maps_dir = write_maps_folder(root / f"{family}-maps", [SplitMaps(HYBRID_SPLIT, a, b, {"lambda": None})],
                                          model=fingerprint)
        self.maps = load_maps(self.maps_dir).load_split(HYBRID_SPLIT, dtype=torch.float32)
        self.offsets = random_offsets(self.hf, HYBRID_SPLIT)
        write_terminal_offsets(self.maps_dir, self.offsets, split=HYBRID_SPLIT, arm="ridgefill",
                               record={"measured": "random offsets for tests"})

    def expected_top(self, ids, k: int = 3, **kw) -> list[tuple[float, int]]:
        if kw.pop("terminal_state", False):
            kw["terminal"] = self.offsets
        logits = self.ref.last_logits(ids, maps=self.maps, **kw)
        top = logits.log_softmax(-1).topk(k)
        return list(zip(top.values.tolist(), top.indices.tolist()))


@pytest.fixture(scope="session")
def tiny_hybrids(tmp_path_factory):
    root = tmp_path_factory.mktemp("hybrid")
    cache: dict[str, TinyHybrid] = {}

    def get(family: str) -> TinyHybrid:
        if family not in cache:
            cache[family] = TinyHybrid(root, family)
        return cache[family]

    return get


@pytest.fixture(scope="session")
def tiny_hybrid(tiny_hybrids):
    return tiny_hybrids("qwen3_5")
