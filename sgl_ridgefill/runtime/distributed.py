"""RidgeFill under SGLang's tensor parallelism: one plan on every rank, and the distributed modes it refuses.

Every tensor-parallel rank runs its own scheduler and its own copy of RidgeFill's forward. Rank 0
broadcasts each request to the others, so admission and the plan (pure functions of the request, the
server's settings and the maps) agree by construction. What does not agree by construction:

- **Attention statistics.** Each rank captures its own query heads and reads its own KV heads, so the
  attention a prefix row receives is, per rank, a partial sum over that rank's heads. The ranks add them
  up (``sum_over_ranks``) before any selector reads them: the same quantity a single device computes, up
  to the order of summation. The probe's statistics likewise.
- **The exact rows.** Selected on every rank from the summed statistics, then exchanged: every rank takes
  rank 0's rows, and reports whether all ranks had chosen the same (``agree_rows``). The sub-passes that
  follow call the model's layers, whose row-parallel projections are collectives; ranks running different
  rows would deadlock, so the exchange is what guarantees they never do.
- **Startup checks that read rank-local weights.** The maps fingerprint reads the first embedding rows
  and KV head 0, which rank 0 holds; rank 0 checks and every rank adopts its verdict (``from_first``).
- **A failure on one rank.** On one device a request whose RidgeFill raises runs its chunk exactly and the
  server goes on. A rank of a tensor-parallel group cannot do that alone: the exact layers it would run are
  collectives the other ranks are not in (they are inside RidgeFill's own, or past it), so every rank would
  wait for the others until the collectives' timeout, the server answering nothing meanwhile. Nothing can
  tell the other ranks in time either: any message would be one more collective they are not in. So the
  failing rank raises :class:`RankFailure` out of the forward; SGLang's scheduler logs it and shuts the
  server down (as for any scheduler exception), and every request in flight ends with an error within
  seconds instead of a hang.

Maps are replicated: every rank holds all of ``A_l`` (memory per rank), computes the same ``x̂_l`` and
writes its own KV heads with its own K/V projection rows (``adapter.py`` reads tensor-parallel-local
sizes). Every exchange uses the group's gloo ``cpu_group``: the statistics and rows live on the host.

Distributed modes that change who holds which rows or layers (pipeline, attention data and context
parallelism) are refused (:func:`refusal`); RidgeFill then stays off and every request runs exactly.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

logger = logging.getLogger("sgl_ridgefill")
T = TypeVar("T")


@dataclass(frozen=True)
class TensorParallel:
    """This process's place in SGLang's tensor-parallel group (only built when the group has 2+ ranks).

    ``group``: SGLang's ``GroupCoordinator`` (``get_tp_group()``); its ``cpu_group`` is a gloo group on
    every platform and ``ranks[0]`` the global rank of the group's first member."""

    rank: int
    size: int
    group: Any

    @classmethod
    def current(cls) -> TensorParallel | None:
        """The tensor-parallel group of this scheduler process, or ``None`` without one (TP size 1)."""
        try:
            from sglang.srt.distributed.parallel_state import get_tp_group

            group = get_tp_group()
        except (ImportError, AssertionError, AttributeError, RuntimeError, ValueError):  # no group here
            return None
        if group is None or group.world_size <= 1:
            return None
        return cls(rank=group.rank_in_group, size=group.world_size, group=group)

    @property
    def first(self) -> bool:
        return self.rank == 0

    def sum_over_ranks(self, tensors: Sequence[torch.Tensor]) -> None:
        """Add every rank's ``tensors`` (host float32, same shapes on every rank) in place, in one
        all-reduce."""
        if not tensors:
            return
        flat = torch.cat([t.reshape(-1).float() for t in tensors])
        torch.distributed.all_reduce(flat, group=self.group.cpu_group)
        offset = 0
        for t in tensors:
            n = t.numel()
            t.copy_(flat[offset : offset + n].view_as(t))
            offset += n

    def all_ranks(self, flag: bool) -> bool:
        """Whether ``flag`` holds on every rank (one all-reduce). Collective: every rank must call it."""
        count = torch.tensor([float(flag)])
        self.sum_over_ranks([count])
        return int(count.item()) == self.size

    def agree_rows(self, rows: torch.Tensor) -> tuple[torch.Tensor, bool]:
        """Rank 0's ``rows`` (``[e]`` int64, host) on every rank, and whether every rank had chosen them."""
        chosen = self.group.all_gather_object(rows.tolist())
        agree = all(c == chosen[0] for c in chosen)
        if not agree:
            logger.warning("tensor-parallel ranks chose different exact rows (%s); every rank runs rank 0's",
                           [len(c) for c in chosen])
        return torch.tensor(chosen[0], dtype=torch.long), agree

    def from_first(self, compute: Callable[[], T]) -> T:
        """``compute()`` on rank 0, its result on every rank (an exception raised there is raised on every
        rank). Collective: every rank must call it."""
        box: list[Any] = [None]
        if self.first:
            try:
                box[0] = ("ok", compute())
            except Exception as e:  # noqa: BLE001 - re-raised on every rank below
                box[0] = ("error", e)
        torch.distributed.broadcast_object_list(box, src=self.group.ranks[0], group=self.group.cpu_group)
        kind, value = box[0]
        if kind == "error":
            raise value
        return value


class RankFailure(RuntimeError):
    """RidgeFill raised on one tensor-parallel rank: the server stops (see the module's docstring)."""

    def __init__(self, tp: TensorParallel, rid: str, error: BaseException):
        super().__init__(
            f"RidgeFill failed on tensor-parallel rank {tp.rank} of {tp.size} for request {rid} "
            f"({type(error).__name__}: {error}); one rank cannot fall back to exact prefill alone (the other "
            "ranks would wait for it in the model's collectives), so this scheduler stops and the server shuts down"
        )


def _int(sa: Any, name: str, default: int = 1) -> int:
    value = getattr(sa, name, default)
    return default if value is None else int(value)


def refusal(sa: Any) -> str | None:
    """Why RidgeFill cannot serve SGLang's distributed layout ``sa`` (its ``ServerArgs``), or ``None``.

    Tensor parallelism (any size, any number of nodes) and the prefill role of PD disaggregation are served;
    the decode role is handled where the runtime is built (it runs no prefill)."""
    checks = (
        (_int(sa, "pp_size") > 1, "pipeline parallelism is not supported (each stage holds some of the layers; "
                                  "the fill writes every upper layer from the split state)"),
        (_int(sa, "attn_dp_size") > 1 or bool(getattr(sa, "enable_dp_attention", False)),
         "DP attention is not supported (its attention groups run different requests inside one TP group)"),
        (_int(sa, "attn_cp_size") > 1, "attention context parallelism is not supported (each rank holds part "
                                       "of a prompt's rows)"),
        (_int(sa, "dcp_size") > 1, "decode context parallelism is not supported (the KV cache is split by "
                                   "token across ranks)"),
        (_int(sa, "dp_size") > 1, "data-parallel replicas (--dp-size) are not supported yet (untested; run one "
                                  "server per replica)"),
        (bool(getattr(sa, "enable_pd_role_switch", False)),
         "PD role switching is not supported (a decode worker never runs RidgeFill)"),
    )
    for failed, reason in checks:
        if failed:
            return reason
    return None
