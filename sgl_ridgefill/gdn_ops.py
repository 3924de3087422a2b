"""Gated DeltaNet arithmetic in pure PyTorch, on any device: the ``sgl_kernel`` ops SGLang 0.5.23's hybrids call.

RidgeFill's runtime (the upper GDN layers' fill and second sweep, ``runtime/recurrent.py``) and calibration
(the terminal-state correction, ``calibration/terminal.py``) run these on whatever device holds the model.
On a CPU they also stand in for SGLang's own ops: SGLang's Qwen3.5 and Qwen3-Next model files and its GDN
attention backend call, on a CPU (``is_cpu()``), ops that only a source-built ``sgl-kernel`` provides (the
PyPI wheel has none, and SGLang has no PyTorch fallback), and the CPU shim (``cpu/shim/sgl_kernel``)
registers these functions under those names, so SGLang's own model classes run unchanged. Every op here is
checked against an independent PyTorch reference in ``tests/test_gdn_ops.py``.

Layouts are SGLang's: a recurrent state is stored ``[HV, V, K]`` (value rows, key columns) per pool slot;
a conv window is ``[conv_dim, width - 1]`` per slot; token tensors are flat over a batch's requests, which
``cu_seqlens`` / ``query_start_loc`` (``[B + 1]``) delimit. Arithmetic is float32 whatever the inputs.

The chunked gated delta rule is the WY form of the recurrence (chunks of :data:`CHUNK` rows, one triangular
solve per chunk): the same result as the per-token recurrence to rounding, at matmul speed, so 8K-token
prompts stay practical on a CPU. The per-token recurrence (:func:`recurrent_gated_delta_rule`) is the decode
step and the tests' reference.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.nn.functional as F

# Rows per chunk of the chunked delta rule. fla uses 64; on a CPU 32 measured faster (7,168 rows: 0.29 -> 0.20 s).
CHUNK = 32
L2NORM_EPS = 1e-6  # fla's l2norm: x / sqrt(sum(x^2) + eps)
# Subnormal floats are flushed to zero, as a GPU does: strongly decaying heads (g of -8 per row) otherwise
# fill the chunk's decay factors and the WY solve's products with subnormals, which x86 multiplies about 5x
# slower (measured: 620 ms vs 124 ms for 4,096 rows). A decay factor below e^-DECAY_FLOOR is taken as 0, and
# so is any entry of the solve's results below FLUSH_BELOW; both are far below the float32 resolution of the
# O(1) terms they are added to.
DECAY_FLOOR = 40.0
FLUSH_BELOW = 1e-30
CONV_BLOCK = 256  # rows of the causal conv computed at a time (a block of float32 rows stays in cache)


def _l2norm(x: torch.Tensor) -> torch.Tensor:
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + L2NORM_EPS)


def _decay(log_decay: torch.Tensor) -> torch.Tensor:
    """``exp(log_decay)`` (``log_decay <= 0``), 0 below ``e^-DECAY_FLOOR``: see :data:`DECAY_FLOOR`."""
    return log_decay.masked_fill(log_decay < -DECAY_FLOOR, float("-inf")).exp_()


def _flushed_(x: torch.Tensor, strong: bool) -> torch.Tensor:
    """``x`` with entries of magnitude below :data:`FLUSH_BELOW` set to 0, in place, where some decay factor
    was cut (``strong``); with milder decays the products stay normal and the passes are skipped."""
    return x.masked_fill_(x.abs() < FLUSH_BELOW, 0.0) if strong else x


def _silu_if(x: torch.Tensor, silu: bool) -> torch.Tensor:
    return F.silu(x) if silu else x


def _is_silu(activation) -> bool:
    if isinstance(activation, bool):
        return activation
    return activation in ("silu", "swish")


def gdn_gates(A_log: torch.Tensor, a: torch.Tensor, dt_bias: torch.Tensor, softplus_beta: float = 1.0,
              softplus_threshold: float = 20.0) -> torch.Tensor:
    """Log-space decay ``g = -exp(A_log) * softplus(a + dt_bias)``: ``[..., HV]`` float32 (``a``: ``[..., HV]``)."""
    x = a.float() + dt_bias.float()
    soft = F.softplus(x, beta=softplus_beta, threshold=softplus_threshold)
    return -torch.exp(A_log.float()) * soft


# --------------------------------------------------------------------------------------- conv
def _conv_rows(full: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, silu: bool,
               out: torch.Tensor) -> None:
    """Depthwise causal conv in row layout: ``full`` ``[width - 1 + rows, dim]`` float32 (the window, then the
    rows) into ``out`` ``[rows, dim]``, as ``width`` shifted multiply-adds over contiguous rows, in blocks of
    :data:`CONV_BLOCK` rows that stay in cache."""
    width = weight.shape[-1]
    rows = full.shape[0] - (width - 1)
    for lo in range(0, rows, CONV_BLOCK):
        hi = min(rows, lo + CONV_BLOCK)
        y = full[lo:hi] * weight[:, 0]
        for j in range(1, width):
            y.addcmul_(full[lo + j : hi + j], weight[:, j])
        if bias is not None:
            y += bias
        out[lo:hi] = F.silu(y, inplace=True) if silu else y


def causal_conv1d_fn(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, conv_states: torch.Tensor,
                     query_start_loc: torch.Tensor, cache_indices: torch.Tensor | None,
                     has_initial_state: torch.Tensor | None, activation=True) -> torch.Tensor:
    """Depthwise causal conv over a batch of sequences, continuing each from its slot's window.

    ``x``: ``[dim, tokens]`` (SGLang passes the transpose of its ``[tokens, dim]`` rows, which is the layout
    computed in); ``weight``: ``[dim, width]``; ``conv_states``: ``[slots, dim, width - 1]``, the last
    ``width - 1`` inputs of each slot, read when ``has_initial_state[b]`` (else zeros) and rewritten in place;
    ``query_start_loc``: ``[B + 1]``; ``cache_indices``: ``[B]`` slots (negative: padding, skipped).
    Returns ``[dim, tokens]`` in ``x``'s dtype (the transpose of a row-major ``[tokens, dim]``).
    """
    dim, tokens = x.shape
    width = weight.shape[-1]
    rows_in = x.transpose(0, 1)  # [tokens, dim]
    out = torch.zeros((tokens, dim), dtype=x.dtype, device=x.device)
    starts = query_start_loc.tolist()
    slots = cache_indices.tolist() if cache_indices is not None else list(range(len(starts) - 1))
    initial = has_initial_state.tolist() if has_initial_state is not None else [False] * len(slots)
    w = weight.float()
    b = None if bias is None else bias.float()
    silu = _is_silu(activation)
    for i, slot in enumerate(slots):
        lo, hi = starts[i], starts[i + 1]
        if hi <= lo or slot < 0:
            continue
        full = torch.empty((width - 1 + hi - lo, dim), dtype=torch.float32, device=x.device)
        if initial[i]:
            full[: width - 1] = conv_states[slot].transpose(0, 1)
        else:
            full[: width - 1] = 0
        full[width - 1 :] = rows_in[lo:hi]
        _conv_rows(full, w, b, silu, out[lo:hi])
        conv_states[slot] = full[-(width - 1) :].transpose(0, 1).to(conv_states.dtype)
    return out.transpose(0, 1)


def causal_conv1d_update(x: torch.Tensor, conv_states: torch.Tensor, weight: torch.Tensor,
                         bias: torch.Tensor | None, activation=True,
                         conv_state_indices: torch.Tensor | None = None) -> torch.Tensor:
    """One decode step (or a few) of the causal conv per request, updating each slot's window in place.

    ``x``: ``[B, dim]`` or ``[B, dim, steps]``; ``conv_states``: ``[slots, dim, width - 1]``;
    ``conv_state_indices``: ``[B]`` (negative: padding). Returns ``x``'s shape and dtype.
    """
    squeeze = x.dim() == 2
    xs = x.unsqueeze(-1) if squeeze else x
    bsz, dim, steps = xs.shape
    width = weight.shape[-1]
    out = torch.zeros_like(xs)
    slots = conv_state_indices.tolist() if conv_state_indices is not None else list(range(bsz))
    w = weight.float().reshape(dim, 1, width)
    b = None if bias is None else bias.float()
    for i, slot in enumerate(slots):
        if slot < 0:
            continue
        full = torch.cat([conv_states[slot].float(), xs[i].float()], dim=1)
        y = F.conv1d(full.unsqueeze(0), w, b, groups=dim)[0]
        out[i] = _silu_if(y, _is_silu(activation)).to(x.dtype)
        conv_states[slot] = full[:, -(width - 1):].to(conv_states.dtype)
    return out.squeeze(-1) if squeeze else out


# --------------------------------------------------------------------------------------- recurrence
def _expand_heads(t: torch.Tensor, hv: int) -> torch.Tensor:
    """``[T, H, D]`` -> ``[T, HV, D]``: value head ``j`` reads key head ``j // (HV // H)`` (fla's grouping)."""
    h = t.shape[1]
    return t if h == hv else t.repeat_interleave(hv // h, dim=1)


def _chunks(x: torch.Tensor, chunk: int) -> torch.Tensor:
    """``[T, HV, *]`` or ``[T, HV]`` (``T`` a multiple of ``chunk``) -> ``[HV, n, C, *]`` or ``[HV, n, C]``."""
    t, hv = x.shape[:2]
    out = x.reshape(t // chunk, chunk, hv, -1).permute(2, 0, 1, 3)
    return out if x.dim() == 3 else out.squeeze(-1)


def _wy(k, v, g, beta, chunk: int):
    """What does not depend on the state, for all chunks at once (``k``, ``v``: ``[HV, n, C, *]``; ``g``,
    ``beta``: ``[HV, n, C]``): ``(decay [HV,n,C,C], from_start [HV,n,C,1], u, w, k_to_end_t [HV,n,K,C],
    chunk_decay [HV,n,1,1], strong)``, where ``(I + A) [u | w] = beta [v | k e^gamma]`` is the chunk's WY
    system and ``strong`` says whether some decay factor fell below ``e^-DECAY_FLOOR`` (results get flushed)."""
    gamma = g.cumsum(-1)  # log decay from the chunk's start, inclusive
    strong = bool(gamma.min() < -DECAY_FLOOR) if gamma.numel() else False
    upper = torch.ones(chunk, chunk, dtype=torch.bool, device=k.device).triu(1)
    decay = _decay((gamma.unsqueeze(-1) - gamma.unsqueeze(-2)).masked_fill_(upper, float("-inf")))  # [HV,n,C,C]
    from_start = _decay(gamma).unsqueeze(-1)
    # Strictly lower part of (beta_i k_i . k_j) exp(gamma_i - gamma_j)
    system = (k @ k.transpose(-1, -2)).mul_(decay).mul_(beta.unsqueeze(-1)).tril_(-1)
    system.diagonal(dim1=-2, dim2=-1).fill_(1.0)
    rhs = torch.cat([v, k * from_start], dim=-1).mul_(beta.unsqueeze(-1))
    # (I + A)^-1 once (a C-column solve), then one batched matmul: faster than solving for all 2 x 128 columns
    eye = torch.eye(chunk, dtype=system.dtype, device=system.device).expand_as(system)
    inverse = _flushed_(torch.linalg.solve_triangular(system, eye, upper=False, unitriangular=True), strong)
    uw = _flushed_(inverse @ rhs, strong)
    vd = v.shape[-1]
    k_to_end_t = (k * _decay(gamma[..., -1:] - gamma).unsqueeze(-1)).transpose(-1, -2).contiguous()
    chunk_decay = _decay(gamma[..., -1])[..., None, None]
    return decay, from_start, uw[..., :vd], uw[..., vd:], k_to_end_t, chunk_decay, strong


def _padded(chunk: int, q, k, v, g, beta):
    """The rows padded to a multiple of ``chunk`` (``q`` may be None)."""
    pad = (-k.shape[0]) % chunk
    if pad:
        q, k, v = (None if x is None else F.pad(x, (0, 0, 0, 0, 0, pad)) for x in (q, k, v))
        g, beta = (F.pad(x, (0, 0, 0, pad)) for x in (g, beta))
    return q, k, v, g, beta


def _chunk_sequence(q, k, v, g, beta, state, chunk: int):
    """One sequence. ``q``, ``k``: ``[T, HV, K]`` (normalised, ``q`` scaled); ``v``: ``[T, HV, V]``;
    ``g``, ``beta``: ``[T, HV]``; ``state``: ``[HV, K, V]`` float32. Returns ``(o [T, HV, V], state)``.

    Everything that does not depend on the state is computed for all chunks at once; the loop over chunks
    carries the state with two batched matmuls per chunk: ``[w; q'] @ S`` and the rank-``C`` update.
    """
    t = q.shape[0]
    q, k, v, g, beta = (_chunks(x, chunk) for x in _padded(chunk, q, k, v, g, beta))
    decay, from_start, u, w, k_to_end_t, chunk_decay, strong = _wy(k, v, g, beta, chunk)
    attn = (q @ k.transpose(-1, -2)).mul_(decay)  # [HV, n, C, C], diagonal included
    # o_c = q'_c S + attn_c (u_c - w_c S) = attn_c u_c + (q'_c - attn_c w_c) S, with q' = q e^gamma
    out = attn @ u
    lhs = torch.cat([w, _flushed_(q * from_start - attn @ w, strong)], dim=-2)  # [HV, n, 2C, K]
    for c in range(out.shape[1]):
        ws = lhs[:, c] @ state  # [HV, 2C, V]
        out[:, c] += ws[:, chunk:]
        state = torch.baddbmm(state * chunk_decay[:, c], k_to_end_t[:, c], ws[:, :chunk].neg_().add_(u[:, c]))
    hv = out.shape[0]
    return out.permute(1, 2, 0, 3).reshape(-1, hv, out.shape[-1])[:t], state


def _chunk_states(k, v, g, beta, state, chunk: int) -> torch.Tensor:
    """:func:`_chunk_sequence`'s final state alone (no ``q``, no outputs): about a third less work, for rows
    whose outputs nobody reads (RidgeFill's filled rows in an upper GDN layer)."""
    _, k, v, g, beta = (None if x is None else _chunks(x, chunk) for x in _padded(chunk, None, k, v, g, beta))
    _, _, u, w, k_to_end_t, chunk_decay, _ = _wy(k, v, g, beta, chunk)
    for c in range(u.shape[1]):
        v_new = u[:, c] - w[:, c] @ state
        state = torch.baddbmm(state * chunk_decay[:, c], k_to_end_t[:, c], v_new)
    return state


_outputs_read = True  # False inside `outputs_unread()`


@contextlib.contextmanager
def outputs_unread() -> Iterator[None]:
    """Inside the block, :func:`chunk_gated_delta_rule` only advances the states and returns zeros: for a
    caller that keeps the states and drops the outputs (RidgeFill's sweep over filled rows). Only the CPU
    stand-in reads this; a GPU backend's kernels compute the outputs as usual."""
    global _outputs_read
    before, _outputs_read = _outputs_read, False
    try:
        yield
    finally:
        _outputs_read = before


def chunk_gated_delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                           initial_state: torch.Tensor, cu_seqlens: torch.Tensor, head_first: bool = False,
                           use_qk_l2norm_in_kernel: bool = True, initial_state_indices: torch.Tensor | None = None,
                           scale: float | None = None, chunk: int = CHUNK):
    """Prefill of the gated delta rule for a batch of sequences, each from its slot's state, in place.

    ``q``, ``k``: ``[1, T, H, K]``; ``v``: ``[1, T, HV, V]`` (``HV`` a multiple of ``H``); ``g`` (log decay),
    ``beta``: ``[1, T, HV]``; ``initial_state``: ``[slots, HV, V, K]``, read at ``initial_state_indices``
    (``[B]``, default ``0..B-1``) and overwritten with each sequence's final state; ``cu_seqlens``:
    ``[B + 1]``. Returns ``(o [1, T, HV, V] in q's dtype, None, None)`` like SGLang's CPU wrapper; inside
    :func:`outputs_unread`, ``o`` is zeros and only the states advance.
    """
    if head_first:
        raise NotImplementedError("head_first layouts are not used by SGLang's GDN backend")
    hv, kd = v.shape[2], k.shape[3]
    scale = kd**-0.5 if scale is None else scale
    read = _outputs_read

    def heads(x: torch.Tensor, factor: float = 1.0) -> torch.Tensor:
        x = _l2norm(x[0].float()) if use_qk_l2norm_in_kernel else x[0].float()
        return _expand_heads(x * factor if factor != 1.0 else x, hv)

    qf, kf = heads(q, scale) if read else None, heads(k)
    vf, gf, bf = v[0].float(), g[0].float(), beta[0].float()
    # Unread outputs stay zeros in q's dtype: no float32 buffer to fill and convert.
    out = torch.zeros(v.shape[1:], dtype=torch.float32 if read else q.dtype, device=v.device)
    starts = cu_seqlens.tolist()
    slots = initial_state_indices.tolist() if initial_state_indices is not None else list(range(len(starts) - 1))
    for i, slot in enumerate(slots):
        lo, hi = starts[i], starts[i + 1]
        if hi <= lo or slot < 0:
            continue
        state = initial_state[slot].float().transpose(-1, -2)  # [HV, K, V]
        if read:
            out[lo:hi], state = _chunk_sequence(qf[lo:hi], kf[lo:hi], vf[lo:hi], gf[lo:hi], bf[lo:hi], state, chunk)
        else:
            state = _chunk_states(kf[lo:hi], vf[lo:hi], gf[lo:hi], bf[lo:hi], state, chunk)
        initial_state[slot] = state.transpose(-1, -2).to(initial_state.dtype)
    return out.unsqueeze(0).to(q.dtype), None, None


def recurrent_gated_delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                               beta: torch.Tensor, state: torch.Tensor, *, scale: float | None = None,
                               l2norm: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """The gated delta rule token by token for one sequence (decode steps, and the reference).

    ``q``, ``k``: ``[T, H, K]``; ``v``: ``[T, HV, V]``; ``g``, ``beta``: ``[T, HV]``; ``state``: ``[HV, V, K]``.
    Per token: ``S <- e^g S; u = beta (v - S k); S <- S + u k^T; o = S q``. Returns ``(o [T, HV, V], state)``
    in float32.
    """
    hv, kd = v.shape[1], k.shape[2]
    scale = kd**-0.5 if scale is None else scale
    qf, kf = q.float(), k.float()
    if l2norm:
        qf, kf = _l2norm(qf), _l2norm(kf)
    qf, kf = _expand_heads(qf * scale, hv), _expand_heads(kf, hv)
    s = state.float().clone()
    out = torch.empty(v.shape, dtype=torch.float32, device=v.device)
    for t in range(v.shape[0]):
        s = s * g[t].float().exp()[:, None, None]
        u = beta[t].float()[:, None] * (v[t].float() - (s @ kf[t].unsqueeze(-1)).squeeze(-1))  # [HV, V]
        s = s + u.unsqueeze(-1) * kf[t].unsqueeze(-2)
        out[t] = (s @ qf[t].unsqueeze(-1)).squeeze(-1)
    return out, s


def fused_sigmoid_gating_delta_rule_update(A_log: torch.Tensor, dt_bias: torch.Tensor, q: torch.Tensor,
                                           k: torch.Tensor, v: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
                                           initial_state_source: torch.Tensor,
                                           initial_state_indices: torch.Tensor, cu_seqlens: torch.Tensor,
                                           use_qk_l2norm_in_kernel: bool = True, softplus_beta: float = 1.0,
                                           softplus_threshold: float = 20.0) -> torch.Tensor:
    """Decode: gates from ``a``, ``b`` and the recurrence over each request's new tokens, state in place.

    ``q``, ``k``: ``[1, T, H, K]``; ``v``: ``[1, T, HV, V]``; ``a``, ``b``: ``[T, HV]``;
    ``initial_state_source``: ``[slots, HV, V, K]``; ``initial_state_indices``: ``[B]`` (negative: padding);
    ``cu_seqlens``: ``[B + 1]``. Returns ``[1, T, HV, V]`` in ``q``'s dtype.
    """
    g = gdn_gates(A_log, a, dt_bias, softplus_beta, softplus_threshold)
    beta = torch.sigmoid(b.float())
    out = torch.zeros(v.shape[1:], dtype=torch.float32, device=v.device)
    starts = cu_seqlens.tolist()
    for i, slot in enumerate(initial_state_indices.tolist()):
        lo, hi = starts[i], starts[i + 1]
        if hi <= lo or slot < 0:
            continue
        o, state = recurrent_gated_delta_rule(q[0, lo:hi], k[0, lo:hi], v[0, lo:hi], g[lo:hi], beta[lo:hi],
                                              initial_state_source[slot], l2norm=use_qk_l2norm_in_kernel)
        out[lo:hi] = o
        initial_state_source[slot] = state.to(initial_state_source.dtype)
    return out.unsqueeze(0).to(q.dtype)


def fused_gdn_gating(A_log: torch.Tensor, a: torch.Tensor, b: torch.Tensor, dt_bias: torch.Tensor,
                     softplus_beta: float = 1.0, softplus_threshold: float = 20.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Prefill gates: ``g = -exp(A_log) softplus(a + dt_bias)`` and ``beta = sigmoid(b)``, each ``[1, T, HV]``
    float32 (``a``, ``b``: ``[T, HV]``)."""
    g = gdn_gates(A_log, a, dt_bias, softplus_beta, softplus_threshold)
    return g.unsqueeze(0), torch.sigmoid(b.float()).unsqueeze(0)


# --------------------------------------------------------------------------------------- model-side ops
def _gemma_rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """SGLang's ``GemmaRMSNorm`` (``x / rms(x) * (1 + w)`` in float32), over the last dimension."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (xf * (1.0 + weight.float())).to(x.dtype)


def fused_qk_gemma_rmsnorm(q: torch.Tensor, k: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor,
                           eps: float, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-head Gemma RMSNorm of Q and K: ``[rows * heads, head_dim]`` each (``q``: ``[rows, heads * head_dim]``)."""
    return (_gemma_rmsnorm(q.reshape(-1, head_dim), q_weight, eps),
            _gemma_rmsnorm(k.reshape(-1, head_dim), k_weight, eps))


def fused_qk_gemma_rmsnorm_with_gate(q_gate: torch.Tensor, k: torch.Tensor, q_weight: torch.Tensor,
                                     k_weight: torch.Tensor, eps: float, head_dim: int,
                                     num_heads: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Split Qwen3.5's per-head ``[q | gate]`` rows and normalise Q and K per head.

    ``q_gate``: ``[rows, num_heads * 2 * head_dim]`` (head ``h``: ``q`` then ``gate``, ``head_dim`` each);
    ``k``: ``[rows, kv_heads * head_dim]``. Returns ``q [rows, num_heads * head_dim]``, ``k`` (``k``'s
    shape) and ``gate [rows, num_heads * head_dim]``, all contiguous.
    """
    rows = q_gate.shape[0]
    per_head = q_gate.reshape(rows, num_heads, 2 * head_dim)
    q, gate = per_head[..., :head_dim], per_head[..., head_dim:]
    q = _gemma_rmsnorm(q, q_weight, eps).reshape(rows, -1)
    k = _gemma_rmsnorm(k.reshape(rows, -1, head_dim), k_weight, eps).reshape(rows, -1)
    return q.contiguous(), k.contiguous(), gate.reshape(rows, -1).contiguous()


def fused_sigmoid_mul_(x: torch.Tensor, gate: torch.Tensor) -> None:
    """``x *= sigmoid(gate)`` in place (the attention output gate); ``gate`` may be a strided view of
    ``x``'s shape or of ``[rows, heads, head_dim]``."""
    x.copy_((x.float() * torch.sigmoid(gate.reshape(x.shape).float())).to(x.dtype))


def fused_qkvzba_split_reshape_cat_contiguous(mixed_qkvz: torch.Tensor, mixed_ba: torch.Tensor, num_heads_qk: int,
                                              num_heads_v: int, head_qk: int, head_v: int):
    """Qwen3.5's contiguous projections ``[q | k | v | z]`` and ``[b | a]`` into ``mixed_qkv [rows, 2 Hk K +
    HV V]``, ``z [rows, HV, V]``, ``b``, ``a`` ``[rows, HV]`` (contiguous copies)."""
    rows = mixed_qkvz.shape[0]
    qkv_dim = 2 * num_heads_qk * head_qk + num_heads_v * head_v
    mixed_qkv = mixed_qkvz[:, :qkv_dim].contiguous()
    z = mixed_qkvz[:, qkv_dim : qkv_dim + num_heads_v * head_v].reshape(rows, num_heads_v, head_v).contiguous()
    b = mixed_ba[:, :num_heads_v].contiguous()
    a = mixed_ba[:, num_heads_v : 2 * num_heads_v].contiguous()
    return mixed_qkv, z, b, a


def rmsnorm_gated(x: torch.Tensor, weight: torch.Tensor, z: torch.Tensor | None, eps: float,
                  activation: str = "swish", norm_before_gate: bool = True, group_size: int | None = None
                  ) -> torch.Tensor:
    """The GDN output norm (fla's gated ``RMSNorm``): ``rmsnorm(x) * w * act(z)`` in float32.

    ``x``, ``z``: ``[rows, n]``; ``weight``: ``[n]``; ``act`` is SiLU (``swish``/``silu``) or ``sigmoid``;
    ``group_size`` normalises groups of that many columns separately. Returns ``x``'s dtype.
    """
    xf = x.float()
    act = torch.sigmoid if activation == "sigmoid" else F.silu
    if z is not None and not norm_before_gate:
        xf = xf * act(z.float())
    n = xf.shape[-1]
    grouped = xf.reshape(*xf.shape[:-1], n // (group_size or n), group_size or n)
    grouped = grouped * torch.rsqrt(grouped.pow(2).mean(-1, keepdim=True) + eps)
    out = grouped.reshape(xf.shape) * weight.float()
    if z is not None and norm_before_gate:
        out = out * act(z.float())
    return out.to(x.dtype)
