"""An independent RidgeFill oracle in plain PyTorch over a Hugging Face model (no SGLang involved).

It recomputes, for one prompt, what the SGLang runtime must produce: exact lower layers for every row;
for the upper layers, K/V of filled rows from the arm's prediction; exact rows and the tail run every layer
together, layer by layer, attending causally by position; optional value rescale. Rows below ``start``
stand for a radix-cache hit: exact in every layer.
"""

from __future__ import annotations

import torch


def _rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def _rope(x, cos, sin):
    """``x``: [rows, heads, d]; ``cos``/``sin``: [rows, d]."""
    return x * cos[:, None, :] + _rotate_half(x) * sin[:, None, :]


class Reference:
    def __init__(self, hf_model):
        self.m = hf_model.eval()
        cfg = hf_model.config
        self.cfg = cfg
        self.layers = hf_model.model.layers
        self.n_heads = cfg.num_attention_heads
        self.n_kv = cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads

    def _qkv(self, layer_id, x_in, pos):
        layer = self.layers[layer_id]
        attn = layer.self_attn
        h = layer.input_layernorm(x_in)
        rows = h.shape[0]
        q = attn.q_proj(h).view(rows, self.n_heads, self.head_dim)
        k = attn.k_proj(h).view(rows, self.n_kv, self.head_dim)
        v = attn.v_proj(h).view(rows, self.n_kv, self.head_dim)
        if hasattr(attn, "q_norm"):
            q, k = attn.q_norm(q), attn.k_norm(k)
        cos, sin = self.m.model.rotary_emb(h[None], pos[None])
        return _rope(q, cos[0], sin[0]), _rope(k, cos[0], sin[0]), v

    @torch.no_grad()
    def last_logits(
        self,
        ids: list[int],
        *,
        split: int,
        tail: int,
        arm: str = "ridgefill",
        maps: tuple[torch.Tensor, torch.Tensor] | None = None,
        exact_rows: list[int] = (),
        start: int = 0,
        value_rescale: int | None = None,
        splice: str | None = None,
        tail_rows: bool = False,
    ) -> torch.Tensor:
        """Logits of the next token after ``ids`` ([vocab] float32); with ``tail_rows``, the logits of every
        tail row ([tail, vocab]). ``splice``: exact keys/values/both/key magnitude on the filled rows, in every
        upper layer or, as ``kind@first-last``, in those layers only."""
        m = self.m
        ids_t = torch.tensor(ids)[None]
        n = len(ids)
        boundary = max(n - tail, 0)
        if arm == "exact" or boundary <= start or split >= len(self.layers):
            logits = m(ids_t).logits[0].float()
            return logits[boundary:] if tail_rows else logits[-1]
        hs = m(ids_t, output_hidden_states=True).hidden_states
        x_split = hs[split][0]
        pos = torch.arange(n)
        exact = sorted(set(exact_rows) | set(range(start, start)))
        rows = torch.tensor(sorted(set(exact) | set(range(boundary, n))), dtype=torch.long)
        filled = torch.tensor([j for j in range(start, boundary) if j not in set(exact)], dtype=torch.long)
        cached = torch.arange(0, start)
        x = x_split[rows].clone()
        for layer_id in range(split, len(self.layers)):
            j = layer_id - split
            layer = self.layers[layer_id]
            k_all = torch.zeros(n, self.n_kv, self.head_dim)
            v_all = torch.zeros(n, self.n_kv, self.head_dim)
            visible = torch.zeros(n, dtype=torch.bool)
            if cached.numel():
                _, kc, vc = self._qkv(layer_id, hs[layer_id][0][cached], pos[cached])
                k_all[cached], v_all[cached] = kc, vc
                visible[cached] = True
            if filled.numel() and arm != "nofill":
                x_hat = x_split[filled] if arm == "identity" else x_split[filled] @ maps[0][j].T + maps[1][j]
                _, kf, vf = self._qkv(layer_id, x_hat, pos[filled])
                if value_rescale:
                    c = min(value_rescale, n - boundary)
                    tail_in = x[len(rows) - (n - boundary) :][:c]
                    tail_split = x_split[boundary : boundary + c]
                    tail_hat = tail_split if arm == "identity" else tail_split @ maps[0][j].T + maps[1][j]
                    _, _, v_ex = self._qkv(layer_id, tail_in, pos[boundary : boundary + c])
                    _, _, v_pr = self._qkv(layer_id, tail_hat, pos[boundary : boundary + c])
                    scale = (v_ex.norm(dim=-1) / v_pr.norm(dim=-1)).mean(0)
                    vf = vf * scale[None, :, None]
                kind, _, layer_range = (splice or "").partition("@")
                first, _, last = layer_range.partition("-")
                in_range = not layer_range or int(first) <= layer_id <= int(last or first)
                if splice is not None and in_range:
                    _, ke, ve = self._qkv(layer_id, hs[layer_id][0][filled], pos[filled])
                    if kind in ("keys", "both"):
                        kf = ke
                    if kind in ("values", "both"):
                        vf = ve
                    if kind == "key_norm":
                        kf = kf * ke.norm(dim=-1, keepdim=True) / kf.norm(dim=-1, keepdim=True)
                k_all[filled], v_all[filled] = kf, vf
                visible[filled] = True
            q, k, v = self._qkv(layer_id, x, pos[rows])
            k_all[rows], v_all[rows] = k, v
            visible[rows] = True
            group = self.n_heads // self.n_kv
            kk = k_all.repeat_interleave(group, dim=1)
            vv = v_all.repeat_interleave(group, dim=1)
            scores = torch.einsum("qhd,khd->hqk", q, kk) * self.head_dim**-0.5
            mask = (pos[None, :] <= pos[rows][:, None]) & visible[None, :]
            scores = scores.masked_fill(~mask[None], float("-inf"))
            out = torch.einsum("hqk,khd->qhd", scores.softmax(-1), vv).reshape(len(rows), -1)
            x = x + layer.self_attn.o_proj(out)
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        if tail_rows:
            return m.lm_head(m.model.norm(x[len(rows) - (n - boundary) :])).float()
        return m.lm_head(m.model.norm(x[-1:]))[0].float()

    @torch.no_grad()
    def attention_received(self, ids: list[int], layers, q_rows: range) -> torch.Tensor:
        """Attention every row receives in the exact model from the queries at ``q_rows``, summed over
        heads, those queries and ``layers`` (lower layers, where every row is exact): ``[N]``."""
        hs = self.m(torch.tensor(ids)[None], output_hidden_states=True).hidden_states
        n = len(ids)
        pos = torch.arange(n)
        total = torch.zeros(n)
        rows = torch.tensor(list(q_rows))
        for layer_id in layers:
            q, _, _ = self._qkv(layer_id, hs[layer_id][0][rows], pos[rows])
            _, k, _ = self._qkv(layer_id, hs[layer_id][0], pos)
            k = k.repeat_interleave(self.n_heads // self.n_kv, dim=1)
            scores = torch.einsum("qhd,khd->hqk", q, k) * self.head_dim**-0.5
            scores = scores.masked_fill(~(pos[None, :] <= rows[:, None])[None], float("-inf"))
            total += scores.softmax(-1).sum(dim=(0, 1))
        return total

    @torch.no_grad()
    def probe_scores(self, ids: list[int], *, split: int, tail: int, rows: int, arm: str = "ridgefill", maps=None) -> torch.Tensor:
        """The probe: the last ``rows`` rows run the exact upper layers over the filled prefix (the rest of
        the tail not yet there); attention each prefix row receives, summed over heads, probe rows and
        upper layers: ``[N - tail]``."""
        hs = self.m(torch.tensor(ids)[None], output_hidden_states=True).hidden_states
        n = len(ids)
        boundary = n - tail
        x_split = hs[split][0]
        pos = torch.arange(n)
        probe = torch.arange(n - rows, n)
        prefix = torch.arange(boundary)
        x = x_split[probe].clone()
        total = torch.zeros(boundary)
        group = self.n_heads // self.n_kv
        for layer_id in range(split, len(self.layers)):
            j = layer_id - split
            layer = self.layers[layer_id]
            x_hat = x_split[prefix] if arm == "identity" else x_split[prefix] @ maps[0][j].T + maps[1][j]
            _, kf, vf = self._qkv(layer_id, x_hat, pos[prefix])
            q, k, v = self._qkv(layer_id, x, pos[probe])
            keys = torch.cat([kf, k]).repeat_interleave(group, dim=1)
            vals = torch.cat([vf, v]).repeat_interleave(group, dim=1)
            key_pos = torch.cat([pos[prefix], pos[probe]])
            scores = torch.einsum("qhd,khd->hqk", q, keys) * self.head_dim**-0.5
            scores = scores.masked_fill(~(key_pos[None, :] <= pos[probe][:, None])[None], float("-inf"))
            probs = scores.softmax(-1)
            total += probs[:, :, :boundary].sum(dim=(0, 1))
            out = torch.einsum("hqk,khd->qhd", probs, vals).reshape(len(probe), -1)
            x = x + layer.self_attn.o_proj(out)
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        return total
