"""``sgl-ridgefill calibrate``: fit maps from a model and a corpus; ``calibrate stats``: the statistics
pass alone, for several map kinds; ``calibrate fit`` (or ``resolve``): solve saved statistics.

    sgl-ridgefill calibrate --model DIR_OR_NAME --corpus DIR|builtin --splits 12[,16] --out DIR
        [--kind residual|normalised|kv|kv+context] [--lambda auto|FLOAT] [--max-tokens N] [--doc-tokens N]
        [--heldout-docs N] [--quant bf16|int8] [--dtype auto|bfloat16|float32]
        [--stats DIR] [--force]
    sgl-ridgefill calibrate stats --model DIR_OR_NAME --corpus DIR|builtin --splits 12[,16] --stats DIR
        [--kinds residual,kv+context|all] [--max-tokens N] ... [--force]
    sgl-ridgefill calibrate fit --stats DIR --out DIR [--kind KIND] [--lambda auto|FLOAT] [--quant ...] [--force]
    sgl-ridgefill calibrate terminal-state --maps DIR --model DIR_OR_NAME --corpus DIR|builtin [--split S]
        [--arm ridgefill|identity] [--prompts 13] [--interval 2048] [--prompt-tokens N] [--offsets FILE]

User errors print one line and exit 1 (bad input) or 2 (bad usage); no traceback.
"""

from __future__ import annotations

import argparse
import pathlib
import sys

from sgl_ridgefill.cpu.dtype import CHOICES as DTYPE_CHOICES
from sgl_ridgefill.tools import args as argtypes
from sgl_ridgefill.vocabulary import ACCUMULATIONS

COUNT = argtypes.integer(minimum=0)


def add_subparser(subparsers: argparse._SubParsersAction) -> None:
    """Add ``calibrate`` (and ``calibrate stats``, ``fit``/``resolve``, ``fingerprint``) to the top-level parser."""
    parser = subparsers.add_parser(
        "calibrate", help="fit RidgeFill maps for a model on a text corpus",
        description="Run the model once over the corpus, keep sufficient statistics, solve the ridge maps, "
        "and write a maps folder for --ridgefill-maps.",
    )
    _pass_options(parser)
    parser.add_argument("--out", type=pathlib.Path, help="maps folder to write (must not exist unless --force)")
    parser.add_argument("--kind", type=argtypes.map_kind, default="residual",
                        help="map kind to fit: residual (default), normalised, kv or kv+context (README, maps/kinds.py)")
    _common(parser)
    parser.set_defaults(func=_calibrate, calibrate_command=None)

    commands = parser.add_subparsers(dest="calibrate_command", metavar="{stats,fit,score,fingerprint,terminal-state}")
    stats = commands.add_parser(
        "stats", help="the statistics pass alone, for one or more map kinds (then `calibrate fit --kind`)"
    )
    _pass_options(stats)
    stats.add_argument("--stats", type=pathlib.Path, required=True, help="statistics folder to write (or resume)")
    stats.add_argument("--kinds", type=argtypes.map_kinds, default=("residual",), metavar="KIND[,KIND]|all",
                       help="map kinds to accumulate (default residual; all: residual,normalised,kv,kv+context)")
    stats.add_argument("--force", action="store_true", help="restart mismatched or unreadable --stats")
    stats.set_defaults(func=_stats)
    again = commands.add_parser("fit", aliases=["resolve"],
                                help="solve saved statistics (another kind or lambda) without reading text")
    again.add_argument("--stats", type=pathlib.Path, required=True, help="statistics folder of an earlier calibrate")
    again.add_argument("--out", type=pathlib.Path, required=True, help="maps folder to write")
    again.add_argument("--splits", type=argtypes.layers, default=None, help="subset of the splits in the statistics")
    again.add_argument("--kind", type=argtypes.map_kind, default="residual", help="map kind to fit, one the statistics hold (default residual)")
    _common(again, stats=False)
    again.set_defaults(func=_resolve)
    score = commands.add_parser(
        "score", help="held-out R² of a maps folder on another pass's statistics (maps fitted on one text, scored on another)",
        description="Score --maps, as served, on the held-out rows of --stats (a `calibrate stats` pass of the same "
        "model, e.g. over another part of the corpus: --corpus builtin:code or builtin:prose). No text is read.",
    )
    score.add_argument("--maps", type=pathlib.Path, required=True, help="maps folder to score")
    score.add_argument("--stats", type=pathlib.Path, required=True, help="statistics folder whose held-out rows score it")
    score.add_argument("--splits", type=argtypes.layers, default=None, help="subset of the splits (default: all both hold)")
    score.add_argument("--json", type=pathlib.Path, default=None, help="also write the scores here")
    score.set_defaults(func=_score)
    stamp = commands.add_parser(
        "fingerprint", help="record a model's fingerprints in an existing maps folder (one written without them)"
    )
    stamp.add_argument("--maps", type=pathlib.Path, required=True, help="maps folder to update")
    stamp.add_argument("--model", required=True, help="the model the maps were fitted on (folder or known name)")
    stamp.add_argument("--force", action="store_true", help="replace a fingerprint that does not match --model")
    stamp.set_defaults(func=_fingerprint)
    terminal = commands.add_parser(
        "terminal-state", help="measure the terminal-state offsets dM of a hybrid model's maps (Gated DeltaNet)",
        description="On prompts the maps' calibration did not read, compare every upper Gated DeltaNet layer's "
        "exact and filled states every --interval tokens; store their mean difference in the maps folder.",
    )
    terminal.add_argument("--maps", type=pathlib.Path, required=True, help="maps folder (gains the offsets file)")
    terminal.add_argument("--model", required=True, help="the model the maps were fitted on (folder or known name)")
    terminal.add_argument("--corpus", required=True, help="folder of .txt/.jsonl files, or 'builtin'")
    terminal.add_argument("--split", type=int, default=None, help="split layer (default: the folder's default)")
    terminal.add_argument("--arm", choices=("ridgefill", "identity"), default="ridgefill", help="fill measured")
    terminal.add_argument("--prompts", type=COUNT, default=13, help="prompts to measure on (default 13)")
    terminal.add_argument("--interval", type=COUNT, default=2048, help="tokens between snapshots (default 2048)")
    terminal.add_argument("--prompt-tokens", type=COUNT, default=32768, help="longest prompt (default 32768)")
    terminal.add_argument("--offsets", default=None, help="file name in the maps folder (default terminal_state.safetensors)")
    terminal.add_argument("--dtype", choices=("bfloat16", "float32"), default="float32", help="model dtype")
    terminal.add_argument("--seed", type=int, default=0, help="document order")
    _device_option(terminal)
    terminal.set_defaults(func=_terminal_state)


