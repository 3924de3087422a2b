"""What RidgeFill needs from a served model, for the Llama, Qwen2 and Qwen3 families of SGLang 0.5.23.

All three share one shape: ``lm.model.embed_tokens``, ``lm.model.layers[i]`` with ``input_layernorm`` and
``self_attn`` (``qkv_proj``, ``rotary_emb``, ``attn``; Qwen3 adds a per-head ``k_norm``), ``lm.model.norm``,
``lm.lm_head`` and ``lm.logits_processor``. The fill needs only K and V of a layer, so it multiplies by the K
and V rows of the fused QKV weight instead of running the whole projection (Q is 78 % of it on
Qwen2-0.5B).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..arch import DENSE_ARCHITECTURES, HYBRID_ARCHITECTURES
from ..cpu.matmul import linear  # F.linear, through float32 for bfloat16 on a CPU without it

SUPPORTED_ARCHITECTURES = DENSE_ARCHITECTURES  # HF class -> family (arch.py)


class UnsupportedModelError(ValueError):
    pass


@dataclass(frozen=True)
class ModelShape:
    family: str
    num_layers: int
    hidden_size: int
    num_kv_heads: int
    head_dim: int
    has_qk_norm: bool

    @property
    def kv_dim(self) -> int:
        """Width of one layer's K (or V) on this rank: ``kv_heads * head_dim``."""
        return self.num_kv_heads * self.head_dim


