"""Calibration settings, validated at construction, and the calibration error type."""

from __future__ import annotations

import dataclasses
import pathlib

from sgl_ridgefill.cpu.dtype import CHOICES as DTYPES
from sgl_ridgefill.maps.format import QUANTS
from sgl_ridgefill.maps.kinds import DEFAULT_KIND, MAP_KINDS
from sgl_ridgefill.vocabulary import ACCUMULATIONS

# Scale-free ridge penalties tried on held-out documents (the seeds chose 0.03, 0.01 and 0.003).
LAMBDA_GRID: tuple[float, ...] = (1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 3e-1, 1.0)


class CalibrationError(ValueError):
    """A user error in calibration input: corpus, model, splits, penalty, output folder."""


def check_accumulation(requested: str) -> None:
    """``--accumulate``: ``auto`` or one of :data:`~sgl_ridgefill.vocabulary.ACCUMULATIONS`."""
    if requested != "auto" and requested not in ACCUMULATIONS:
        raise CalibrationError(f"--accumulate must be auto or one of {', '.join(ACCUMULATIONS)}, got {requested!r}")


def default_stats_dir(out_dir: pathlib.Path) -> pathlib.Path:
    """Statistics live beside the maps folder (they can be GBs), never inside it."""
    return out_dir.parent / f"{out_dir.name}.stats"


@dataclasses.dataclass(frozen=True)
class CalibrationConfig:
    """One calibration run.

    ``model``: HF folder or a name :func:`sgl_ridgefill.models.fetch_model` knows; ``corpus``: a folder of
    ``.txt``/``.jsonl`` files or ``"builtin"``; ``splits``: split layers (checked against the model's
    ``1..L-1`` once it is loaded); ``lam``: ridge penalty, ``None`` to choose it on held-out documents;
    ``max_tokens``: training tokens to read (held-out documents come on top); ``doc_tokens``: longest
    forward pass (longer documents are cut into pieces of this many tokens); ``max_doc_pieces``: pieces
    read from one training document at most (the rest of a long document is left unread, so one book
    cannot crowd out the others); ``min_doc_tokens``: shorter
    documents (and trailing pieces) are skipped; ``heldout_docs``: whole documents kept out of the fit to
    choose ``lam`` and score the maps; ``checkpoint_seconds``: how often statistics are saved for resume;
    ``dtype``: the model's dtype for the pass, ``"auto"`` for this CPU's (:mod:`sgl_ridgefill.cpu.dtype`:
    bfloat16 where its matmuls run natively, float32 elsewhere; on a GPU, bfloat16); ``device``: where the
    pass runs (:mod:`.device`: ``auto`` is CUDA when present); ``accumulate``: how the statistics' products
    are formed (:data:`sgl_ridgefill.vocabulary.ACCUMULATIONS`, ``auto``: :func:`.stats.choose_accumulation`).
    """

    model: str
    corpus: str
    splits: tuple[int, ...]
    out_dir: pathlib.Path | None  # None: statistics only (`calibrate stats`), into stats_dir
    lam: float | None = None
    max_tokens: int = 250_000
    doc_tokens: int = 2048
    max_doc_pieces: int = 4
    min_doc_tokens: int = 64
    heldout_docs: int = 5
    quant: str = "bf16"
    group_size: int = 128
    stats_dir: pathlib.Path | None = None
    force: bool = False
    seed: int = 0
    dtype: str = "auto"
    device: str = "auto"
    accumulate: str = "auto"
    checkpoint_seconds: float = 120.0
    progress: bool = True
    # Map kinds (maps/kinds.py) whose statistics the pass accumulates; `calibrate` fits the first.
    kinds: tuple[str, ...] = (DEFAULT_KIND,)

    def __post_init__(self) -> None:
        if self.out_dir is not None:
            object.__setattr__(self, "out_dir", pathlib.Path(self.out_dir))
        if self.stats_dir is not None:
            object.__setattr__(self, "stats_dir", pathlib.Path(self.stats_dir))
        if self.out_dir is None and self.stats_dir is None:
            raise CalibrationError("--stats: give the statistics folder to write (there is no --out to put it beside)")
        kinds = (self.kinds,) if isinstance(self.kinds, str) else tuple(self.kinds)
        object.__setattr__(self, "kinds", kinds)
        if not kinds:
            raise CalibrationError(f"--kinds: give at least one map kind ({', '.join(MAP_KINDS)}, or all)")
        for kind in kinds:
            if kind not in MAP_KINDS:
                raise CalibrationError(f"--kinds: unknown map kind {kind!r}; known: {', '.join(MAP_KINDS)} (or all)")
        if len(set(kinds)) != len(kinds):
            raise CalibrationError(f"--kinds: {','.join(kinds)} repeats a kind")
        splits = tuple(self.splits)
        object.__setattr__(self, "splits", splits)
        if not splits:
            raise CalibrationError("--splits: give at least one split layer, e.g. --splits 12")
        for split in splits:
            if not isinstance(split, int) or isinstance(split, bool) or split < 1:
                raise CalibrationError(f"--splits: split {split!r} must be an integer >= 1")
        if len(set(splits)) != len(splits):
            raise CalibrationError(f"--splits: {','.join(map(str, splits))} repeats a split")
        if self.lam is not None and not self.lam > 0:
            raise CalibrationError(f"--lambda must be a positive number or 'auto', got {self.lam!r}")
        if self.max_tokens < 1:
            raise CalibrationError(f"--max-tokens must be positive, got {self.max_tokens}")
        if self.max_doc_pieces < 1:
            raise CalibrationError(f"--max-doc-pieces must be at least 1, got {self.max_doc_pieces}")
        if self.min_doc_tokens < 2:
            raise CalibrationError(f"--min-doc-tokens must be at least 2, got {self.min_doc_tokens}")
        if self.doc_tokens < self.min_doc_tokens:
            raise CalibrationError(
                f"--doc-tokens {self.doc_tokens} is below --min-doc-tokens {self.min_doc_tokens}"
            )
        if self.heldout_docs < 0:
            raise CalibrationError(f"--heldout-docs must be >= 0, got {self.heldout_docs}")
        if self.heldout_docs == 0 and self.lam is None:
            raise CalibrationError("--lambda auto chooses the penalty on held-out documents: give --heldout-docs >= 1 or a --lambda value")
        if self.quant not in QUANTS:
            raise CalibrationError(f"--quant must be one of {', '.join(QUANTS)}, got {self.quant!r}")
        if self.dtype not in DTYPES:
            raise CalibrationError(f"--dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        check_accumulation(self.accumulate)

    @property
    def resolved_stats_dir(self) -> pathlib.Path:
        return self.stats_dir if self.stats_dir is not None else default_stats_dir(self.out_dir)

    def check_splits(self, num_layers: int, where: str) -> None:
        """Every split must leave at least one exact layer below and one filled layer above."""
        for split in self.splits:
            if not 1 <= split <= num_layers - 1:
                raise CalibrationError(
                    f"--splits: split {split} is outside 1..{num_layers - 1} for {where} ({num_layers} layers)"
                )
