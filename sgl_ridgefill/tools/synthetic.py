"""Random-weight artifacts: models of a real or a tiny shape and maps folders for them.

Speed does not depend on the weights, only on the shape, so TTFT can be measured without a model hub:
``make_random_model`` writes an HF folder (bf16 safetensors) of a Qwen2, Llama or Qwen3.5 (Gated DeltaNet
hybrid) shape (:data:`SHAPES`)
under a fixed seed, and ``make_near_identity_maps`` writes a valid maps folder for it (``A = I + noise``,
``b = 0``) with the model's own fingerprint, so a RidgeFill server accepts it. Neither says anything about
quality.

``make_tiny_checkpoint`` (a 4-layer float32 Llama, Qwen2 or Qwen3 with a small trained tokenizer) and
``make_tiny_maps`` (maps far enough from the identity that a fill differs visibly from exact prefill) are
what the engine tests and ``sgl-ridgefill soak --tiny`` serve.

    python -m sgl_ridgefill.tools.synthetic --out /tmp/rfbench          # model/ and maps-s12/
    python -m sgl_ridgefill.tools.synthetic --out /tmp/rf8b --shape llama-3.1-8b --device cuda
    python -m sgl_ridgefill.tools.synthetic --out /tmp/rfq35 --shape qwen3.5-d1024 --split 9
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import json
import pathlib
from collections.abc import Sequence

import torch

from ..arch import DENSE_FAMILIES, HYBRID_FAMILIES
from .args import command_parser


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


def near_identity_maps(
    n_upper: int, d: int, *, noise: float, bias_noise: float = 0.0, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """``A: [n_upper, d, d] = I + noise * G``, ``b: [n_upper, d] = bias_noise * g`` (``G``, ``g`` standard
    normal from one generator seeded with ``seed``, ``A``'s draw first; ``b = 0`` draws nothing)."""
    gen = torch.Generator().manual_seed(seed)
    a = torch.eye(d).expand(n_upper, d, d) + noise * torch.randn(n_upper, d, d, generator=gen)
    b = bias_noise * torch.randn(n_upper, d, generator=gen) if bias_noise else torch.zeros(n_upper, d)
    return a.contiguous(), b


def write_maps_for_model(
    model, out_dir: str | pathlib.Path, split: int, a: torch.Tensor, b: torch.Tensor, *,
    meta: dict | None = None, force: bool = False, **folder_kwargs,
) -> pathlib.Path:
    """Write ``a: [L - split, d, d]``, ``b: [L - split, d]`` as a maps folder at ``split`` carrying the
    fingerprint of ``model`` (a loaded HF causal LM), so a server on that model accepts it."""
    from ..maps import SplitMaps, hf_fingerprint_layers, model_fingerprint, write_maps_folder

    fingerprint = model_fingerprint(
        model.config.to_dict(), model.model.embed_tokens.weight, model.model.norm.weight, hf_fingerprint_layers(model)
    )
    return write_maps_folder(
        out_dir, [SplitMaps(split, a, b, meta or {"lambda": None})], model=fingerprint, force=force, **folder_kwargs
    )


def _check_split(split: int, num_layers: int, model_dir) -> None:
    if not 1 <= split < num_layers:
        raise ValueError(f"split {split} is outside 1..{num_layers - 1} for the {num_layers}-layer model in {model_dir}")


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

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype="auto")
    num_layers, d = model.config.num_hidden_layers, model.config.hidden_size
    _check_split(split, num_layers, model_dir)
    a, b = near_identity_maps(num_layers - split, d, noise=noise / d**0.5, seed=seed)
    return write_maps_for_model(
        model, out_dir, split, a, b, meta={"lambda": None, "kind": "near-identity", "noise": noise}, force=force,
        calibration={"kind": "near-identity", "documents": 0, "tokens": 0, "longest_document_tokens": 0},
    )


# ----------------------------------------------------------------------------- tiny models (tests, soak)
TINY_FAMILIES = DENSE_FAMILIES  # arch.py
TINY_HYBRID_FAMILIES = HYBRID_FAMILIES  # Gated DeltaNet hybrids (attention every 4th layer)
TINY_VOCAB_SIZE = 1024
TINY_HYBRID_ATTENTION_EVERY = 4


