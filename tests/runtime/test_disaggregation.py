"""PD disaggregation without servers: the descriptor in the metadata slots, the held-back sends, the decode
worker's decision, the prefix the decode worker holds, and admission on a prefill worker."""

from __future__ import annotations

import types

import pytest
import torch

from sgl_ridgefill.config import ServerConfig
from sgl_ridgefill.runtime.admission import NOFILL_UNDER_PD, Admitter, ServerFacts
from sgl_ridgefill.runtime.disaggregation import (
    FIRST_SLOT, MAGIC, Descriptor, describe, holds_back, namespace_hash, note_decode_prefix, receive, write_descriptor,
)
from sgl_ridgefill.runtime.plan import RequestPlan
from sgl_ridgefill.runtime.selection import select_rows
from sgl_ridgefill.runtime.state import ATTR, RequestState


def _req(state=None, idx=3, **kw):
    req = types.SimpleNamespace(rid="r", metadata_buffer_index=idx, skip_radix_cache_insert=False, **kw)
    if state is not None:
        setattr(req, ATTR, state)
    return req


def _state(n=100, tail=20, **plan):
    st = RequestState(plan=RequestPlan(arm=plan.pop("arm", "ridgefill"), split=2, tail=tail, **plan))
    st.bind(list(range(n)), None)
    return st


def test_descriptor_round_trip_fits_the_spare_slots():
    d = Descriptor(arm="identity", filled=True, split=12, tail=1024, filled_rows=7000, exact_rows=12, cached_rows=64,
                   namespace_hash=namespace_hash("rf:abc"))
    values = d.encode()
    assert len(values) == 16 - FIRST_SLOT and values[0] == MAGIC
    assert all(-(2**31) <= v < 2**31 for v in values)
    assert Descriptor.decode(values) == d
    assert Descriptor.decode([0] * 9) is None  # a stock prefill worker writes nothing there
    assert not d.may_insert and Descriptor().may_insert


def test_describe_what_ran():
    assert describe(_req()) == Descriptor()  # not a RidgeFill request
    short = _state(n=10)  # prompt not longer than the tail: decided exact before anything was written
    assert describe(_req(short)).may_insert
    done = _state()
    done.start, done.prefill_done = 0, True
    done.stats.update(filled=70, exact=10)
    d = describe(_req(done))
    assert (d.arm, d.filled, d.filled_rows, d.exact_rows, d.split, d.tail) == ("ridgefill", True, 70, 10, 2, 20)
    assert d.namespace_hash == namespace_hash(done.plan.namespace)
    failed = _state()
    failed.start = 0
    failed.fail("boom", chunk_start=0)
    assert not describe(_req(failed)).may_insert  # whatever it wrote before failing may be filled
    all_exact = _state()
    all_exact.start, all_exact.prefill_done = 0, True
    all_exact.stats.update(filled=0, exact=80)
    assert describe(_req(all_exact)).may_insert


def test_intermediate_sends_wait_only_while_ridgefill_has_work():
    st = _state()
    assert holds_back(_req(st))
    st.prefill_done = True
    assert not holds_back(_req(st))
    assert not holds_back(_req(_state(n=10)))  # runs exactly: SGLang's sends as usual
    assert not holds_back(_req())


