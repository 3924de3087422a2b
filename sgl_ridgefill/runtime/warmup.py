"""Compile every Triton kernel variant RidgeFill can launch before the first request, and log each one's time.

Triton compiles a kernel the first time it runs with a new combination of dtypes, constant expressions and
integer specialisations (an integer argument that is 1, or a multiple of 16, gets a variant of its own).
Without a warm-up those compiles land inside the first RidgeFill request's time to first token. SGLang's own
server warm-up compiles its stock kernels (the runs of every backend); RidgeFill adds:

- ``groups``: SGLang's Triton extend kernel with a custom mask and its extend stage skipped, the path of
  scattered exact rows on every backend, at a full group, a row count that is not a multiple of 16, and three
  groups in one launch;
- ``attention statistics``: the two kernels of ``kernels/attention_stats_triton.py`` in float32 (the
  selection's inputs), at key counts that are and are not multiples of 16;
- ``maps``: each split's map kernel in the backend the startup measurement chose, at row counts that are and
  are not multiples of 16.

Each reads only the KV pool's padding slot 0 and writes only its own outputs. On a CPU nothing is compiled.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

logger = logging.getLogger("sgl_ridgefill")

# A full group (and a multiple of 16), a count that is neither, and three groups (launches with several).
ROW_COUNTS = (128, 17, 300)


@dataclass(frozen=True)
class Warmup:
    name: str
    run: Callable[[Any, Any], None]  # (runtime, attention backend)


def _upper_attention_layer(rt) -> int:
    ad = rt.adapter
    splits = rt.maps.splits if rt.maps is not None else (min(ad.attention_layers),)
    return next(l for l in ad.attention_layers if l >= min(splits))


def _groups(rt, backend) -> None:
    from ..attention.metadata import triton_group_args
    from ..attention.planner import plan_groups
    from ..attention.rowquery import run_groups
    from ..attention.steps import GROUP_SIZE

    layer = rt.adapter.attention(_upper_attention_layer(rt))
    pool = backend.token_to_kv_pool
    device, dtype = rt.adapter.model.embed_tokens.weight.device, rt.adapter.model.embed_tokens.weight.dtype
    for rows in ROW_COUNTS:
        positions = torch.arange(rows) * 2 + 1  # scattered rows, every slot the padding slot 0
        slots = torch.zeros(int(positions[-1]) + 1, dtype=torch.int32, device=device)
        args = triton_group_args(plan_groups(positions, group_size=GROUP_SIZE), slots)
        q = torch.zeros(rows, layer.tp_q_head_num * layer.qk_head_dim, dtype=dtype, device=device)
        k = torch.zeros(rows, layer.tp_k_head_num, layer.qk_head_dim, dtype=dtype, device=device)
        v = torch.zeros(rows, layer.tp_v_head_num, layer.v_head_dim, dtype=dtype, device=device)
        o = q.new_empty(rows, layer.tp_q_head_num * layer.v_head_dim)
        run_groups(pool, layer, q, k, v, o, args)


def _statistics(rt, backend) -> None:
    from ..kernels.attention_stats import attention_received  # the kernel the selection's "auto" picks on CUDA

    layer = rt.adapter.attention(_upper_attention_layer(rt))
    device = rt.adapter.model.embed_tokens.weight.device
    for n_q, n_k in ((16, 64), (17, 65)):  # row and key counts that are, and are not, multiples of 16
        q = torch.zeros(n_q, layer.tp_q_head_num, layer.qk_head_dim, device=device)
        k = torch.zeros(n_k, layer.tp_k_head_num, layer.qk_head_dim, device=device)
        attention_received(q, k, torch.arange(n_k - n_q, n_k, device=device), torch.arange(n_k, device=device),
                           layer.scaling, backend="triton")


def _maps(rt, backend) -> None:
    maps = rt.maps
    if maps is None:
        return
    device, dtype = rt.adapter.model.embed_tokens.weight.device, rt.adapter.model.embed_tokens.weight.dtype
    for split in maps.splits:
        for rows in ROW_COUNTS[:2]:
            maps.predict(split, split, torch.zeros(rows, maps.folder.d_in, dtype=dtype, device=device))


WARMUPS = (
    Warmup("groups (SGLang's Triton extend kernel, masked)", _groups),
    Warmup("attention statistics", _statistics),
    Warmup("maps", _maps),
)


def warm_up(rt, backend) -> list[tuple[str, float]]:
    """Run every :data:`WARMUPS` entry once on CUDA, logging its time; ``[(name, seconds)]`` (empty on a CPU)."""
    device = rt.adapter.model.embed_tokens.weight.device
    if device.type != "cuda":
        logger.info("RidgeFill warm-up: no Triton kernel to compile on %s", device.type)
        return []
    done = []
    for warmup in WARMUPS:
        t0 = time.perf_counter()
        with torch.no_grad():
            warmup.run(rt, backend)
        torch.cuda.synchronize(device)
        seconds = time.perf_counter() - t0
        logger.info("RidgeFill warm-up: %s compiled and ran in %.2f s", warmup.name, seconds)
        done.append((warmup.name, seconds))
    return done
