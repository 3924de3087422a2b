"""Every warm-up of ``runtime/warmup.py`` under ``TRITON_INTERPRET=1``: each launches the Triton kernels it is
there to compile, run by ``test_warmup.py`` in a subprocess (``tests/support/interpreter.py``).

On CUDA ``warm_up`` runs each entry once at startup; here each entry runs on CPU tensors through the
interpreter, with a stand-in runtime (the model's first weight, one attention layer, a KV pool of zeros,
float32 maps through RidgeFill's own map kernel) so the launches can be counted.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Callable

import torch

from sgl_ridgefill.runtime.warmup import WARMUPS
from tests.support.interpreter import main

HEADS, KV_HEADS, D, HIDDEN = 4, 2, 16, 32


def _runtime() -> tuple[SimpleNamespace, SimpleNamespace]:
    from sgl_ridgefill.kernels.map_apply import apply_map

    layer = SimpleNamespace(layer_id=1, tp_q_head_num=HEADS, tp_k_head_num=KV_HEADS, tp_v_head_num=KV_HEADS,
                            qk_head_dim=D, v_head_dim=D, scaling=D**-0.5, logit_cap=0.0, sliding_window_size=-1,
                            k_scale=None, v_scale=None)
    a, b = torch.eye(HIDDEN), torch.zeros(HIDDEN)
    maps = SimpleNamespace(splits=(1,), folder=SimpleNamespace(d_in=HIDDEN),
                           predict=lambda split, layer_id, x: apply_map(x, a, b, backend="triton"))
    adapter = SimpleNamespace(model=SimpleNamespace(embed_tokens=SimpleNamespace(weight=torch.zeros(4, HIDDEN))),
                              attention_layers=(0, 1), attention=lambda layer_id: layer)
    k = torch.zeros(8, KV_HEADS, D)
    pool = SimpleNamespace(get_key_buffer=lambda layer_id: k, get_value_buffer=lambda layer_id: k)
    return SimpleNamespace(adapter=adapter, maps=maps), SimpleNamespace(token_to_kv_pool=pool)


def _case(run: Callable) -> Callable[[], tuple[torch.Tensor, torch.Tensor]]:
    def case():
        rt, backend = _runtime()
        run(rt, backend)
        return torch.ones(1), torch.ones(1)

    return case


CASES = {w.name: _case(w.run) for w in WARMUPS}


def _kernels():
    from sglang.kernels.ops.attention import extend_attention

    from sgl_ridgefill.kernels import attention_stats_triton, map_apply_triton

    return (
        (extend_attention, ("_fwd_kernel",)),
        (attention_stats_triton, ("_lse_kernel", "_received_kernel")),
        (map_apply_triton, ("_map_kernel", "_map_int8_kernel")),
    )


def _measure(got: torch.Tensor, want: torch.Tensor) -> dict:
    return {}


if __name__ == "__main__":
    main(CASES, _kernels, _measure)
