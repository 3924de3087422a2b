"""The census counts what would wait for a GPU: device reads on the host, data-dependent ops, blocking copies,
and only those; host tensors read on the host and the staging's copies are free."""

from __future__ import annotations

import torch

from sgl_ridgefill.attention.staging import to_device
from sgl_ridgefill.gpu_check.census import Census, on_device


def _kinds(census: Census) -> list[str]:
    return [s.kind for s in census.record.syncs]


def test_device_reads_are_counted_with_their_site():
    dev = torch.arange(10)
    on_device([dev])
    with Census() as c:
        x = dev + 1
        x[3].item()
        int(x.sum())
        x.tolist()
        x.cpu()
        x[x > 3]
        torch.nonzero(x)
        x.repeat_interleave(x)
    assert _kinds(c) == ["item()", "__int__()", "tolist()", "cpu() of a device tensor", "boolean-mask indexing",
                         "nonzero()", "repeat_interleave without output_size"]
    assert all(s.site.startswith("tests/gpu_check/test_census.py:") for s in c.record.syncs)


def test_blocking_copies_to_the_device_are_counted():
    dev, host = torch.zeros(3), torch.arange(3.0)
    on_device([dev])
    with Census() as c:
        torch.tensor([1, 2], device=dev.device)
        host.to(dev.device)
        dev.copy_(host)
        host.to(dev.device, non_blocking=True)
    assert _kinds(c) == ["torch.tensor(..., device=) from host data", "blocking host-to-device copy",
                         "blocking host-to-device copy_"]


def test_host_work_device_factories_and_staging_are_free():
    dev, host = torch.arange(8), torch.arange(8)
    on_device([dev])
    with Census() as c:
        host.tolist()
        host[host > 2]
        int(host[0])
        made = torch.zeros(4, device=dev.device)
        (staged,) = to_device(dev.device, host)
        (staged + made.sum()).shape
        dev[torch.tensor(2)]  # a host 0-dim index into a device tensor: no read of device data
    assert _kinds(c) == []
    assert c.record.counts["h2d_copies"] == 1 and c.record.counts["h2d_bytes"] == 64
    # What the census learnt is device-side stays so, and the host tensors stay host tensors.
    with Census() as c:
        staged.tolist()
        made.tolist()
        host.tolist()
    assert _kinds(c) == ["tolist()", "tolist()"]


def test_what_comes_back_to_the_host_is_a_host_tensor():
    dev = torch.arange(6)
    on_device([dev])
    with Census() as c:
        back = dev.cpu()  # on a CPU engine the tensor itself: the census hands out a host copy
        back.tolist()
        again = dev.to("cpu")
        again.numpy()
        dev.tolist()
    assert _kinds(c) == ["cpu() of a device tensor", "to('cpu') of a device tensor", "tolist()"]


def test_a_host_tensor_moved_to_the_device_on_a_cpu_engine_stays_a_host_tensor():
    host = torch.arange(4)
    with Census() as c:
        moved = host.to(torch.device("cpu"))  # a device copy on a CPU engine is the tensor itself
        moved.tolist()
        host.tolist()
    assert _kinds(c) == ["blocking host-to-device copy", "tolist()"]
