"""The split states kept in host memory: copied there and back without the host waiting, and never read
before the copies into the buffer have landed.

On a GPU both copies are asynchronous on the device. A stand-in copy stream here queues each copy into the
buffer and carries it out only when a copy back is ordered after a marker issued behind it, as a CUDA stream
waiting on an event does; a copy back that is not ordered after the marker sees the buffer as it was before
the copies ran. The stand-in has no way to make the host wait: a host sync would fail.
"""

from __future__ import annotations

import torch

from sgl_ridgefill import ledger
from sgl_ridgefill.runtime.host_rows import HostRows


class _Stream:
    """Copies into host memory queued in order; carried out when a copy back is ordered after them."""

    def __init__(self):
        self.queued: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.issued = 0
        self.copies_back = 0

    def copy(self, dst, src):
        self.queued.append((dst, src.clone()))
        self.issued += 1

    def marker(self):
        return self.issued  # every copy issued so far

    def to_device(self, host, device, after):
        done = self.issued - len(self.queued)
        upto = 0 if after is None else max(after - done, 0)
        for dst, src in self.queued[:upto]:
            dst.copy_(src)
        del self.queued[:upto]
        self.copies_back += 1
        return host.clone()



def test_rows_come_back_ordered_after_their_copies_without_a_host_wait():
    stream = _Stream()
    rows = HostRows(6, 3, torch.float32, torch.device("cpu"), copies=stream)
    first, second = torch.arange(9.0).view(3, 3), torch.arange(9.0, 18.0).view(3, 3)
    rows.write(0, first)
    rows.write(3, second)
    assert len(stream.queued) == 2, "the copies into host memory are still in flight"
    got = rows.gather(torch.tensor([4, 0, 2]))
    assert torch.equal(got, torch.stack([second[1], first[0], first[2]]))  # not the buffer's stale contents
    assert torch.equal(rows.read(0, 6), torch.cat([first, second]))
    assert stream.copies_back == 1  # one copy back serves every gather until the next write
    rows.write(0, first + 100)
    assert torch.equal(rows.read(0, 1), first[:1] + 100) and stream.copies_back == 2


def test_only_the_gathers_index_goes_to_the_device():
    counts = ledger.Counts()
    with ledger.record(counts):
        rows = HostRows(4, 2, torch.float32, torch.device("cpu"))  # synchronous copies on a CPU engine
        rows.write(0, torch.ones(4, 2))
        rows.gather(torch.tensor([1, 3]))
    assert {k: v for k, v in counts.values.items() if v} == {"h2d_copies": 1, "h2d_bytes": 16}
