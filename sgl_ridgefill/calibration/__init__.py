"""Calibration: one pass of the unmodified model, sufficient statistics, closed-form ridge maps.

Engine-free: runs the model in ``transformers`` and never imports SGLang. Entry points:
:func:`calibrate` (pass + solve + write), :func:`collect_stats` (the pass alone, for several map kinds),
:func:`resolve` (solve saved statistics, any kind they hold), and
:func:`capture_layer_inputs` (the layer-input capture the runtime cross-checks against SGLang).
"""

from __future__ import annotations

from .capture import SUPPORTED_ARCHITECTURES, capture_layer_inputs, load_model, read_config
from .config import LAMBDA_GRID, CalibrationConfig, CalibrationError, default_stats_dir
from .corpus import DEBIAN_PACKAGES, Corpus, Document, builtin_corpus, folder_corpus, open_corpus
from .pipeline import CalibrationResult, calibrate, collect_stats, resolve
from .solve import SplitFit, fit_split, identity_errors, r2_scores, ridge_maps, squared_errors, total_variance
from .stats import SplitStats, StatsState, load_stats

__all__ = [
    "DEBIAN_PACKAGES",
    "LAMBDA_GRID",
    "SUPPORTED_ARCHITECTURES",
    "CalibrationConfig",
    "CalibrationError",
    "CalibrationResult",
    "Corpus",
    "Document",
    "SplitFit",
    "SplitStats",
    "StatsState",
    "builtin_corpus",
    "calibrate",
    "collect_stats",
    "capture_layer_inputs",
    "default_stats_dir",
    "fit_split",
    "folder_corpus",
    "identity_errors",
    "load_model",
    "load_stats",
    "open_corpus",
    "r2_scores",
    "read_config",
    "resolve",
    "ridge_maps",
    "squared_errors",
    "total_variance",
]
