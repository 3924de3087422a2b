"""An independent RidgeFill oracle in plain PyTorch over a Hugging Face model (no SGLang involved).

It recomputes, for one prompt, what the SGLang runtime must produce: exact lower layers for every row;
for the upper layers, K/V of filled rows from the arm's prediction; exact rows and the tail run every layer
together, layer by layer, attending causally by position; optional value rescale. Rows below ``start``
stand for a radix-cache hit: exact in every layer. Maps of every kind (``sgl_ridgefill/maps/kinds.py``): the
``kv`` kinds' K goes through the layer's K norm and RoPE here, the others' prediction through the whole
layer's norm and projections; ``sink`` rows (the maps folder's rule over the new prefix rows) run exactly.
"""

from __future__ import annotations

import torch

from sgl_ridgefill.maps.kinds import features, map_kind, sink_rows


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

    def _rope_key(self, layer_id, k_pre, pos):
        """K of a ``kv`` map's prediction (``[rows, kv_dim]``, before the K norm): K norm, then RoPE."""
        attn = self.layers[layer_id].self_attn
        k = k_pre.view(-1, self.n_kv, self.head_dim)
        if hasattr(attn, "k_norm"):
            k = attn.k_norm(k)
        cos, sin = self.m.model.rotary_emb(k_pre[None], pos[None])
        return _rope(k, cos[0], sin[0])

    def _filled_kv(self, layer_id, j, rows, x_split, z, pos, arm, maps, kind):
        """K and V of ``rows`` (filled) at ``layer_id`` from the arm's prediction: ``[rows, kv, hd]`` each."""
        if arm == "identity":
            return self._qkv(layer_id, x_split[rows], pos[rows])[1:]
        y = z[rows] @ maps[0][j].T + maps[1][j]
        if not kind.predicts_kv:
            return self._qkv(layer_id, y, pos[rows])[1:]
        k, v = y.split(y.shape[1] // 2, dim=1)
        return self._rope_key(layer_id, k, pos[rows]), v.view(-1, self.n_kv, self.head_dim)

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
        map_kind_name: str | None = None,
        sink: dict | None = None,
    ) -> torch.Tensor:
        """Logits of the next token after ``ids`` ([vocab] float32); with ``tail_rows``, the logits of every
        tail row ([tail, vocab]). ``splice``: exact keys/values/both/key magnitude on the filled rows, in every
        upper layer or, as ``kind@first-last``, in those layers only. ``map_kind_name``: what ``maps`` predict
        (default residual); ``sink``: the folder's sink rule (``{first_rows, norm_ratio}``), whose rows among
        the new prefix rows (one block) run exactly."""
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
        kind = map_kind(map_kind_name)
        z = features(kind, x_split)[0].to(x_split.dtype) if arm == "ridgefill" else x_split
        exact = set(exact_rows)
        if sink and arm == "ridgefill" and boundary > start:
            new = pos[start:boundary]
            exact |= set(new[sink_rows(new, x_split[start:boundary], **sink)].tolist())
        exact = sorted(exact)
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
                kf, vf = self._filled_kv(layer_id, j, filled, x_split, z, pos, arm, maps, kind)
                if value_rescale:
                    c = min(value_rescale, n - boundary)
                    tail_in = x[len(rows) - (n - boundary) :][:c]
                    _, _, v_ex = self._qkv(layer_id, tail_in, pos[boundary : boundary + c])
                    _, v_pr = self._filled_kv(layer_id, j, torch.arange(boundary, boundary + c), x_split, z, pos, arm,
                                              maps, kind)
                    scale = (v_ex.norm(dim=-1) / v_pr.norm(dim=-1)).mean(0)
                    vf = vf * scale[None, :, None]
                spliced, _, layer_range = (splice or "").partition("@")
                first, _, last = layer_range.partition("-")
                in_range = not layer_range or int(first) <= layer_id <= int(last or first)
                if splice is not None and in_range:
                    _, ke, ve = self._qkv(layer_id, hs[layer_id][0][filled], pos[filled])
                    if spliced in ("keys", "both"):
                        kf = ke
                    if spliced in ("values", "both"):
                        vf = ve
                    if spliced == "key_norm":
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
    def _fill_stage(self, ids, *, split, tail, maps, run_rows, start, cached_kv):
        """One request's prefill over a cache: the upper-layer K/V of rows ``[0, start)`` is ``cached_kv``
        (per upper layer ``(k, v)``, ``[>= start, kv, hd]``) except for the cached rows in ``run_rows``, which
        run again; rows ``[start, B)`` not in ``run_rows`` are filled (residual maps); ``run_rows`` and the
        tail rows from ``start`` run every upper layer together, causally by position. Returns the next
        token's logits and every upper layer's K/V of all ``len(ids)`` rows after the prefill."""
        m, n = self.m, len(ids)
        boundary = max(n - tail, 0)
        hs = m(torch.tensor(ids)[None], output_hidden_states=True).hidden_states
        x_split, pos, kind = hs[split][0], torch.arange(n), map_kind(None)
        z = features(kind, x_split)[0].to(x_split.dtype)
        rows = torch.tensor(sorted(set(run_rows) | set(range(max(boundary, start), n))), dtype=torch.long)
        filled = torch.tensor([j for j in range(start, boundary) if j not in set(run_rows)], dtype=torch.long)
        x, out_kv, group = x_split[rows].clone(), [], self.n_heads // self.n_kv
        for layer_id in range(split, len(self.layers)):
            k_all, v_all = torch.zeros(n, self.n_kv, self.head_dim), torch.zeros(n, self.n_kv, self.head_dim)
            if start:
                k_all[:start], v_all[:start] = (t[:start] for t in cached_kv[layer_id - split])
            if filled.numel():
                k_all[filled], v_all[filled] = self._filled_kv(layer_id, layer_id - split, filled, x_split, z, pos,
                                                               "ridgefill", maps, kind)
            q, k, v = self._qkv(layer_id, x, pos[rows])
            k_all[rows], v_all[rows] = k, v
            scores = torch.einsum("qhd,khd->hqk", q, k_all.repeat_interleave(group, dim=1)) * self.head_dim**-0.5
            scores = scores.masked_fill(~(pos[None, :] <= pos[rows][:, None])[None], float("-inf"))
            attn = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v_all.repeat_interleave(group, dim=1))
            layer = self.layers[layer_id]
            x = x + layer.self_attn.o_proj(attn.reshape(len(rows), -1))
            x = x + layer.mlp(layer.post_attention_layernorm(x))
            out_kv.append((k_all, v_all))
        return m.lm_head(m.model.norm(x[-1:]))[0].float(), out_kv

    @torch.no_grad()
    def reused_logits(self, first_ids, first_rows, ids, rows, *, split, tail, maps) -> torch.Tensor:
        """The next token's logits of ``ids`` after ``first_ids`` filled the cache with its exact rows
        ``first_rows`` and ``ids`` reused the shared prefix: of its own exact ``rows``, those among the shared
        rows the first left filled run again over the cache (an upgrade in place), the rest of its prefix is
        filled, its tail runs exactly, and the first's rows (its exact rows and its tail) stay as it wrote
        them."""
        shared = next((i for i, (a, b) in enumerate(zip(first_ids, ids)) if a != b), min(len(first_ids), len(ids)))
        _, cached = self._fill_stage(first_ids, split=split, tail=tail, maps=maps, run_rows=first_rows, start=0,
                                     cached_kv=None)
        first_exact = set(first_rows) | set(range(max(len(first_ids) - tail, 0), len(first_ids)))
        upgrade = [r for r in rows if r < shared and r not in first_exact]
        new = [r for r in rows if r >= shared]
        logits, _ = self._fill_stage(ids, split=split, tail=tail, maps=maps, run_rows=upgrade + new, start=shared,
                                     cached_kv=cached)
        return logits

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


