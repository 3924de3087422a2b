"""What RidgeFill reads from a Gated DeltaNet hybrid served by SGLang 0.5.23: Qwen3.5 dense text models and
Qwen3-Next.

``lm.model.layers[i]`` is an attention layer (every ``full_attention_interval``-th layer) or a Gated DeltaNet
("GDN") layer with a ``linear_attn`` mixer. Both have ``input_layernorm`` and ``post_attention_layernorm``
(Gemma RMSNorms) and an ``mlp`` (dense on Qwen3.5, a sparse MoE block on Qwen3-Next).

- Attention layers keep their projections on the layer itself: ``qkv_proj`` rows are ``[q and output gate
  (2 * q_size, per head q then gate) | k | v]``, ``k_norm`` is a per-head Gemma RMSNorm, ``rotary_emb`` a
  partial RoPE. The fill multiplies by the K and V rows only, as for the dense families.
- A GDN layer's mixer is ``linear_attn``: ``in_proj_qkvz`` rows ``[q | k | v | z]`` (contiguous blocks on
  Qwen3.5; on Qwen3-Next interleaved per key head, ``[q_g | k_g | v_g | z_g]``, and ``in_proj_ba`` likewise
  ``[b_g | a_g]``, which the adapter reorders once), ``in_proj_ba`` rows ``[b | a]``, then SGLang's
  ``RadixLinearAttention`` (short causal conv over ``[q|k|v]``
  and the gated delta rule, whose state lives in the request's slot of SGLang's ``MambaPool``), the gated
  output norm ``norm(o, z)`` and ``out_proj``. A filled row needs only ``[q|k|v]``, ``b`` and ``a`` (its state
  update); the ``z`` rows, the output norm, ``out_proj`` and the MLP run only for rows whose output is read.

Tensor parallel size 1 and unquantised projections only (the factory refuses the rest).
"""

from __future__ import annotations

import torch

from ..arch import FAMILIES, HYBRID_ARCHITECTURES
from ..cpu.matmul import linear  # F.linear, through float32 for bfloat16 on a CPU without it
from ..gdn_layout import gdn_rows
from .adapter import ModelAdapter, ModelShape, UnsupportedModelError

INTERLEAVED = tuple(f.name for f in FAMILIES if f.interleaved_gdn)  # GDN projections interleaved per key head
ATTENTION, GDN = "attention", "gdn"


def _weight(proj) -> torch.Tensor:
    weight = getattr(proj, "weight", None)
    if weight is None or not weight.dtype.is_floating_point or weight.dim() != 2:
        raise UnsupportedModelError("RidgeFill needs unquantised projections on hybrid models")
    if type(getattr(proj, "quant_method", None)).__name__ not in ("UnquantizedLinearMethod", "NoneType"):
        raise UnsupportedModelError("RidgeFill needs unquantised projections on hybrid models")
    if getattr(proj, "bias", None) is not None:
        raise UnsupportedModelError("RidgeFill expects bias-free projections on hybrid models")
    return weight