class ModelAdapter:
    """Reads the layers of an SGLang ``*ForCausalLM`` (tensor parallel size 1, no pipeline parallel)."""

    def __init__(self, lm: torch.nn.Module):
        family = SUPPORTED_ARCHITECTURES.get(type(lm).__name__)
        if family is None:
            raise UnsupportedModelError(
                f"RidgeFill supports {', '.join(sorted(SUPPORTED_ARCHITECTURES))} and the hybrids "
                f"{', '.join(sorted(HYBRID_ARCHITECTURES))}; this model is {type(lm).__name__}"
            )
        self.lm = lm
        self.model = lm.model
        self.layers = self.model.layers
        if getattr(self.model, "start_layer", 0) != 0 or getattr(self.model, "end_layer", len(self.layers)) != len(self.layers):
            raise UnsupportedModelError("RidgeFill does not support pipeline parallelism")
        attn0 = self.layers[0].self_attn
        self.shape = ModelShape(
            family=family,
            num_layers=len(self.layers),
            hidden_size=lm.config.hidden_size,
            num_kv_heads=attn0.attn.tp_k_head_num,
            head_dim=attn0.attn.qk_head_dim,
            has_qk_norm=hasattr(attn0, "k_norm"),
        )
        self._kv_weights = [self._kv_weight(layer.self_attn) for layer in self.layers]

    @staticmethod
    def _kv_weight(attn) -> tuple[torch.Tensor, torch.Tensor | None] | None:
        """The K and V rows of the fused QKV weight, or ``None`` when the layer is quantised (then the fill
        runs the whole projection and drops Q)."""
        proj = attn.qkv_proj
        weight = getattr(proj, "weight", None)
        if weight is None or not weight.dtype.is_floating_point or weight.dim() != 2:
            return None
        if type(getattr(proj, "quant_method", None)).__name__ not in ("UnquantizedLinearMethod", "NoneType"):
            return None
        bias = getattr(proj, "bias", None)
        w = weight[attn.q_size :]
        b = None if bias is None else bias[attn.q_size :]
        return w, b

    def fingerprint_layers(self) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """Per layer, ``(input norm weight [d], K rows of KV head 0 [head_dim, d], V rows of KV head 0)``:
        what ``maps.model_fingerprint`` checks against the model the maps were fitted on (KV head 0 is on
        tensor-parallel rank 0). Empty when a projection is quantised: its rows cannot be read."""
        out = []
        d = self.shape.head_dim
        for layer in self.layers:
            attn = layer.self_attn
            weight = getattr(attn.qkv_proj, "weight", None)
            if weight is None or not weight.dtype.is_floating_point or weight.dim() != 2:
                return []
            k = weight[attn.q_size : attn.q_size + d]
            v = weight[attn.q_size + attn.kv_size : attn.q_size + attn.kv_size + d]
            out.append((layer.input_layernorm.weight, k, v))
        return out

    # Layer structure: every layer of these families is softmax attention. The hybrid families
    # (``hybrid_adapter.py``) override these.
    @property
    def attention_layers(self) -> tuple[int, ...]:
        return tuple(range(self.shape.num_layers))

    @property
    def recurrent_layers(self) -> tuple[int, ...]:
        return ()

    def is_recurrent(self, layer_id: int) -> bool:
        """Whether layer ``layer_id`` keeps a recurrent state (Gated DeltaNet) instead of a KV cache."""
        return False

    def attention(self, layer_id: int):
        """Layer ``layer_id``'s ``RadixAttention`` (the module whose KV cache RidgeFill fills)."""
        return self.layers[layer_id].self_attn.attn

    def run_layer(self, layer_id: int, positions: torch.Tensor, hidden: torch.Tensor, fb) -> torch.Tensor:
        """SGLang's decoder layer ``layer_id`` on ``hidden`` (its residual stream in ``fb``), called as the
        model calls it (by keyword: Qwen3.5's recurrent layers take only ``hidden_states`` positionally)."""
        return self.layers[layer_id](positions=positions, hidden_states=hidden, forward_batch=fb)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed_tokens(input_ids)

    def key_value(self, layer_id: int, positions: torch.Tensor, x_in: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V that layer ``layer_id`` writes for rows whose layer input is ``x_in``.

        ``x_in``: ``[rows, hidden]`` (residual stream before the input norm); ``positions``: ``[rows]``.
        Returns ``k, v``: ``[rows, kv_heads, head_dim]``, K after the K norm (Qwen3) and RoPE.
        """
        layer = self.layers[layer_id]
        attn = layer.self_attn
        h = layer.input_layernorm(x_in)
        kv_w = self._kv_weights[layer_id]
        if kv_w is not None:
            kv = linear(h, kv_w[0], kv_w[1])
            k, v = kv.split([attn.kv_size, attn.kv_size], dim=-1)
        else:
            qkv, _ = attn.qkv_proj(h)
            _, k, v = qkv.split([attn.q_size, attn.kv_size, attn.kv_size], dim=-1)
        return self.rope_key(layer_id, positions, k), v.reshape(-1, self.shape.num_kv_heads, self.shape.head_dim)

    def value(self, layer_id: int, x_in: torch.Tensor) -> torch.Tensor:
        """V only: ``[rows, kv_heads, head_dim]`` (the value rescale compares exact and predicted values)."""
        layer = self.layers[layer_id]
        attn = layer.self_attn
        h = layer.input_layernorm(x_in)
        kv_w = self._kv_weights[layer_id]
        if kv_w is not None:
            w, b = kv_w
            v = linear(h, w[attn.kv_size :], None if b is None else b[attn.kv_size :])
        else:
            qkv, _ = attn.qkv_proj(h)
            v = qkv[..., attn.q_size + attn.kv_size :]
        return v.reshape(-1, self.shape.num_kv_heads, self.shape.head_dim)

    def rope_key(self, layer_id: int, positions: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        attn = self.layers[layer_id].self_attn
        rows, d = k.shape[0], self.shape.head_dim
        k = k.reshape(rows, -1)
        if self.shape.has_qk_norm:
            k = attn.k_norm(k.reshape(-1, d).contiguous()).reshape(rows, -1)
        # rotary_emb rotates a query and a key; a one-head dummy query keeps its cost negligible.
        dummy_q = k.new_zeros((rows, d))
        _, k = attn.rotary_emb(positions, dummy_q, k.contiguous())
        return k.reshape(rows, self.shape.num_kv_heads, d)
