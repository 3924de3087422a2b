"""Random-weight benchmark artifacts: a model of a real shape and a maps folder for it.

Speed does not depend on the weights, only on the shape, so TTFT can be measured without a model hub:
``make_random_model`` writes an HF folder (bf16 safetensors) of the Qwen2-0.5B shape under a fixed seed,
and ``make_near_identity_maps`` writes a valid maps folder for it (``A = I + noise``, ``b = 0``) with the
model's own fingerprint, so a RidgeFill server accepts it. Neither says anything about quality.

    python -m sgl_ridgefill.bench.synthetic --out /tmp/rfbench          # model/ and maps-s12/
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
from collections.abc import Sequence

import torch


@dataclasses.dataclass(frozen=True)
class RandomModelShape:
    """The sizes of a Qwen2-family decoder (defaults: Qwen2-0.5B)."""

    num_layers: int = 24
    hidden_size: int = 896
    num_heads: int = 14
    num_kv_heads: int = 2
    intermediate_size: int = 4864
    vocab_size: int = 151936
    tie_word_embeddings: bool = True

    def __post_init__(self) -> None:
        for name in ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "intermediate_size", "vocab_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"RandomModelShape.{name} must be a positive integer, got {value!r}")
        if self.hidden_size % self.num_heads:
            raise ValueError(f"RandomModelShape: hidden_size {self.hidden_size} is not a multiple of num_heads {self.num_heads}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"RandomModelShape: num_heads {self.num_heads} is not a multiple of num_kv_heads {self.num_kv_heads}")


QWEN2_0_5B = RandomModelShape()


def make_random_model(
    out_dir: str | pathlib.Path,
    shape: RandomModelShape = QWEN2_0_5B,
    *,
    seed: int = 0,
    init_std: float = 0.05,
) -> pathlib.Path:
    """Write a random-weight ``Qwen2ForCausalLM`` (bf16) to ``out_dir``; returns the folder.

    ``init_std`` is above HF's 0.02 so the residual stream moves from layer to layer (not needed for
    speed, but keeps outputs from collapsing to one token). No tokenizer: serve it with
    ``--skip-tokenizer-init`` and send token ids.
    """
    from transformers import Qwen2Config, Qwen2ForCausalLM

    out_dir = pathlib.Path(out_dir)
    config = Qwen2Config(
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_layers,
        num_attention_heads=shape.num_heads,
        num_key_value_heads=shape.num_kv_heads,
        vocab_size=shape.vocab_size,
        tie_word_embeddings=shape.tie_word_embeddings,
        max_position_embeddings=32768,
        rope_theta=1_000_000.0,
        initializer_range=init_std,
        bos_token_id=0,
        eos_token_id=1,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config).to(torch.bfloat16)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
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
    from transformers import Qwen2ForCausalLM

    from ..maps import SplitMaps, hf_fingerprint_layers, model_fingerprint, write_maps_folder

    model = Qwen2ForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16)
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
    args = parser.parse_args(argv)
    model_dir = args.out / "model"
    if not (model_dir / "config.json").is_file():
        make_random_model(model_dir, seed=args.seed)
    maps_dir = args.out / f"maps-s{args.split}"
    if not (maps_dir / "manifest.json").is_file():
        make_near_identity_maps(model_dir, maps_dir, split=args.split, seed=args.seed)
    print(json.dumps({"model": str(model_dir), "maps": str(maps_dir)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
