"""Sufficient statistics of the ridge maps, accumulated in float64, and their resumable store.

For one split ``S`` over a set of rows (token positions), with ``x = x_S`` and ``y_l = x_l`` for each
upper layer ``l in [S, L)``, the raw (uncentered) sums

    count, sum_x [d], sum_y [U, d], xtx = sum x x^T [d, d], xty = sum x y_l^T [U, d, d], yy = sum |y_l|^2 [U]

determine both the ridge solve (after centering) and the squared error of any affine map ``(A, b)``
on those rows, so held-out scoring needs no stored states either. Raw sums are kept in float64 and
centered only at solve time; float64 absorbs the cancellation from the residual stream's large means.

The store is one safetensors file (statistics of every split, training and held-out, token counts)
whose metadata carries the run's identity and progress. It is replaced atomically, so an interrupted
run resumes from the last checkpoint at a document boundary and never counts a document twice.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
from typing import Any, Mapping

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from .config import CalibrationError

STATS_FILE = "stats.safetensors"
STATS_FORMAT = "sgl-ridgefill-stats"
STATS_VERSION = 1
_FIELDS = ("count", "sum_x", "sum_y", "xtx", "xty", "yy")


@dataclasses.dataclass
class SplitStats:
    """Raw float64 sums for split ``split`` (upper layers ``split..num_layers-1``, ``U`` of them)."""

    split: int
    num_layers: int
    count: torch.Tensor  # [] rows
    sum_x: torch.Tensor  # [d]
    sum_y: torch.Tensor  # [U, d]
    xtx: torch.Tensor  # [d, d]
    xty: torch.Tensor  # [U, d_in, d_out]
    yy: torch.Tensor  # [U]

    @classmethod
    def zeros(cls, split: int, num_layers: int, d: int) -> "SplitStats":
        u = num_layers - split
        f64 = torch.float64
        return cls(split, num_layers, torch.zeros((), dtype=f64), torch.zeros(d, dtype=f64),
                   torch.zeros(u, d, dtype=f64), torch.zeros(d, d, dtype=f64),
                   torch.zeros(u, d, d, dtype=f64), torch.zeros(u, dtype=f64))

    @property
    def layers(self) -> tuple[int, ...]:
        return tuple(range(self.split, self.num_layers))

    @property
    def rows(self) -> int:
        return int(self.count.item())

    def add(self, states: Mapping[int, torch.Tensor]) -> None:
        """Accumulate one sequence. ``states``: ``{l: x_l [n, d]}`` for ``split`` and every upper layer,
        already float64 (see :func:`to_float64`)."""
        x = states[self.split]
        self.count += x.shape[0]
        self.sum_x += x.sum(0)
        self.xtx.addmm_(x.T, x)
        for i, layer in enumerate(self.layers):
            y = states[layer]
            self.sum_y[i] += y.sum(0)
            self.xty[i].addmm_(x.T, y)
            self.yy[i] += torch.dot(y.reshape(-1), y.reshape(-1))

    def tensors(self, prefix: str) -> dict[str, torch.Tensor]:
        return {f"{prefix}.{name}": getattr(self, name).reshape(-1) if name == "count" else getattr(self, name)
                for name in _FIELDS}

    @classmethod
    def from_tensors(cls, prefix: str, tensors: Mapping[str, torch.Tensor], split: int, num_layers: int) -> "SplitStats":
        values = {name: tensors[f"{prefix}.{name}"] for name in _FIELDS}
        values["count"] = values["count"].reshape(())
        return cls(split, num_layers, **values)


def to_float64(states: Mapping[int, torch.Tensor]) -> dict[int, torch.Tensor]:
    """One conversion per layer per sequence, shared by every split that reads the layer."""
    return {layer: x.to(torch.float64) for layer, x in states.items()}


@dataclasses.dataclass
class StatsState:
    """Everything a calibration pass accumulates, and its progress.

    ``run``: what identifies the pass (model and tokenizer fingerprints, corpus, splits, document
    settings, seed); a resumed pass must match it. ``progress``: ids of finished documents and counters.
    """

    run: dict[str, Any]
    train: dict[int, SplitStats]
    heldout: dict[int, SplitStats]
    token_counts: torch.Tensor  # [vocab] int64
    progress: dict[str, Any]

    @classmethod
    def fresh(cls, run: dict[str, Any], splits: tuple[int, ...], num_layers: int, d: int, vocab: int) -> "StatsState":
        progress = {
            "done": [], "heldout_ids": [], "skipped_short": [], "exhausted": False,
            "train_sources": {}, "heldout_sources": {},
            "train": {"documents": 0, "tokens": 0, "pieces": 0, "longest": 0},
            "heldout": {"documents": 0, "tokens": 0, "pieces": 0, "longest": 0},
        }
        return cls(
            run,
            {s: SplitStats.zeros(s, num_layers, d) for s in splits},
            {s: SplitStats.zeros(s, num_layers, d) for s in splits},
            torch.zeros(vocab, dtype=torch.int64),
            progress,
        )

    def save(self, stats_dir: pathlib.Path) -> None:
        """Write the whole state as one file, atomically (temporary file, then rename)."""
        stats_dir.mkdir(parents=True, exist_ok=True)
        tensors = {"token_counts": self.token_counts}
        for split, stats in self.train.items():
            tensors.update(stats.tensors(f"train.split{split}"))
        for split, stats in self.heldout.items():
            tensors.update(stats.tensors(f"heldout.split{split}"))
        header = {"format": STATS_FORMAT, "version": STATS_VERSION, "run": self.run, "progress": self.progress}
        tmp = stats_dir / f".{STATS_FILE}.tmp-{os.getpid()}"
        try:
            save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp), metadata={"ridgefill": json.dumps(header)})
            os.replace(tmp, stats_dir / STATS_FILE)
        finally:
            tmp.unlink(missing_ok=True)
        # A readable copy for people; the safetensors metadata is what the code trusts.
        (stats_dir / "stats.json").write_text(json.dumps(header, indent=1) + "\n")


def stats_exist(stats_dir: pathlib.Path) -> bool:
    return (pathlib.Path(stats_dir) / STATS_FILE).is_file()


def load_stats(stats_dir: pathlib.Path) -> StatsState:
    """Read a stats folder written by :meth:`StatsState.save`; raises :class:`CalibrationError` if unusable."""
    path = pathlib.Path(stats_dir) / STATS_FILE
    if not path.is_file():
        raise CalibrationError(f"--stats {stats_dir}: no {STATS_FILE} there (not a calibration stats folder)")
    try:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            header = json.loads((f.metadata() or {})["ridgefill"])
            tensors = {key: f.get_tensor(key) for key in f.keys()}
    except Exception as exc:  # a foreign or damaged file: say which, not how safetensors failed
        raise CalibrationError(f"--stats {stats_dir}: {STATS_FILE} cannot be read ({type(exc).__name__}: {exc})") from None
    if header.get("format") != STATS_FORMAT or header.get("version") != STATS_VERSION:
        raise CalibrationError(
            f"--stats {stats_dir}: {STATS_FILE} has format {header.get('format')!r} version {header.get('version')!r}; "
            f"expected {STATS_FORMAT!r} version {STATS_VERSION}"
        )
    run = header["run"]
    num_layers = run["num_layers"]
    splits = tuple(run["splits"])
    return StatsState(
        run,
        {s: SplitStats.from_tensors(f"train.split{s}", tensors, s, num_layers) for s in splits},
        {s: SplitStats.from_tensors(f"heldout.split{s}", tensors, s, num_layers) for s in splits},
        tensors["token_counts"],
        header["progress"],
    )