def _mlp(layer, x):
    """A decoder layer's MLP on rows ``x`` ``[rows, d]`` (Qwen3-Next's sparse MoE block takes ``[batch, seq, d]``)."""
    out = layer.mlp(x[None])
    return (out[0] if isinstance(out, tuple) else out)[0]


class HybridReference:
    """The same oracle for a Gated DeltaNet hybrid (Hugging Face ``Qwen3_5ForCausalLM`` or
    ``Qwen3NextForCausalLM``), written from the
    method, not from the runtime: attention layers as in :class:`Reference`; each upper GDN layer runs its
    own short conv and gated delta rule over one sequence in position order from the exact state at
    ``start``: the rows ``[start, N)`` with ``x̂_l`` for filled rows and exact inputs for exact rows and the
    tail (arms ``ridgefill`` and ``identity``), or only the exact rows and the tail (``nofill``). The
    terminal-state correction adds ``ρ_l ΔM_l`` between rows ``B - 1`` and ``B``, ``ρ`` from the products of
    gates (no log-sum-exp). Outputs are read at exact rows and the tail only. States are ``[HV, V, K]``.
    """

    def __init__(self, hf_model):
        self.m = hf_model.eval()
        cfg = hf_model.config
        self.cfg = cfg
        self.layers = hf_model.model.layers
        self.kinds = list(cfg.layer_types)
        self.n_heads = cfg.num_attention_heads
        self.n_kv = cfg.num_key_value_heads
        self.head_dim = cfg.head_dim

    # ------------------------------------------------------------------ attention layers
    def _attention_qkv(self, layer_id, x_in, pos):
        from transformers.models.qwen3_5.modeling_qwen3_5 import apply_rotary_pos_emb

        layer = self.layers[layer_id]
        attn = layer.self_attn
        h = layer.input_layernorm(x_in)
        rows = h.shape[0]
        q, gate = torch.chunk(attn.q_proj(h).view(rows, self.n_heads, 2 * self.head_dim), 2, dim=-1)
        q = attn.q_norm(q)
        k = attn.k_norm(attn.k_proj(h).view(rows, self.n_kv, self.head_dim))
        v = attn.v_proj(h).view(rows, self.n_kv, self.head_dim)
        cos, sin = self.m.model.rotary_emb(h[None], pos[None])
        q, k = apply_rotary_pos_emb(q.transpose(0, 1)[None], k.transpose(0, 1)[None], cos, sin)
        return q[0].transpose(0, 1), k[0].transpose(0, 1), v, gate.reshape(rows, -1)

    def _attention_layer(self, layer_id, x, rows, k_all, v_all, visible, pos):
        layer = self.layers[layer_id]
        q, k, v, gate = self._attention_qkv(layer_id, x, pos[rows])
        k_all[rows], v_all[rows] = k, v
        visible[rows] = True
        group = self.n_heads // self.n_kv
        kk, vv = k_all.repeat_interleave(group, dim=1), v_all.repeat_interleave(group, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q, kk) * self.head_dim**-0.5
        mask = (pos[None, :] <= pos[rows][:, None]) & visible[None, :]
        scores = scores.masked_fill(~mask[None], float("-inf"))
        out = torch.einsum("hqk,khd->qhd", scores.softmax(-1), vv).reshape(len(rows), -1)
        x = x + layer.self_attn.o_proj(out * torch.sigmoid(gate))
        return x + _mlp(layer, layer.post_attention_layernorm(x))

    # ------------------------------------------------------------------ GDN layers
    def _gdn_parts(self, layer_id, x_in):
        """``mixed_qkv`` (before the conv), ``z``, ``g`` (log decay), ``beta`` for rows with inputs ``x_in``."""
        mix = self.layers[layer_id].linear_attn
        h = self.layers[layer_id].input_layernorm(x_in)
        if hasattr(mix, "in_proj_qkv"):  # Qwen3.5: contiguous projections
            mixed, z, b, a = mix.in_proj_qkv(h), mix.in_proj_z(h), mix.in_proj_b(h), mix.in_proj_a(h)
        else:  # Qwen3-Next: interleaved per key head; transformers' own reordering
            q, k, v, z, b, a = mix.fix_query_key_value_ordering(mix.in_proj_qkvz(h)[None], mix.in_proj_ba(h)[None])
            mixed = torch.cat([q[0].reshape(len(h), -1), k[0].reshape(len(h), -1), v[0].reshape(len(h), -1)], dim=-1)
            z, b, a = z[0].reshape(len(h), -1), b[0], a[0]
        g = -mix.A_log.float().exp() * torch.nn.functional.softplus(a.float() + mix.dt_bias)
        return mixed, z, g, b.sigmoid()

    def _gdn_run(self, layer_id, mixed, g, beta, window, state):
        """Conv over ``[window | mixed]`` then the recurrence from ``state``; returns (o [rows, HV, V], new
        window, new state)."""
        from transformers.models.qwen3_5.modeling_qwen3_5 import torch_recurrent_gated_delta_rule

        mix = self.layers[layer_id].linear_attn
        width = mix.conv_kernel_size
        if not mixed.shape[0]:
            return torch.zeros(0, mix.num_v_heads, mix.head_v_dim), window, state
        full = torch.cat([window, mixed.T], dim=1)  # [conv_dim, W-1+rows]
        conv = torch.nn.functional.conv1d(full[None], mix.conv1d.weight, None, groups=mix.conv_dim)[0]
        conv = torch.nn.functional.silu(conv).T  # [rows, conv_dim]
        q, k, v = conv.split([mix.key_dim, mix.key_dim, mix.value_dim], dim=-1)
        rows = conv.shape[0]
        rep = mix.num_v_heads // mix.num_k_heads
        q = q.reshape(1, rows, -1, mix.head_k_dim).repeat_interleave(rep, dim=2)
        k = k.reshape(1, rows, -1, mix.head_k_dim).repeat_interleave(rep, dim=2)
        v = v.reshape(1, rows, -1, mix.head_v_dim)
        o, last = torch_recurrent_gated_delta_rule(q, k, v, g=g[None], beta=beta[None],
                                                   initial_state=state.transpose(-1, -2)[None],
                                                   output_final_state=True, use_qk_l2norm_in_kernel=True)
        return o[0], full[:, -(width - 1):], last[0].transpose(-1, -2)

    def _gdn_output(self, layer_id, o, z, x):
        layer = self.layers[layer_id]
        mix = layer.linear_attn
        out = mix.norm(o.reshape(-1, mix.head_v_dim), z.reshape(-1, mix.head_v_dim)).reshape(x.shape[0], -1)
        x = x + mix.out_proj(out)
        return x + _mlp(layer, layer.post_attention_layernorm(x))

    def _empty(self, layer_id):
        mix = self.layers[layer_id].linear_attn
        return (torch.zeros(mix.conv_dim, mix.conv_kernel_size - 1),
                torch.zeros(mix.num_v_heads, mix.head_v_dim, mix.head_k_dim))

    @staticmethod
    def rho(g, filled, cached: bool):
        """ρ per head from gates ``g`` ``[B - start, HV]`` of rows ``[start, B)`` and their ``filled`` mask: a row's
        weight is the product of the gates after it (plain products, float64)."""
        alpha = g.double().exp()
        n = alpha.shape[0]
        weights = torch.stack([alpha[t + 1 :].prod(0) for t in range(n)])  # [rows, HV]
        share = weights[filled].sum(0) / weights.sum(0)
        if cached:
            share = share * (1 - alpha.prod(0))
        return share.float()

    @torch.no_grad()
    def last_logits(self, ids, *, split, tail, arm="ridgefill", maps=None, exact_rows=(), start=0, terminal=None,
                    tail_rows=False, return_rho=False):
        """Logits after ``ids`` (or of every tail row with ``tail_rows``). ``maps``: ``(A [L-S, d, d], b [L-S, d])``
        for every upper layer; ``terminal``: ``{layer: ΔM [HV, V, K]}`` turns the correction on."""
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
        exact = sorted(set(exact_rows))
        rows = torch.tensor(sorted(set(exact) | set(range(boundary, n))), dtype=torch.long)
        filled = torch.tensor([j for j in range(start, boundary) if j not in set(exact)], dtype=torch.long)
        cached = torch.arange(0, start)
        rhos = {}
        x = x_split[rows].clone()
        for layer_id in range(split, len(self.layers)):
            j = layer_id - split

            def predict(xs):
                return xs if arm == "identity" else xs @ maps[0][j].T + maps[1][j]

            if self.kinds[layer_id] == "full_attention":
                k_all = torch.zeros(n, self.n_kv, self.head_dim)
                v_all = torch.zeros(n, self.n_kv, self.head_dim)
                visible = torch.zeros(n, dtype=torch.bool)
                if cached.numel():
                    _, kc, vc, _ = self._attention_qkv(layer_id, hs[layer_id][0][cached], pos[cached])
                    k_all[cached], v_all[cached], visible[cached] = kc, vc, True
                if filled.numel() and arm != "nofill":
                    _, kf, vf, _ = self._attention_qkv(layer_id, predict(x_split[filled]), pos[filled])
                    k_all[filled], v_all[filled], visible[filled] = kf, vf, True
                x = self._attention_layer(layer_id, x, rows, k_all, v_all, visible, pos)
                continue
            window, state = self._empty(layer_id)
            if start:  # the exact state at start (a radix-cache hit)
                mixed, _, g, beta = self._gdn_parts(layer_id, hs[layer_id][0][:start])
                _, window, state = self._gdn_run(layer_id, mixed, g, beta, window, state)
            if arm == "nofill":
                seq = rows
                x_seq = x
            else:
                seq = torch.arange(start, n)
                x_seq = torch.empty(n - start, x.shape[1])
                x_seq[rows - start] = x
                if filled.numel():
                    x_seq[filled - start] = predict(x_split[filled])
            mixed, z, g, beta = self._gdn_parts(layer_id, x_seq)
            before = int((seq < boundary).sum())
            o_parts = []
            o, window, state = self._gdn_run(layer_id, mixed[:before], g[:before], beta[:before], window, state)
            o_parts.append(o)
            if terminal is not None and arm != "nofill":
                is_filled = torch.zeros(before, dtype=torch.bool)
                if filled.numel():
                    is_filled[filled - start] = True
                rho = self.rho(g[:before], is_filled, cached=start > 0)
                rhos[layer_id] = rho
                state = state + rho[:, None, None] * terminal[layer_id]
            o, window, state = self._gdn_run(layer_id, mixed[before:], g[before:], beta[before:], window, state)
            o_parts.append(o)
            o = torch.cat(o_parts)
            keep = torch.isin(seq, rows)
            x = self._gdn_output(layer_id, o[keep], z[keep], x)
        if tail_rows:
            out = m.lm_head(m.model.norm(x[len(rows) - (n - boundary) :])).float()
        else:
            out = m.lm_head(m.model.norm(x[-1:]))[0].float()
        return (out, rhos) if return_rho else out