def _device_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", default="auto", metavar="auto|cpu|cuda|cuda:N",
                        help="where the model runs (default auto: CUDA when present; cuda with several GPUs spreads "
                        "a model too large for one over all of them)")


def _pass_options(parser: argparse.ArgumentParser) -> None:
    """What the statistics pass reads and how: shared by ``calibrate`` and ``calibrate stats``."""
    parser.add_argument("--model", help="Hugging Face model folder, or a name `sgl-ridgefill model fetch` knows")
    parser.add_argument("--corpus", help="folder of .txt/.jsonl files, 'builtin' (Debian bible-kjv, python3-doc, the stdlib), "
                        "or part of it: builtin:prose (the first two), builtin:code (the stdlib), builtin:kjv, ...")
    parser.add_argument("--splits", type=argtypes.layers, help="split layer(s), comma-separated, e.g. 12 or 12,16 (first is the default)")
    parser.add_argument("--max-tokens", type=COUNT, default=250_000, help="training tokens to read (default 250000)")
    parser.add_argument("--doc-tokens", type=COUNT, default=2048, help="longest forward pass; longer documents are cut (default 2048)")
    parser.add_argument("--max-doc-pieces", type=COUNT, default=4, help="forward passes read from one document at most (default 4)")
    parser.add_argument("--min-doc-tokens", type=COUNT, default=64, help="skip shorter documents (default 64)")
    parser.add_argument("--heldout-docs", type=COUNT, default=5, help="whole documents held out to choose lambda and score (default 5)")
    parser.add_argument("--dtype", choices=DTYPE_CHOICES, default="auto",
                        help="model dtype for the pass (default auto: bfloat16 where this CPU has native bfloat16 "
                        "matmuls, float32 elsewhere; the maps serve the model in either dtype)")
    _device_option(parser)
    parser.add_argument("--accumulate", choices=("auto", *ACCUMULATIONS), default="auto",
                        help="how the statistics' products are formed, into float64 totals either way (default auto: "
                        "float64; float32-blocks multiplies each forward piece in float32, for GPUs slow at float64)")
    parser.add_argument("--seed", type=int, default=0, help="document order and held-out choice")
    parser.add_argument("--checkpoint-seconds", type=float, default=120.0, help="save statistics this often (resume point)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def _common(parser: argparse.ArgumentParser, *, stats: bool = True) -> None:
    parser.add_argument("--lambda", dest="lam", type=argtypes.positive_number_or_auto, default=None, metavar="auto|FLOAT",
                        help="ridge penalty (scale-free); 'auto' chooses it on held-out documents (default)")
    parser.add_argument("--quant", choices=("bf16", "int8"), default="bf16", help="how A is stored (int8: per-group scales)")
    parser.add_argument("--group-size", type=int, default=128, help="int8 group size along d_in")
    if stats:
        parser.add_argument("--stats", type=pathlib.Path, default=None, help="statistics folder (default: OUT.stats beside OUT)")
    parser.add_argument("--force", action="store_true", help="replace an existing --out; restart mismatched --stats")


def _fail(message: str, code: int = 1) -> int:
    print(f"sgl-ridgefill calibrate: error: {message}", file=sys.stderr)
    return code


def _missing(args: argparse.Namespace, *flags: str) -> list[str]:
    return [flag for flag in flags if getattr(args, flag[2:]) is None]


def _config(args: argparse.Namespace, *, out_dir: pathlib.Path | None, kinds: tuple[str, ...]):
    from .config import CalibrationConfig

    fit = {"lam": args.lam, "quant": args.quant, "group_size": args.group_size} if out_dir is not None else {}
    return CalibrationConfig(
        model=args.model, corpus=args.corpus, splits=args.splits, out_dir=out_dir,
        max_tokens=args.max_tokens, doc_tokens=args.doc_tokens, max_doc_pieces=args.max_doc_pieces,
        min_doc_tokens=args.min_doc_tokens,
        heldout_docs=args.heldout_docs, stats_dir=args.stats,
        force=args.force, seed=args.seed, dtype=args.dtype, device=args.device, accumulate=args.accumulate,
        checkpoint_seconds=args.checkpoint_seconds,
        progress=not args.no_progress, kinds=kinds, **fit,
    )


def _interrupted(stats: object) -> int:
    return _fail(f"interrupted; statistics up to the last checkpoint are kept in {stats}; re-run the same command to resume", 130)


def _calibrate(args: argparse.Namespace) -> int:
    from .pipeline import calibrate

    missing = _missing(args, "--model", "--corpus", "--splits", "--out")
    if missing:
        return _fail(f"the following arguments are required: {', '.join(missing)}", 2)
    try:
        result = calibrate(_config(args, out_dir=args.out, kinds=(args.kind,)))
    except ValueError as exc:  # CalibrationError, MapsError, ModelFetchError
        return _fail(str(exc))
    except KeyboardInterrupt:
        return _interrupted(args.stats or f"{args.out}.stats")
    print(result.out_dir)
    return 0


def _stats(args: argparse.Namespace) -> int:
    from .pipeline import collect_stats

    missing = _missing(args, "--model", "--corpus", "--splits")
    if missing:
        return _fail(f"the following arguments are required: {', '.join(missing)}", 2)
    try:
        _, stats_dir, _ = collect_stats(_config(args, out_dir=None, kinds=args.kinds))
    except ValueError as exc:
        return _fail(str(exc))
    except KeyboardInterrupt:
        return _interrupted(args.stats)
    print(stats_dir)
    return 0


def _resolve(args: argparse.Namespace) -> int:
    from .pipeline import resolve

    try:
        result = resolve(args.stats, args.out, args.lam, splits=args.splits, kind=args.kind, quant=args.quant,
                         group_size=args.group_size, force=args.force)
    except ValueError as exc:
        return _fail(str(exc))
    print(result.out_dir)
    return 0


def _score(args: argparse.Namespace) -> int:
    import json

    from .score import markdown, score_maps

    try:
        result = score_maps(args.maps, args.stats, splits=args.splits)
    except ValueError as exc:  # CalibrationError, MapsError
        return _fail(str(exc))
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    print(markdown(result))
    return 0


def _fingerprint(args: argparse.Namespace) -> int:
    from .pipeline import fingerprint

    try:
        path = fingerprint(args.maps, args.model, force=args.force)
    except ValueError as exc:  # CalibrationError, MapsError, ModelFetchError
        return _fail(str(exc))
    print(path)
    return 0


def _terminal_state(args: argparse.Namespace) -> int:
    from .terminal import calibrate_terminal_state

    try:
        path = calibrate_terminal_state(
            args.maps, args.model, args.corpus, split=args.split, arm=args.arm, prompts=args.prompts,
            interval=args.interval, prompt_tokens=args.prompt_tokens, name=args.offsets, dtype=args.dtype,
            seed=args.seed, device=args.device,
        )
    except ValueError as exc:  # CalibrationError, MapsError, ModelFetchError
        return _fail(str(exc))
    print(path)
    return 0
