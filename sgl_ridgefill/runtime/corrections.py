"""Corrections of the filled cache applied during the second sweep.

Value rescale: in each upper layer, the first ``c`` tail rows pass through the layer's V projection twice,
with their exact input and with the fill's prediction from their own split state; per KV head the mean
ratio ``‖v_exact‖ / ‖v_pred‖`` scales the filled values of that layer before any exact row reads them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from ..attention.staging import to_device
from ..kernels.rescale import value_scale_reference
from .kv import scale_values

if TYPE_CHECKING:
    from .fill import Fill
    from .passes import PassContext
    from .state import RequestState


def value_rescaler(
    ctx: PassContext, fill: Fill, st: RequestState, exact: torch.Tensor, x_rows: torch.Tensor, *, slots: torch.Tensor
) -> Callable[[int, torch.Tensor], None]:
    """The value rescale as an ``upper_pass`` callback (``fill``: the request's fill; not a kv+context one,
    whose tail features would need the prompt's context, which admission refuses).

    ``exact``: ``[e]`` exact prefix rows, host (the pass's first ``e`` rows, the tail follows);
    ``x_rows``: ``[e + T, d]`` the pass's split states; ``slots``: ``[N]`` pool indices of the request.
    """
    ad, plan = ctx.adapter, st.plan
    n_exact = int(exact.numel())
    c = min(plan.value_rescale, st.num_tokens - st.boundary)
    x_split_tail = x_rows[n_exact : n_exact + c]
    z_tail, _ = fill.features(x_split_tail)
    filled = torch.ones(st.boundary - st.start, dtype=torch.bool)
    filled[exact - st.start] = False
    filled_pos = torch.nonzero(filled).flatten() + st.start
    filled_slots = slots[to_device(slots.device, filled_pos)[0]]

    def before_layer(layer_id: int, x_in: torch.Tensor) -> None:
        if not filled_slots.numel() or ad.is_recurrent(layer_id):  # values live in attention layers only
            return
        v_exact = ad.value(layer_id, x_in[n_exact : n_exact + c])
        scale = value_scale_reference(v_exact, fill.value(layer_id, x_split_tail, z_tail))  # [kv_heads]
        attn = ad.attention(layer_id)
        scale_values(ctx.pool, attn, filled_slots, scale, physical=ctx.physical)

    return before_layer