class HybridModelAdapter(ModelAdapter):
    """Reads a Qwen3.5 (dense, text) or Qwen3-Next model: attention layers like the dense families, GDN
    layers through their input projections and SGLang's linear-attention backend."""

    def __init__(self, lm: torch.nn.Module):  # noqa: D107 - the base constructor reads layer 0's attention
        family = HYBRID_ARCHITECTURES.get(type(lm).__name__)
        if family is None:
            raise UnsupportedModelError(f"not a supported hybrid model: {type(lm).__name__}")
        config = lm.config
        self.lm = lm
        self.model = lm.model
        self.layers = self.model.layers
        if getattr(self.model, "start_layer", 0) != 0 or getattr(self.model, "end_layer", len(self.layers)) != len(self.layers):
            raise UnsupportedModelError("RidgeFill does not support pipeline parallelism")
        kinds = []
        for layer in self.layers:
            kinds.append(GDN if hasattr(layer, "linear_attn") else ATTENTION)
        self.layer_kinds = tuple(kinds)
        attention = [l for l, k in enumerate(kinds) if k == ATTENTION]
        if not attention:
            raise UnsupportedModelError("the hybrid model has no attention layer")
        first = self.layers[attention[0]]
        self.shape = ModelShape(
            family=family,
            num_layers=len(self.layers),
            hidden_size=config.hidden_size,
            num_kv_heads=first.attn.tp_k_head_num,
            head_dim=first.attn.qk_head_dim,
            has_qk_norm=True,
        )
        self._kv_weights = {}
        for l in attention:
            layer = self.layers[l]
            start = layer.q_size * (2 if layer.attn_output_gate else 1)
            self._kv_weights[l] = (_weight(layer.qkv_proj)[start:], None)
        self._gdn_weights = {}
        for l, kind in enumerate(kinds):
            if kind != GDN:
                continue
            mixer = self.layers[l].linear_attn
            qkvz, ba = _weight(mixer.in_proj_qkvz), _weight(mixer.in_proj_ba)
            qkv_rows, z_rows, ba_rows = gdn_rows(mixer.num_k_heads, mixer.num_v_heads, mixer.head_k_dim,
                                                 mixer.head_v_dim, family in INTERLEAVED)
            if family in INTERLEAVED:  # reordered copies (one gather at load, none per row)
                self._gdn_weights[l] = (qkvz[qkv_rows.to(qkvz.device)].contiguous(),
                                        qkvz[z_rows.to(qkvz.device)].contiguous(), ba[ba_rows.to(ba.device)].contiguous())
            else:  # views
                self._gdn_weights[l] = (qkvz[: mixer.conv_dim], qkvz[mixer.conv_dim :], ba)

    # ------------------------------------------------------------------ structure
    @property
    def attention_layers(self) -> tuple[int, ...]:
        return tuple(l for l, k in enumerate(self.layer_kinds) if k == ATTENTION)

    @property
    def recurrent_layers(self) -> tuple[int, ...]:
        return tuple(l for l, k in enumerate(self.layer_kinds) if k == GDN)

    def is_recurrent(self, layer_id: int) -> bool:
        return self.layer_kinds[layer_id] == GDN

    def attention(self, layer_id: int):
        return self.layers[layer_id].attn

    def fingerprint_layers(self) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """Per layer ``(input norm weight, K rows, V rows)``: for an attention layer the rows of KV head 0
        (after the q/gate block), for a GDN layer the first ``head_dim`` rows of the K and V blocks of
        ``in_proj_qkvz`` (``maps.fingerprint.hf_fingerprint_layers`` reads the same rows from the HF model)."""
        d = self.shape.head_dim
        out = []
        for l, layer in enumerate(self.layers):
            if self.layer_kinds[l] == ATTENTION:
                kv = self._kv_weights[l][0]
                k, v = kv[:d], kv[layer.kv_size : layer.kv_size + d]
            else:
                mixer = layer.linear_attn
                qkv = self._gdn_weights[l][0]
                k = qkv[mixer.key_dim : mixer.key_dim + d]
                v = qkv[2 * mixer.key_dim : 2 * mixer.key_dim + d]
            out.append((layer.input_layernorm.weight, k, v))
        return out

    # ------------------------------------------------------------------ attention layers
    def key_value(self, layer_id: int, positions: torch.Tensor, x_in: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        layer = self.layers[layer_id]
        h = layer.input_layernorm(x_in)
        kv = linear(h, self._kv_weights[layer_id][0])
        k, v = kv.split([layer.kv_size, layer.kv_size], dim=-1)
        return self.rope_key(layer_id, positions, k), v.reshape(-1, self.shape.num_kv_heads, self.shape.head_dim)

    def value(self, layer_id: int, x_in: torch.Tensor) -> torch.Tensor:
        layer = self.layers[layer_id]
        h = layer.input_layernorm(x_in)
        v = linear(h, self._kv_weights[layer_id][0][layer.kv_size :])
        return v.reshape(-1, self.shape.num_kv_heads, self.shape.head_dim)

    def rope_key(self, layer_id: int, positions: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        layer = self.layers[layer_id]
        rows, d = k.shape[0], self.shape.head_dim
        k = layer.k_norm(k.reshape(-1, d).contiguous()).reshape(rows, -1)
        dummy_q = k.new_zeros((rows, d))
        _, k = layer.rotary_emb(positions, dummy_q, k.contiguous())
        return k.reshape(rows, self.shape.num_kv_heads, d)

    # ------------------------------------------------------------------ GDN layers
    def gdn_inputs(self, layer_id: int, x_in: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """What GDN layer ``layer_id`` feeds its state from rows whose layer input is ``x_in`` (``[rows, d]``):
        ``h`` (the normed input, ``[rows, d]``), ``mixed_qkv`` (``[rows, conv_dim]``, before the conv), ``a`` and
        ``b`` (``[rows, HV]``). The ``z`` rows of ``in_proj_qkvz`` are skipped."""
        layer = self.layers[layer_id]
        h = layer.input_layernorm(x_in)
        qkv_w, _, ba_w = self._gdn_weights[layer_id]
        mixed_qkv = linear(h, qkv_w)
        heads = layer.linear_attn.num_v_heads
        b, a = linear(h, ba_w).split([heads, heads], dim=-1)
        return h, mixed_qkv, a.contiguous(), b.contiguous()

    def gdn_output(self, layer_id: int, core: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """The mixer's output for rows whose recurrence output is ``core`` (``[rows, HV, V]``) and whose normed
        input is ``h`` (``[rows, d]``): gated output norm with ``z = h W_z``, then ``out_proj``: ``[rows, d]``."""
        mixer = self.layers[layer_id].linear_attn
        z = linear(h, self._gdn_weights[layer_id][1]).reshape(-1, mixer.head_v_dim)
        o = mixer.norm(core.reshape(-1, mixer.head_v_dim), z).reshape(h.shape[0], -1)
        out, _ = mixer.out_proj(o)
        return out

    def gdn_gates(self, layer_id: int, a: torch.Tensor) -> torch.Tensor:
        """Log decay ``g = -exp(A_log) softplus(a + dt_bias)``: ``[rows, HV]`` float32."""
        from ..gdn_ops import gdn_gates

        mixer = self.layers[layer_id].linear_attn
        return gdn_gates(mixer.A_log, a, mixer.dt_bias)

    def finish_layer(self, layer_id: int, x_in: torch.Tensor, mixed: torch.Tensor, fb=None) -> torch.Tensor:
        """Residual add, post-attention norm, MLP and residual add: the layer's output ``[rows, d]`` from its
        input ``x_in`` and the mixer's output ``mixed`` (``fb``: the batch a sparse MoE block is told about)."""
        layer = self.layers[layer_id]
        x_mid = x_in + mixed
        h = layer.post_attention_layernorm(x_mid)
        out = layer.mlp(h, forward_batch=fb) if hasattr(layer.mlp, "experts") else layer.mlp(h)
        return x_mid + out


def make_adapter(lm: torch.nn.Module) -> ModelAdapter:
    """The adapter for ``lm``: the dense families' or the hybrids'; ``UnsupportedModelError`` otherwise."""
    if type(lm).__name__ in HYBRID_ARCHITECTURES:
        return HybridModelAdapter(lm)
    return ModelAdapter(lm)
