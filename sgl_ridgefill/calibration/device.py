"""Where calibration runs: ``--device {auto,cpu,cuda,cuda:N}``.

The forward pass runs where the model is; a model too large for one GPU is spread over the visible GPUs by
``accelerate``'s ``device_map="auto"`` (``--device cuda`` with several GPUs). The statistics are float64 sums
(``stats.py``) and stay on the first device of the model: on a data-centre GPU their float64 matrix products
are fast (tensor-core FP64), and on the CPU they are what calibration has always accumulated, so the same
corpus gives the same statistics on either, up to the rounding of the forward pass in its dtype. Saved
statistics are always written from host memory, so a pass started on one device resumes on another.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from .config import CalibrationError

CHOICES = "auto, cpu, cuda, cuda:N"


@dataclasses.dataclass(frozen=True)
class Placement:
    """``device_map`` for ``from_pretrained`` and the device the statistics live on."""

    device_map: Any  # a device string, or "auto" to spread over every visible GPU
    stats_device: torch.device

    def line(self) -> str:
        if self.device_map == "auto":
            return f"device: the model spread over {torch.cuda.device_count()} GPUs; statistics on {self.stats_device}"
        return f"device: {self.stats_device} (model and statistics)"


def place(requested: str = "auto") -> Placement:
    """The placement ``--device requested`` asks for on this machine; a clear error when it is not here."""
    requested = (requested or "auto").strip()
    if requested == "auto":
        requested = "cuda" if torch.cuda.is_available() else "cpu"
    if requested == "cpu":
        return Placement("cpu", torch.device("cpu"))
    if requested == "cuda" or requested.startswith("cuda:"):
        if not torch.cuda.is_available():
            raise CalibrationError(f"--device {requested}: this machine has no CUDA device (torch sees none); use --device cpu")
        if requested == "cuda":
            if torch.cuda.device_count() > 1:
                return Placement("auto", torch.device("cuda:0"))
            return Placement("cuda:0", torch.device("cuda:0"))
        index = requested.removeprefix("cuda:")
        if not index.isdigit() or int(index) >= torch.cuda.device_count():
            raise CalibrationError(
                f"--device {requested}: no such GPU (this machine has {torch.cuda.device_count()}: cuda:0..)"
            )
        return Placement(requested, torch.device(requested))
    raise CalibrationError(f"--device must be one of {CHOICES}, got {requested!r}")