def test_descriptor_travels_from_prefill_to_decode():
    buffers = types.SimpleNamespace(cached_tokens=torch.zeros((8, 16), dtype=torch.int32))
    st = _state()
    st.start, st.prefill_done = 0, True
    st.stats.update(filled=70, exact=10)
    write_descriptor(buffers, _req(st, idx=3))
    assert buffers.cached_tokens[3, :FIRST_SLOT].tolist() == [0] * FIRST_SLOT  # SGLang's slots untouched
    decode_req = types.SimpleNamespace(req=_req(idx=3), metadata_buffer_index=3)
    desc = receive(types.SimpleNamespace(metadata_buffers=buffers), decode_req)
    assert desc.filled and decode_req.req.skip_radix_cache_insert is True
    # An exact request in the same slot afterwards overwrites the descriptor: the decode side may insert.
    write_descriptor(buffers, _req(None, idx=3))
    exact_req = types.SimpleNamespace(req=_req(idx=3), metadata_buffer_index=3)
    assert receive(types.SimpleNamespace(metadata_buffers=buffers), exact_req).may_insert
    assert exact_req.req.skip_radix_cache_insert is False
    # A stock prefill worker: no descriptor, nothing changes.
    stock = types.SimpleNamespace(req=_req(idx=5), metadata_buffer_index=5)
    assert receive(types.SimpleNamespace(metadata_buffers=buffers), stock) is None


def test_rows_the_decode_worker_holds_run_exact():
    st = _state(exact_every=None)
    note_decode_prefix(_req(st, disagg_decode_prefix_len=30))
    assert st.exact_context == 30
    st.start = 10  # the prefill worker's own radix hit
    rows = select_rows(st, {}, {})
    assert rows.tolist() == list(range(10, 30))
    st2 = _state(exact_every=7)
    st2.start = 0
    note_decode_prefix(_req(st2, disagg_decode_prefix_len=5))
    assert select_rows(st2, {}, {}).tolist() == [0, 1, 2, 3, 4, 6, 13, 20, 27, 34, 41, 48, 55, 62, 69, 76]


def test_prefill_worker_runs_nofill_exact_and_never_shares_filled_kv():
    config = ServerConfig(prefill_backend="ridgefill", maps="m", split=2, tail=20, cache_mode="namespace",
                          diagnostics=True)
    pd = Admitter(config, ServerFacts(num_layers=4, maps_splits=(2,), pd_prefill=True))
    mono = Admitter(config, ServerFacts(num_layers=4, maps_splits=(2,)))
    assert pd.admit({"ridgefill": {"arm": "nofill"}}).reason == NOFILL_UNDER_PD
    assert mono.admit({"ridgefill": {"arm": "nofill"}}).plan.arm == "nofill"
    assert pd.admit({"ridgefill": {}}).plan.cache_mode == "no_insert"
    assert mono.admit({"ridgefill": {}}).plan.cache_mode == "namespace"


@pytest.mark.parametrize("argv, flags, env", [
    (["--disaggregation-mode", "prefill"],
     {"--disaggregation-transfer-backend": "mooncake_tcp", "--disable-overlap-schedule": None},
     {"SGLANG_HOST_IP": "127.0.0.1", "MC_TCP_BIND_ADDRESS": "127.0.0.1"}),
    (["--disaggregation-mode=decode", "--host", "10.0.0.5"],
     {"--disaggregation-transfer-backend": "mooncake_tcp", "--disaggregation-decode-retraction-backup": "cpu_tensor"},
     {"SGLANG_HOST_IP": "10.0.0.5", "MC_TCP_BIND_ADDRESS": "10.0.0.5"}),
    (["--disaggregation-mode", "decode", "--host", "0.0.0.0", "--disaggregation-transfer-backend", "nixl"],
     {"--disaggregation-transfer-backend": "nixl"}, {}),
])
def test_launcher_pd_recipe(argv, flags, env, monkeypatch):
    from sgl_ridgefill.cpu.launch_server import command

    for key in ("SGLANG_HOST_IP", "MC_TCP_BIND_ADDRESS"):
        monkeypatch.delenv(key, raising=False)
    cmd, full_env = command(["--model-path", "m", *argv])
    for flag, value in flags.items():
        assert cmd.count(flag) == 1 or any(a.startswith(flag + "=") for a in cmd), flag
        if value is not None and flag in cmd:
            assert cmd[cmd.index(flag) + 1] == value
    for key, value in env.items():
        assert full_env[key] == value
    if not env:
        assert "SGLANG_HOST_IP" not in full_env
