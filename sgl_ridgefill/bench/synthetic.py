"""Random-weight benchmark artifacts: a model of a real shape and a maps folder for it.

Speed does not depend on the weights, only on the shape, so TTFT can be measured without a model hub:
``make_random_model`` writes an HF folder (bf16 safetensors) of a Qwen2, Llama or Qwen3.5 (Gated DeltaNet
hybrid) shape (:data:`SHAPES`)
under a fixed seed, and ``make_near_identity_maps`` writes a valid maps folder for it (``A = I + noise``,
``b = 0``) with the model's own fingerprint, so a RidgeFill server accepts it. Neither says anything about
quality.

    python -m sgl_ridgefill.bench.synthetic --out /tmp/rfbench          # model/ and maps-s12/
    python -m sgl_ridgefill.bench.synthetic --out /tmp/rf8b --shape llama-3.1-8b --device cuda
    python -m sgl_ridgefill.bench.synthetic --out /tmp/rfq35 --shape qwen3.5-d1024 --split 9
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
from collections.abc import Sequence

import torch


FAMILIES = ("qwen2", "llama", "qwen3_5")


@dataclasses.dataclass(frozen=True)
class RandomModelShape:
    """The sizes of a Qwen2-, Llama- or Qwen3.5-family decoder (defaults: Qwen2-0.5B). Qwen3.5 also takes
    ``head_dim``, the Gated DeltaNet heads (``linear_*``) and ``attention_every`` (its layout: attention on
    every ``attention_every``-th layer, Gated DeltaNet between)."""

    num_layers: int = 24
    hidden_size: int = 896
    num_heads: int = 14
    num_kv_heads: int = 2
    intermediate_size: int = 4864
    vocab_size: int = 151936
    tie_word_embeddings: bool = True
    family: str = "qwen2"
    rope_theta: float = 1_000_000.0
    max_position_embeddings: int = 32768
    head_dim: int | None = None
    linear_key_heads: int = 0
    linear_value_heads: int = 0
    linear_head_dim: int = 128
    attention_every: int = 4

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise ValueError(f"RandomModelShape.family must be one of {', '.join(FAMILIES)}, got {self.family!r}")
        for name in ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "intermediate_size", "vocab_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"RandomModelShape.{name} must be a positive integer, got {value!r}")
        if self.hidden_size % self.num_heads and self.head_dim is None:
            raise ValueError(f"RandomModelShape: hidden_size {self.hidden_size} is not a multiple of num_heads {self.num_heads}")
        if self.family == "qwen3_5" and (self.linear_key_heads < 1 or self.linear_value_heads % self.linear_key_heads):
            raise ValueError("RandomModelShape: a qwen3_5 shape needs linear_value_heads a multiple of linear_key_heads >= 1")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"RandomModelShape: num_heads {self.num_heads} is not a multiple of num_kv_heads {self.num_kv_heads}")


QWEN2_0_5B = RandomModelShape()
LLAMA_3_1_8B = RandomModelShape(
    num_layers=32, hidden_size=4096, num_heads=32, num_kv_heads=8, intermediate_size=14336, vocab_size=128256,
    tie_word_embeddings=False, family="llama", rope_theta=500_000.0, max_position_embeddings=131072,
)
# Qwen3.5-9B's proportions (heads of 256 with an output gate, Gated DeltaNet key heads 128 wide and twice as
# many value heads, MLP 3 d, attention every 4th layer) at a quarter of its width, 24 layers: small enough for
# 8K-token prefills on a CPU.
QWEN3_5_D1024 = RandomModelShape(
    num_layers=24, hidden_size=1024, num_heads=4, num_kv_heads=1, intermediate_size=3072, vocab_size=32768,
    tie_word_embeddings=False, family="qwen3_5", rope_theta=10_000_000.0, head_dim=256, linear_key_heads=4,
    linear_value_heads=8, linear_head_dim=128,
)
SHAPES = {"qwen2-0.5b": QWEN2_0_5B, "llama-3.1-8b": LLAMA_3_1_8B, "qwen3.5-d1024": QWEN3_5_D1024}


def make_random_model(
    out_dir: str | pathlib.Path,
    shape: RandomModelShape = QWEN2_0_5B,
    *,
    seed: int = 0,
    init_std: float = 0.05,
    device: str = "cpu",
) -> pathlib.Path:
    """Write a random-weight ``Qwen2ForCausalLM`` or ``LlamaForCausalLM`` (bf16) to ``out_dir``; returns it.

    ``init_std`` is above HF's 0.02 so the residual stream moves from layer to layer (not needed for
    speed, but keeps outputs from collapsing to one token). No tokenizer: serve it with
    ``--skip-tokenizer-init`` and send token ids. ``device="cuda"`` initialises the weights there in bf16
    (an 8B model in seconds instead of 32 GB of float32 on the host; other weights than on CPU).
    """
    from transformers import (
        LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3_5ForCausalLM, Qwen3_5TextConfig,
    )

    config_class, model_class = {"qwen2": (Qwen2Config, Qwen2ForCausalLM), "llama": (LlamaConfig, LlamaForCausalLM),
                                 "qwen3_5": (Qwen3_5TextConfig, Qwen3_5ForCausalLM)}[shape.family]
    out_dir = pathlib.Path(out_dir)
    extra: dict = {}
    if shape.family == "qwen3_5":
        extra = dict(
            head_dim=shape.head_dim, linear_num_key_heads=shape.linear_key_heads,
            linear_num_value_heads=shape.linear_value_heads, linear_key_head_dim=shape.linear_head_dim,
            linear_value_head_dim=shape.linear_head_dim,
            layer_types=[("full_attention" if (l + 1) % shape.attention_every == 0 else "linear_attention")
                         for l in range(shape.num_layers)],
        )
    config = config_class(
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_layers,
        num_attention_heads=shape.num_heads,
        num_key_value_heads=shape.num_kv_heads,
        vocab_size=shape.vocab_size,
        tie_word_embeddings=shape.tie_word_embeddings,
        max_position_embeddings=shape.max_position_embeddings,
        rope_theta=shape.rope_theta,
        initializer_range=init_std,
        bos_token_id=0,
        eos_token_id=1,
        **extra,
    )
    torch.manual_seed(seed)
    if device == "cpu":
        model = model_class(config).to(torch.bfloat16)
    else:
        previous = torch.get_default_dtype()
        torch.set_default_dtype(torch.bfloat16)
        try:
            with torch.device(device):
                model = model_class(config)
        finally:
            torch.set_default_dtype(previous)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    if shape.family == "qwen3_5":  # SGLang reads the layout from full_attention_interval (transformers drops it)
        cfg_path = out_dir / "config.json"
        cfg = json.loads(cfg_path.read_text())
        cfg["full_attention_interval"] = shape.attention_every
        cfg_path.write_text(json.dumps(cfg, indent=2))
    return out_dir


def make_near_identity_maps(
    model_dir: str | pathlib.Path,
    out_dir: str | pathlib.Path,
    *,
    split: int = 12,
    noise: float = 0.01,
    seed: int = 0,
    force: bool = False,
) -> pathlib.Path:
    """Write a maps folder for the model in ``model_dir``: ``A_l = I + noise * G / sqrt(d)``, ``b_l = 0``.

    The fingerprint is the model's own, so a server started on ``model_dir`` loads the folder without a
    mismatch. The maps cost the same to apply as fitted ones (a dense ``d x d`` per upper layer).
    """
    from transformers import AutoModelForCausalLM

    from ..maps import SplitMaps, hf_fingerprint_layers, model_fingerprint, write_maps_folder

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16)
    config = model.config
    num_layers, d = config.num_hidden_layers, config.hidden_size
    if not 1 <= split < num_layers:
        raise ValueError(f"split {split} is outside 1..{num_layers - 1} for the {num_layers}-layer model in {model_dir}")
    gen = torch.Generator().manual_seed(seed)
    n_upper = num_layers - split
    a = torch.eye(d).expand(n_upper, d, d) + noise / d**0.5 * torch.randn(n_upper, d, d, generator=gen)
    fingerprint = model_fingerprint(
        config.to_dict(), model.model.embed_tokens.weight, model.model.norm.weight, hf_fingerprint_layers(model)
    )
    return write_maps_folder(
        out_dir,
        [SplitMaps(split, a, torch.zeros(n_upper, d), {"lambda": None, "kind": "near-identity", "noise": noise})],
        model=fingerprint,
        calibration={"kind": "near-identity", "documents": 0, "tokens": 0, "longest_document_tokens": 0},
        force=force,
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sgl_ridgefill.bench.synthetic", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=pathlib.Path, required=True, help="writes OUT/model and OUT/maps-s<split>")
    parser.add_argument("--split", type=int, default=12)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="qwen2-0.5b")
    parser.add_argument("--device", default="cpu", help="where the random weights are drawn (cuda: fast, for 8B)")
    args = parser.parse_args(argv)
    model_dir, maps_dir = make_model_and_maps(args.out, SHAPES[args.shape], split=args.split, seed=args.seed,
                                              device=args.device)
    print(json.dumps({"model": str(model_dir), "maps": str(maps_dir)}))
    return 0


def make_model_and_maps(
    out: str | pathlib.Path, shape: RandomModelShape = QWEN2_0_5B, *, split: int = 12, seed: int = 0,
    device: str = "cpu",
) -> tuple[pathlib.Path, pathlib.Path]:
    """``OUT/model`` and ``OUT/maps-s<split>``, each made unless it is already there."""
    model_dir = pathlib.Path(out) / "model"
    if not (model_dir / "config.json").is_file():
        make_random_model(model_dir, shape, seed=seed, device=device)
    maps_dir = pathlib.Path(out) / f"maps-s{split}"
    if not (maps_dir / "manifest.json").is_file():
        make_near_identity_maps(model_dir, maps_dir, split=split, seed=seed)
    return model_dir, maps_dir


if __name__ == "__main__":
    raise SystemExit(main())
