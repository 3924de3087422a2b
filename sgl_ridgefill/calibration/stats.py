"""Sufficient statistics of the ridge maps, accumulated in float64, and their resumable store.

For one split ``S`` and one map kind (``maps/kinds.py``) over a set of rows (token positions), with ``z``
the kind's features of a row (``[d_in]``), ``y_l`` its target at each upper layer ``l in [S, L)``
(``[d_out]``) and ``p_l`` identity fill's prediction of that target (the target computed from ``x_S`` in
place of ``x_l``), the raw (uncentered) sums

    count, sum_x [d_in], sum_y [U, d_out], xtx = sum z z^T [d_in, d_in], xty = sum z y_l^T [U, d_in, d_out],
    yy = sum |y_l|^2 [U], py = sum p_l . y_l [U], pp = sum |p_l|^2 [U]

determine the ridge solve (after centering), the squared error of any affine map ``(A, b)`` on those rows
and that of identity fill, so held-out scoring needs no stored states either. Raw sums are kept in float64
and centered only at solve time; float64 absorbs the cancellation from the residual stream's large means.

How each piece's products are formed is the pass's *accumulation* (:data:`sgl_ridgefill.vocabulary.ACCUMULATIONS`): ``float64``
multiplies in float64; ``float32-blocks`` multiplies one forward piece (a block of at most ``doc_tokens``
rows) in float32 and adds the block's sums into the same float64 totals, for GPUs whose float64 rate is a
small fraction of their float32 rate. ``python -m sgl_ridgefill.calibration.precision`` measures what the
second costs in held-out R^2 and in the maps (:func:`choose_accumulation` says what ``auto`` picks).

The store is one safetensors file (statistics of every split and kind: training rows, held-out normal
rows and held-out rows with the sinks; token counts) whose metadata carries the run's identity and
progress. It is replaced atomically, so an interrupted run resumes from the last checkpoint at a document
boundary and never counts a document twice.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
from typing import Any, Mapping, Sequence

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from sgl_ridgefill.maps.kinds import map_kind

from .config import CalibrationError, check_accumulation

STATS_FILE = "stats.safetensors"
STATS_FORMAT = "sgl-ridgefill-stats"
STATS_VERSION = 2  # 2: per map kind, sinks left out, held-out kept with and without them, identity sums
_FIELDS = ("count", "sum_x", "sum_y", "xtx", "xty", "yy", "py", "pp")
SIDES = ("train", "heldout", "heldout_all")  # training rows and held-out rows without sinks; held-out rows, all
LEGACY_ACCUMULATION = "float64"  # what statistics written before the choice existed used
# What ``auto`` picks on a CUDA device, and why: the measurement ``calibration/precision.py`` makes
# (docs/precision/avx2-float32): float32 block products moved the maps of Qwen2.5-Coder-0.5B by at most
# 1.8e-5 (relative; bfloat16 storage rounds by up to 3.9e-3) and their held-out R^2 by at most 2.1e-5, while a
# GPU without fast float64 (most but the data-centre parts) multiplies float32 tens of times faster.
CUDA_ACCUMULATION = "float32-blocks"
CUDA_ACCUMULATION_REASON = ("float32 products per piece on CUDA: measured within 2.1e-5 of float64's held-out R^2 "
                            "and 1.8e-5 of its maps; --accumulate float64 for float64 products")


def accumulation_dtype(name: str) -> torch.dtype:
    """The dtype ``name`` (one of ``vocabulary.ACCUMULATIONS``: each starts with its dtype) multiplies in."""
    return getattr(torch, name.partition("-")[0])


def choose_accumulation(requested: str, device: torch.device | str) -> tuple[str, str]:
    """``(accumulation, why)`` for ``--accumulate requested`` on ``device``: ``auto`` is float64 on the CPU
    (what calibration has always done) and :data:`CUDA_ACCUMULATION` on CUDA."""
    check_accumulation(requested)
    if requested != "auto":
        return requested, "chosen with --accumulate"
    if torch.device(device).type == "cuda":
        return CUDA_ACCUMULATION, CUDA_ACCUMULATION_REASON
    return LEGACY_ACCUMULATION, "float64 products on the CPU"


@dataclasses.dataclass
class SplitStats:
    """Raw float64 sums of one map kind for split ``split`` (upper layers ``split..num_layers-1``, ``U``
    of them): features ``[d_in]``, targets ``[d_out]``."""

    split: int
    num_layers: int
    count: torch.Tensor  # [] rows
    sum_x: torch.Tensor  # [d_in]
    sum_y: torch.Tensor  # [U, d_out]
    xtx: torch.Tensor  # [d_in, d_in]
    xty: torch.Tensor  # [U, d_in, d_out]
    yy: torch.Tensor  # [U]
    py: torch.Tensor  # [U] identity fill's prediction . target
    pp: torch.Tensor  # [U] |identity fill's prediction|^2

    @classmethod
    def zeros(cls, split: int, num_layers: int, d_in: int, d_out: int | None = None) -> "SplitStats":
        u, d_out = num_layers - split, d_in if d_out is None else d_out
        z = lambda *shape: torch.zeros(shape, dtype=torch.float64)  # noqa: E731
        return cls(split, num_layers, z(), z(d_in), z(u, d_out), z(d_in, d_in), z(u, d_in, d_out), z(u), z(u), z(u))

    @property
    def layers(self) -> tuple[int, ...]:
        return tuple(range(self.split, self.num_layers))

    @property
    def rows(self) -> int:
        return int(self.count.item())

    def add_features(self, z: torch.Tensor) -> None:
        """Accumulate the features of some rows (``z``: ``[n, d_in]``, float64, or float32 for a block whose
        products are formed in float32); their targets follow, layer by layer, through :meth:`add_layer`
        with the same rows and dtype."""
        self.count += z.shape[0]
        self.sum_x += z.sum(0)
        _add_product(self.xtx, z.T, z)

    def add_layer(self, index: int, z: torch.Tensor, y: torch.Tensor, p: torch.Tensor) -> None:
        """Accumulate upper layer ``split + index``: ``z`` ``[n, d_in]`` features, ``y`` ``[n, d_out]`` targets,
        ``p`` ``[n, d_out]`` identity fill's predictions of them, all in the dtype of :meth:`add_features`."""
        self.sum_y[index] += y.sum(0)
        _add_product(self.xty[index], z.T, y)
        self.yy[index] += torch.dot(y.reshape(-1), y.reshape(-1))
        self.py[index] += torch.dot(p.reshape(-1), y.reshape(-1))
        self.pp[index] += torch.dot(p.reshape(-1), p.reshape(-1))

    def add(self, z: torch.Tensor, targets: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Accumulate rows at once: ``z`` ``[n, d_in]`` and, per upper layer in order, ``(y, p)`` ``[n, d_out]``."""
        self.add_features(z)
        for index, (y, p) in enumerate(targets):
            self.add_layer(index, z, y, p)

    def to(self, device: torch.device | str) -> None:
        """Move every sum to ``device`` (in place)."""
        for name in _FIELDS:
            setattr(self, name, getattr(self, name).to(device))

    def tensors(self, prefix: str) -> dict[str, torch.Tensor]:
        return {f"{prefix}.{name}": getattr(self, name).reshape(-1) if name == "count" else getattr(self, name)
                for name in _FIELDS}

    @classmethod
    def from_tensors(cls, prefix: str, tensors: Mapping[str, torch.Tensor], split: int, num_layers: int) -> "SplitStats":
        values = {name: tensors[f"{prefix}.{name}"] for name in _FIELDS}
        values["count"] = values["count"].reshape(())
        return cls(split, num_layers, **values)


def _add_product(total: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """``total += a @ b``: in place in float64, or as one float32 block product added to the float64 total."""
    if a.dtype == total.dtype:
        total.addmm_(a, b)
    else:
        total += a @ b


Key = tuple[int, str]  # (split, map kind)


@dataclasses.dataclass
class StatsState:
    """Everything a calibration pass accumulates, and its progress.

    ``run``: what identifies the pass (model and tokenizer fingerprints, corpus, splits, map kinds, sink
    rule, document settings, seed); a resumed pass must match it. ``train``/``heldout``/``heldout_all``:
    per ``(split, kind)``, the statistics of training rows and held-out rows without sinks, and of every
    held-out row. ``exact_kv``: per split, the split layer's own K/V projection of ``u_S``
    (``A [2 kv_dim, d]``, ``b [2 kv_dim]``; only with a ``kv`` kind), its exact map. ``progress``: ids of
    finished documents and counters (sink rows per split among them).
    """

    run: dict[str, Any]
    train: dict[Key, SplitStats]
    heldout: dict[Key, SplitStats]
    heldout_all: dict[Key, SplitStats]
    exact_kv: dict[int, tuple[torch.Tensor, torch.Tensor]]
    token_counts: torch.Tensor  # [vocab] int64
    progress: dict[str, Any]

    @property
    def kinds(self) -> tuple[str, ...]:
        return tuple(self.run["kinds"])

    @property
    def splits(self) -> tuple[int, ...]:
        return tuple(self.run["splits"])

    def sides(self) -> dict[str, dict[Key, SplitStats]]:
        return {"train": self.train, "heldout": self.heldout, "heldout_all": self.heldout_all}

    @classmethod
    def fresh(cls, run: dict[str, Any]) -> "StatsState":
        """Empty statistics for ``run`` (its ``splits``, ``kinds``, ``num_layers``, ``d``, ``kv_dim``, ``vocab``)."""
        progress = {
            "done": [], "heldout_ids": [], "skipped_short": [], "exhausted": False,
            "train_sources": {}, "heldout_sources": {},
            "train": {"documents": 0, "tokens": 0, "pieces": 0, "longest": 0, "sinks": {}},
            "heldout": {"documents": 0, "tokens": 0, "pieces": 0, "longest": 0, "sinks": {}},
        }
        empty = lambda: {key: _zeros(run, *key) for key in _keys(run)}  # noqa: E731
        return cls(run, empty(), empty(), empty(), {}, torch.zeros(run["vocab"], dtype=torch.int64), progress)

    def to(self, device: torch.device | str) -> None:
        """Move the sums to ``device`` (in place; the token counts and exact K/V maps stay in host memory)."""
        for stats in self.sides().values():
            for entry in stats.values():
                entry.to(device)

    def save(self, stats_dir: pathlib.Path) -> None:
        """Write the whole state as one file, atomically (temporary file, then rename)."""
        stats_dir.mkdir(parents=True, exist_ok=True)
        tensors = {"token_counts": self.token_counts}
        for side, stats in self.sides().items():
            for (split, kind), entry in stats.items():
                tensors.update(entry.tensors(f"{side}.split{split}.{kind}"))
        for split, (a, b) in self.exact_kv.items():
            tensors[f"exact_kv.split{split}.A"], tensors[f"exact_kv.split{split}.b"] = a, b
        header = {"format": STATS_FORMAT, "version": STATS_VERSION, "run": self.run, "progress": self.progress}
        tmp = stats_dir / f".{STATS_FILE}.tmp-{os.getpid()}"
        try:
            save_file({k: v.contiguous().cpu() for k, v in tensors.items()}, str(tmp), metadata={"ridgefill": json.dumps(header)})
            os.replace(tmp, stats_dir / STATS_FILE)
        finally:
            tmp.unlink(missing_ok=True)
        # A readable copy for people; the safetensors metadata is what the code trusts.
        (stats_dir / "stats.json").write_text(json.dumps(header, indent=1) + "\n")


def _keys(run: Mapping[str, Any]) -> list[Key]:
    return [(split, kind) for split in run["splits"] for kind in run["kinds"]]


def _zeros(run: Mapping[str, Any], split: int, kind: str) -> SplitStats:
    k = map_kind(kind)
    return SplitStats.zeros(split, run["num_layers"], k.d_in(run["d"]), k.d_out(run["d"], run["kv_dim"]))


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
    version = header.get("version")
    if header.get("format") == STATS_FORMAT and isinstance(version, int) and version < STATS_VERSION:
        raise CalibrationError(
            f"--stats {stats_dir}: {STATS_FILE} was written by an older sgl-ridgefill (stats version {version}; this "
            f"one reads version {STATS_VERSION}, with statistics per map kind and sink rows left out): re-run calibrate "
            f"stats with --force to rebuild them"
        )
    if header.get("format") != STATS_FORMAT or version != STATS_VERSION:
        raise CalibrationError(
            f"--stats {stats_dir}: {STATS_FILE} has format {header.get('format')!r} version {version!r}; "
            f"expected {STATS_FORMAT!r} version {STATS_VERSION}"
        )
    run = header["run"]
    run.setdefault("accumulate", LEGACY_ACCUMULATION)  # written before the choice existed: float64 products
    sides = {
        side: {(s, k): SplitStats.from_tensors(f"{side}.split{s}.{k}", tensors, s, run["num_layers"]) for s, k in _keys(run)}
        for side in SIDES
    }
    exact_kv = {
        s: (tensors[f"exact_kv.split{s}.A"], tensors[f"exact_kv.split{s}.b"])
        for s in run["splits"] if f"exact_kv.split{s}.A" in tensors
    }
    return StatsState(run, sides["train"], sides["heldout"], sides["heldout_all"], exact_kv, tensors["token_counts"],
                      header["progress"])
