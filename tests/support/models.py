"""Random-weight checkpoints generated at test time (no model hub is reachable).

Weights come from the model class's own initialiser under a fixed seed, not ``--load-format dummy``:
dummy weights are so small that every logprob is ``log(1/V)`` and every comparison passes trivially.
"""

from __future__ import annotations

import functools
import inspect
import pathlib

import torch

FAMILIES = ("llama", "qwen2", "qwen3")
HYBRID_FAMILIES = ("qwen3_5", "qwen3_next")  # Gated DeltaNet hybrids (attention every 4th layer)
VOCAB_SIZE = 1024
HYBRID_ATTENTION_EVERY = 4


@functools.lru_cache(maxsize=1)
def _training_text() -> list[str]:
    """Real text to train the tiny tokenizer on: this repository's own sources and the stdlib's."""
    import asyncio  # any stdlib module with plenty of prose and code

    stdlib = pathlib.Path(inspect.getsourcefile(asyncio)).parent.parent
    files = sorted(stdlib.glob("*.py"))[:40]
    return [f.read_text(errors="ignore") for f in files]


def make_tokenizer(out_dir: pathlib.Path, vocab_size: int = VOCAB_SIZE):
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


def _config(family: str, num_layers: int, hidden_size: int, vocab_size: int, tie: bool):
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
    raise ValueError(f"unknown family {family!r}; expected one of {FAMILIES + HYBRID_FAMILIES}")


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
    """Write an HF folder (config, safetensors weights, optionally a tokenizer) for a random model.

    ``init_std`` is larger than the HF default (0.02) so the residual stream changes visibly from layer
    to layer: fills then differ measurably from exact prefill, and exactness tests can fail.
    """
    from transformers import AutoModelForCausalLM

    path = pathlib.Path(path)
    path.mkdir(parents=True, exist_ok=True)
    config = _config(family, num_layers, hidden_size, VOCAB_SIZE, tie_word_embeddings)
    config.initializer_range = init_std
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    if family in HYBRID_FAMILIES:
        _spread_gdn_memory(model, seed)
    model.save_pretrained(path)
    if family in HYBRID_FAMILIES:
        # SGLang reads the layer layout from full_attention_interval, which transformers does not save.
        import json

        cfg_path = path / "config.json"
        cfg = json.loads(cfg_path.read_text())
        cfg["full_attention_interval"] = HYBRID_ATTENTION_EVERY
        cfg_path.write_text(json.dumps(cfg, indent=2))
    if with_tokenizer:
        make_tokenizer(path)
    return path
