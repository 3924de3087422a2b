"""Tensor parallelism helpers on a real two-process gloo group, and the distributed modes RidgeFill refuses.

The collectives run in two spawned processes (``torch.distributed`` on gloo over 127.0.0.1), with a
stand-in for SGLang's ``GroupCoordinator`` that has the three members RidgeFill uses.
"""

from __future__ import annotations

import os
import socket
import types

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from sgl_ridgefill.runtime.distributed import TensorParallel, refusal


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Group:
    """SGLang's ``GroupCoordinator`` as RidgeFill uses it: ``cpu_group``, ``ranks``, ``all_gather_object``."""

    def __init__(self, size: int):
        self.cpu_group = dist.group.WORLD
        self.ranks = list(range(size))
        self.world_size = size
        self.rank_in_group = dist.get_rank()

    def all_gather_object(self, obj):
        out = [None] * self.world_size
        dist.all_gather_object(out, obj, group=self.cpu_group)
        return out


def _worker(rank: int, size: int, port: int, queue) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=size)
    try:
        tp = TensorParallel(rank=rank, size=size, group=_Group(size))
        # Partial sums over each rank's heads add up to the whole.
        stats = [torch.arange(5, dtype=torch.float32) * (rank + 1), torch.full((3,), float(rank))]
        tp.sum_over_ranks(stats)
        # Every rank gets rank 0's rows; agreement is reported.
        same, agree_same = tp.agree_rows(torch.tensor([1, 4, 9]))
        mine, agree_mine = tp.agree_rows(torch.tensor([rank, 7]))
        # A fact that must hold on every rank: true on both, and true on one only.
        both, one = tp.all_ranks(True), tp.all_ranks(rank == 0)
        # Rank 0 decides; an error there is raised everywhere.
        verdict = tp.from_first(lambda: f"checked by rank {rank}")
        try:
            tp.from_first(lambda: (_ for _ in ()).throw(ValueError("maps do not match")))
            error = None
        except ValueError as e:
            error = str(e)
        queue.put((rank, [s.tolist() for s in stats], same.tolist(), agree_same, mine.tolist(), agree_mine, verdict, error,
                   both, one))
        dist.barrier()  # neither rank closes its connections while the other still reads from them
    finally:
        dist.destroy_process_group()
    # Leave without the interpreter's teardown: on a loaded machine a C++ thread of the spawned process was
    # once still joinable at exit ("terminate called without an active exception", SIGABRT) after every
    # result had been sent. The queue is flushed first, so what the test reads is complete.
    queue.close()
    queue.join_thread()
    os._exit(0)


