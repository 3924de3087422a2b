"""The model architectures sgl-ridgefill serves and calibrates, declared once.

Each family names its Hugging Face class (what ``config.json`` lists and SGLang instantiates under the same
name), the SGLang module that defines it, the ``model_type`` values its configs carry, and its layout: dense
(attention in every layer) or a Gated DeltaNet hybrid (attention every few layers; ``interleaved_gdn`` when the
GDN projections interleave per key head). Everything else is derived from :data:`FAMILIES`: the runtime's
adapters, the patched model forwards, calibration's supported list, the profile phases, the CPU
environment's hybrid detection and the FLOP model's gated-attention types. Adding a family is one entry here
(plus its adapter code when its layers differ). Engine-free.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Family:
    name: str
    hf_class: str  # "LlamaForCausalLM"
    sglang_module: str  # sglang.srt.models.<module> defines hf_class
    model_types: tuple[str, ...]  # config.json "model_type" values
    hybrid: bool = False  # Gated DeltaNet layers between the attention layers (gated attention output too)
    interleaved_gdn: bool = False  # GDN projections interleaved per key head (Qwen3-Next)

    @property
    def model_forward(self) -> str:
        """The dotted ``forward`` of SGLang's class for this family (what RidgeFill's forward hook wraps)."""
        return f"sglang.srt.models.{self.sglang_module}.{self.hf_class}.forward"

    @property
    def inner_model(self) -> str:
        """The decoder stack's class name (``LlamaModel``): its ``forward`` is the exact forward in profiles."""
        return self.hf_class.replace("ForCausalLM", "Model")


FAMILIES: tuple[Family, ...] = (
    Family("llama", "LlamaForCausalLM", "llama", ("llama",)),
    Family("qwen2", "Qwen2ForCausalLM", "qwen2", ("qwen2",)),
    Family("qwen3", "Qwen3ForCausalLM", "qwen3", ("qwen3",)),
    Family("qwen3_5", "Qwen3_5ForCausalLM", "qwen3_5_text",
           ("qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text"), hybrid=True),
    Family("qwen3_next", "Qwen3NextForCausalLM", "qwen3_next", ("qwen3_next",), hybrid=True, interleaved_gdn=True),
)
BY_CLASS: dict[str, Family] = {f.hf_class: f for f in FAMILIES}
BY_NAME: dict[str, Family] = {f.name: f for f in FAMILIES}
assert len(BY_CLASS) == len(BY_NAME) == len(FAMILIES), "a family declared twice"

DENSE_ARCHITECTURES: dict[str, str] = {f.hf_class: f.name for f in FAMILIES if not f.hybrid}
HYBRID_ARCHITECTURES: dict[str, str] = {f.hf_class: f.name for f in FAMILIES if f.hybrid}
ALL_ARCHITECTURES: tuple[str, ...] = tuple(BY_CLASS)
MODEL_FORWARDS: tuple[str, ...] = tuple(f.model_forward for f in FAMILIES)
HYBRID_MODEL_TYPES: tuple[str, ...] = tuple(t for f in FAMILIES if f.hybrid for t in f.model_types)
DENSE_FAMILIES: tuple[str, ...] = tuple(f.name for f in FAMILIES if not f.hybrid)
HYBRID_FAMILIES: tuple[str, ...] = tuple(f.name for f in FAMILIES if f.hybrid)