@functools.lru_cache(maxsize=1)
def _training_text() -> list[str]:
    """Real text to train the tiny tokenizer on: the standard library's own sources."""
    import asyncio  # any stdlib module with plenty of prose and code

    stdlib = pathlib.Path(inspect.getsourcefile(asyncio)).parent.parent
    files = sorted(stdlib.glob("*.py"))[:40]
    return [f.read_text(errors="ignore") for f in files]


def make_tokenizer(out_dir: pathlib.Path, vocab_size: int = TINY_VOCAB_SIZE):
    """Train a small byte-level BPE tokenizer and save it as a ``PreTrainedTokenizerFast``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>", "<|bos|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_training_text(), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", bos_token="<|bos|>")
    fast.save_pretrained(out_dir)
    return fast


def _tiny_config(family: str, num_layers: int, hidden_size: int, vocab_size: int, tie: bool):
    from transformers import LlamaConfig, Qwen2Config, Qwen3Config

    common = dict(
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=vocab_size,
        max_position_embeddings=32768,
        tie_word_embeddings=tie,
        bos_token_id=1,
        eos_token_id=0,
    )
    if family == "llama":
        return LlamaConfig(**common)
    if family == "qwen2":
        return Qwen2Config(**common)
    if family == "qwen3":
        return Qwen3Config(head_dim=hidden_size // 4, **common)
    if family == "qwen3_5":
        from transformers import Qwen3_5TextConfig

        # Linear-attention heads: 2 key heads, 4 value heads (HV > Hk, as in the real models), 16 wide each.
        return Qwen3_5TextConfig(
            head_dim=hidden_size // 2, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
            linear_value_head_dim=16, linear_conv_kernel_dim=4, **common,
        )
    if family == "qwen3_next":
        from transformers import Qwen3NextConfig

        # Sparse MoE on every layer: 4 experts, 2 per token, a gated shared expert.
        return Qwen3NextConfig(
            head_dim=hidden_size // 2, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
            linear_value_head_dim=16, linear_conv_kernel_dim=4, num_experts=4, num_experts_per_tok=2,
            moe_intermediate_size=hidden_size, shared_expert_intermediate_size=hidden_size, decoder_sparse_step=1,
            norm_topk_prob=True, **common,
        )
    raise ValueError(f"unknown family {family!r}; expected one of {TINY_FAMILIES + TINY_HYBRID_FAMILIES}")


def _spread_gdn_memory(model, seed: int) -> None:
    """Gate rates per value head from fast-forgetting to long-remembering (``A = exp(A_log)`` from 0.005 to 4;
    the initialiser's uniform 0.01..16 forgets almost everything within a few tokens), so the prefix's part of
    each state, and the fill's error in it, reaches the tail and the tests see it."""
    gen = torch.Generator().manual_seed(seed + 17)
    for layer in model.model.layers:
        mixer = getattr(layer, "linear_attn", None)
        if mixer is None:
            continue
        heads = mixer.A_log.numel()
        rates = torch.logspace(-2.3, 0.6, heads)[torch.randperm(heads, generator=gen)]
        with torch.no_grad():
            mixer.A_log.copy_(rates.log())


def make_tiny_checkpoint(
    path: str | pathlib.Path,
    family: str = "llama",
    num_layers: int = 4,
    hidden_size: int = 128,
    seed: int = 0,
    with_tokenizer: bool = True,
    tie_word_embeddings: bool = False,
    init_std: float = 0.05,
) -> pathlib.Path:
    """Write an HF folder (config, float32 safetensors weights, optionally a tokenizer) for a random model.

    Weights come from the model class's own initialiser under a fixed seed, not ``--load-format dummy``:
    dummy weights are so small that every logprob is ``log(1/V)`` and every comparison passes trivially.
    ``init_std`` is larger than the HF default (0.02) so the residual stream changes visibly from layer
    to layer: fills then differ measurably from exact prefill, and exactness tests can fail.
    """
    from transformers import AutoModelForCausalLM

    path = pathlib.Path(path)
    path.mkdir(parents=True, exist_ok=True)
    config = _tiny_config(family, num_layers, hidden_size, TINY_VOCAB_SIZE, tie_word_embeddings)
    config.initializer_range = init_std
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    if family in TINY_HYBRID_FAMILIES:
        _spread_gdn_memory(model, seed)
    model.save_pretrained(path)
    if family in TINY_HYBRID_FAMILIES:
        # SGLang reads the layer layout from full_attention_interval, which transformers does not save.
        cfg_path = path / "config.json"
        cfg = json.loads(cfg_path.read_text())
        cfg["full_attention_interval"] = TINY_HYBRID_ATTENTION_EVERY
        cfg_path.write_text(json.dumps(cfg, indent=2))
    if with_tokenizer:
        make_tokenizer(path)
    return path


def make_tiny_maps(
    model_dir: str | pathlib.Path, out_dir: str | pathlib.Path, *, split: int, seed: int = 1, force: bool = False,
    kind: str = "residual", sink: dict | None = None,
) -> pathlib.Path:
    """Maps for a tiny checkpoint at ``split``: near the identity (``A = I + 0.05 G``, ``b = 0.02 g``) with
    enough noise that RidgeFill, identity fill and exact prefill all differ, as maps of ``kind``
    (:func:`maps_of_kind`), with the sink rule ``sink``. Stored in the maps folder's default quantisation
    (bf16): read them back with ``load_maps`` for a reference."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    num_layers, d = model.config.num_hidden_layers, model.config.hidden_size
    _check_split(split, num_layers, model_dir)
    a, b = near_identity_maps(num_layers - split, d, noise=0.05, bias_noise=0.02, seed=seed)
    a, b = maps_of_kind(model, split, a, b, kind, seed=seed)
    return write_maps_for_model(model, out_dir, split, a, b, force=force, map_kind=kind, sink=sink)


@torch.no_grad()
def maps_of_kind(model, split: int, a: torch.Tensor, b: torch.Tensor, kind: str, *, seed: int = 0
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Residual maps ``x̂_l = A_l x_S + b_l`` recast as maps of ``kind`` for the HF model ``model``.

    ``residual``/``normalised``: unchanged (the layer's RMSNorm is scale-free). ``kv``: the layer's K/V
    projections applied to the prediction without its norm's ``1/rms`` (``[W_k; W_v] diag(g) A_l``);
    ``kv+context``: that, beside small random weights on the lag and running-mean features."""
    from ..maps.kinds import map_kind

    k = map_kind(kind)
    if not k.predicts_kv:
        return a, b
    a_kv, b_kv = [], []
    for j, layer in enumerate(model.model.layers[split:]):
        w, bias = _kv_of_unit_input(layer)
        a_kv.append(w @ a[j])
        b_kv.append(w @ b[j] + bias)
    a_out, b_out = torch.stack(a_kv), torch.stack(b_kv)
    if k.context:
        gen = torch.Generator().manual_seed(seed + 1)
        extra = 0.05 * torch.randn(a_out.shape[0], a_out.shape[1], 2 * a.shape[2], generator=gen) / a.shape[2] ** 0.5
        a_out = torch.cat([a_out, extra * a_out.abs().mean() * a.shape[2] ** 0.5], dim=2)
    return a_out.contiguous(), b_out.contiguous()


def _kv_of_unit_input(layer) -> tuple[torch.Tensor, torch.Tensor]:
    """``([W_k; W_v] diag(g), [b_k; b_v])`` float32 of an HF decoder layer: its K/V of ``u = x / rms(x)``, since
    its RMSNorm is ``g * u`` (zero biases where the projections have none)."""
    projs = (layer.self_attn.k_proj, layer.self_attn.v_proj)
    weight = torch.cat([p.weight.detach().float() for p in projs]).cpu()
    bias = torch.cat([p.bias.detach().float().cpu() if p.bias is not None else torch.zeros(p.out_features)
                      for p in projs])
    return weight * layer.input_layernorm.weight.detach().float().cpu()[None, :], bias


def main(argv: Sequence[str] | None = None) -> int:
    parser = command_parser("sgl_ridgefill.tools.synthetic", __doc__)
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

