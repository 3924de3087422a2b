"""The host path with every device tensor on PyTorch's ``meta`` device, without a GPU: meta tensors have a
device and a shape but no data, so a host/device mix raises and so does any op whose result depends on device
data (``.item()``, ``.tolist()``, ``nonzero``, boolean indexing: each a host sync on a GPU); the traceback
names the site. Covered, per backend and selection at the Llama-3.1-8B shape, 16K, T = 4,096: the step
planner, the staging of plans, every backend's metadata builders, the split states' host buffer and its copy
back, the exact rows' gather. (``FakeTensorMode`` would fake the host's planning tensors too, whose data the
planner legitimately reads.)"""

from __future__ import annotations

import pytest
import torch

from sgl_ridgefill.gpu_check.estimates import BACKENDS, SELECTIONS, Case, host_side, select


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("selection", SELECTIONS)
def test_the_host_path_has_no_host_device_mix_and_no_data_dependent_op(backend, selection):
    case = Case("llama-3.1-8b", 16384, 4096, selection, backend)
    row = host_side(case, select(case), repeats=1, device="meta")
    assert row["steps"] >= 1 and row["syncs"] == (0 if selection == "no rows" else 1)
    assert row["mask_bytes"] == (16384 if selection.startswith("probe") else 0)


def test_a_data_dependent_op_on_a_device_tensor_raises():
    """The check can fail: an ``.item()`` of a device tensor, as the host path once had, is refused."""
    with pytest.raises(Exception, match="meta"):
        torch.zeros(4, device="meta").sum().item()


def test_a_host_device_mix_raises():
    with pytest.raises(Exception, match="meta|device"):
        torch.cat([torch.zeros(2, device="meta"), torch.zeros(2)])