def test_collectives_on_two_ranks():
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_worker, args=(r, 2, port, queue)) for r in range(2)]
    for p in procs:
        p.start()
    results = sorted(queue.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    for rank, stats, same, agree_same, mine, agree_mine, verdict, error, both, one in results:
        assert both is True and one is False
        assert stats == [[0.0, 3.0, 6.0, 9.0, 12.0], [1.0, 1.0, 1.0]]
        assert same == [1, 4, 9] and agree_same is True
        assert mine == [0, 7] and agree_mine is False  # rank 1 chose [1, 7]: it runs rank 0's rows
        assert verdict == "checked by rank 0"
        assert error == "maps do not match"


def test_no_group_on_one_device():
    assert TensorParallel.current() is None  # no SGLang group in this process


# ----------------------------------------------------------------------------- refused layouts
def _args(**kw):
    base = dict(pp_size=1, tp_size=1, dp_size=1, attn_dp_size=1, attn_cp_size=1, dcp_size=1,
                enable_dp_attention=False, enable_pd_role_switch=False, disaggregation_mode="null")
    return types.SimpleNamespace(**{**base, **kw})


@pytest.mark.parametrize("kw, words", [
    (dict(pp_size=2), "pipeline parallelism is not supported"),
    (dict(tp_size=2, attn_dp_size=2), "DP attention is not supported"),
    (dict(tp_size=2, dp_size=2, enable_dp_attention=True), "DP attention is not supported"),  # before resolution
    (dict(tp_size=2, attn_cp_size=2), "attention context parallelism is not supported"),
    (dict(dcp_size=2), "decode context parallelism is not supported"),
    (dict(dp_size=2), "data-parallel replicas"),
    (dict(enable_pd_role_switch=True), "PD role switching"),
])
def test_refused_layouts(kw, words):
    assert words in refusal(_args(**kw))


@pytest.mark.parametrize("kw", [dict(), dict(tp_size=2), dict(tp_size=8), dict(disaggregation_mode="prefill"),
                                dict(tp_size=2, disaggregation_mode="prefill")])
def test_served_layouts(kw):
    assert refusal(_args(**kw)) is None


def test_real_server_args_are_refused_at_startup():
    """SGLang's own ``ServerArgs`` for PP and DP attention: the runtime factory turns RidgeFill off with the
    reason (every request then runs exactly and says why); TP alone is served."""
    from sgl_ridgefill.cpu.environment import apply_cpu_environment

    apply_cpu_environment()
    server_args = pytest.importorskip("sglang.srt.server_args")
    from sgl_ridgefill.runtime.factory import unsupported_reason

    def reason(**kw):
        sa = server_args.ServerArgs(model_path="unused", device="cpu", **kw)
        return unsupported_reason(types.SimpleNamespace(server_args=sa))

    assert "pipeline parallelism is not supported" in reason(pp_size=2)
    assert "DP attention is not supported" in reason(tp_size=2, attn_dp_size=2)
    assert "DP attention is not supported" in reason(tp_size=2, dp_size=2, enable_dp_attention=True)
    assert reason(tp_size=2) is None
    assert reason(disaggregation_mode="prefill") is None
    # S3: SGLang's extra tokenizer workers never load plugins (no parameter check, no namespace reservation).
    assert "several tokenizer workers are not supported" in reason(tokenizer_worker_num=2)


def test_kv_maps_are_refused_under_tensor_parallelism():
    """kv maps hold every KV head's rows; a TP rank holds a shard of the heads: refused with a reason,
    residual-like maps served."""
    from types import SimpleNamespace

    from sgl_ridgefill.maps.kinds import MAP_KINDS
    from sgl_ridgefill.runtime.factory import maps_refusal

    tp = SimpleNamespace(size=2)
    assert "under tensor parallelism serve residual or normalised maps" in maps_refusal(MAP_KINDS["kv"], tp)
    assert maps_refusal(MAP_KINDS["kv+context"], tp) is not None
    assert maps_refusal(MAP_KINDS["residual"], tp) is None and maps_refusal(MAP_KINDS["normalised"], tp) is None
    assert maps_refusal(MAP_KINDS["kv"], None) is None


def test_kv_maps_are_refused_on_hybrids():
    """A hybrid's upper Gated DeltaNet layers need their input, which kv maps do not predict."""
    from sgl_ridgefill.maps.kinds import MAP_KINDS
    from sgl_ridgefill.runtime.factory import maps_refusal

    for name in ("kv", "kv+context"):
        assert "Gated DeltaNet" in maps_refusal(MAP_KINDS[name], None, hybrid=True)
    assert maps_refusal(MAP_KINDS["residual"], None, hybrid=True) is None
    assert maps_refusal(MAP_KINDS["normalised"], None, hybrid=True) is None


def test_hybrids_are_switched_off_under_tp_and_on_pd_prefill_workers():
    from sgl_ridgefill.runtime.factory import hybrid_refusal

    assert "tensor parallelism" in hybrid_refusal(True, tp=True, pd_prefill=False)
    assert "PD prefill worker" in hybrid_refusal(True, tp=False, pd_prefill=True)
    assert hybrid_refusal(True, tp=False, pd_prefill=False) is None
    assert hybrid_refusal(False, tp=True, pd_prefill=True) is None
