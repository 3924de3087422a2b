"""``--device`` for calibration: what each choice places where, and clear errors for what is not here."""

from __future__ import annotations

import pytest
import torch

from sgl_ridgefill.calibration.config import CalibrationError
from sgl_ridgefill.calibration.device import place
from sgl_ridgefill.calibration.stats import SplitStats


def test_cpu_and_auto_without_cuda():
    assert place("cpu").device_map == "cpu" and place("cpu").stats_device == torch.device("cpu")
    if not torch.cuda.is_available():
        assert place("auto").stats_device == torch.device("cpu")
        assert "device: cpu" in place("auto").line()


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
@pytest.mark.parametrize("device", ["cuda", "cuda:1"])
def test_cuda_without_a_gpu_is_a_clear_error(device):
    with pytest.raises(CalibrationError, match=rf"--device {device}: this machine has no CUDA device"):
        place(device)


def test_an_unknown_device_is_named():
    with pytest.raises(CalibrationError, match=r"--device must be one of auto, cpu, cuda, cuda:N, got 'gpu'"):
        place("gpu")


def test_statistics_move_with_every_sum():
    stats = SplitStats.zeros(1, 3, 4)
    z = torch.randn(5, 4, dtype=torch.float64)
    stats.add(z, [(z, z), (z, z)])
    before = {k: v.clone() for k, v in stats.tensors("s").items()}
    stats.to("cpu")
    assert all(torch.equal(before[k], v) for k, v in stats.tensors("s").items())
    stats.to("meta")  # every field goes (shapes and dtype kept): none is left behind on the host
    assert {v.device.type for v in stats.tensors("s").values()} == {"meta"}
    assert all(v.shape == before[k].shape and v.dtype == torch.float64 for k, v in stats.tensors("s").items())
