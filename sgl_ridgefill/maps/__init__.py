"""The maps folder: what calibration writes and the runtime loads (format in :mod:`.format`).

Nothing here imports SGLang. Typical runtime use::

    maps = load_maps(path)                       # manifest, version and sha256 of every file checked
    warnings = maps.check_model(model_fingerprint(hf_config, embed.weight, norm.weight, layers))
    A, b = maps.load_split(maps.default_split, dtype=torch.bfloat16, device="cuda")
"""

from __future__ import annotations

from .fingerprint import compare_fingerprints, hf_fingerprint_layers, model_fingerprint, tokenizer_fingerprint
from .format import FORMAT_VERSION, INT8_ELEMENT_BOUND, MANIFEST, TOKEN_COUNTS, MapsError, split_file
from .reader import MapsFolder, load_maps
from .writer import SplitMaps, identity_maps_folder, refingerprint_maps_folder, write_maps_folder

__all__ = [
    "FORMAT_VERSION",
    "INT8_ELEMENT_BOUND",
    "MANIFEST",
    "TOKEN_COUNTS",
    "MapsError",
    "MapsFolder",
    "SplitMaps",
    "compare_fingerprints",
    "hf_fingerprint_layers",
    "identity_maps_folder",
    "load_maps",
    "model_fingerprint",
    "refingerprint_maps_folder",
    "split_file",
    "tokenizer_fingerprint",
    "write_maps_folder",
]
