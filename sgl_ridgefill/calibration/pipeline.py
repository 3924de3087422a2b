"""One command from a model and a corpus to a maps folder: pass, solve, write.

``collect_stats`` runs (or resumes) the statistics pass for one or more map kinds; ``calibrate`` runs it
for one kind, solves every split, and writes the maps folder; ``resolve`` re-solves saved statistics for any
kind they hold, with another ``lambda`` (or quantisation), without reading text.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import resource
import sys
import time
from typing import Any, Callable

from sgl_ridgefill.maps import (
    SplitMaps,
    hf_fingerprint_layers,
    model_fingerprint,
    refingerprint_maps_folder,
    tokenizer_fingerprint,
    write_maps_folder,
)
from sgl_ridgefill.maps.format import MapsError
from sgl_ridgefill.maps.kinds import DEFAULT_KIND, MAP_KINDS, map_kind

from .config import CalibrationConfig, CalibrationError
from .solve import SplitFit, fit_split
from .stats import StatsState, choose_accumulation, load_stats, stats_exist

Log = Callable[[str], None]


def _stderr(message: str) -> None:
    print(f"[sgl-ridgefill] {message}", file=sys.stderr, flush=True)


@dataclasses.dataclass(frozen=True)
class CalibrationResult:
    out_dir: pathlib.Path
    stats_dir: pathlib.Path
    fits: dict[int, SplitFit]
    calibration: dict[str, Any]


def peak_memory_mib() -> float:
    """Peak resident memory of this process so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _comparable(run: dict[str, Any], *, layers: bool = True) -> dict[str, Any]:
    # The model folder may move (e.g. another cache dir); the fingerprints say whether it is the same model.
    out = {k: v for k, v in json.loads(json.dumps(run)).items() if k != "model_dir"}
    if not layers:
        out["model"] = {k: v for k, v in out["model"].items() if k != "layers"}
    return out


def _hf_fingerprint(model: Any, hf_config: dict[str, Any]) -> dict[str, Any]:
    from .capture import final_norm

    return model_fingerprint(
        hf_config, model.get_input_embeddings().weight, final_norm(model).weight, hf_fingerprint_layers(model)
    )


def _open_state(stats_dir: pathlib.Path, run: dict[str, Any], force: bool, log: Log) -> StatsState:
    fresh = lambda: StatsState.fresh(run)  # noqa: E731
    if not stats_exist(stats_dir):
        return fresh()
    try:
        state = load_stats(stats_dir)
    except CalibrationError:
        if not force:
            raise
        log(f"--force: discarding unreadable statistics in {stats_dir}")
        return fresh()
    # Statistics saved before per-layer fingerprints existed match on everything else, then gain them.
    legacy = "layers" not in state.run["model"]
    old, new = _comparable(state.run), _comparable(run, layers=not legacy)
    if set(new["kinds"]) <= set(old["kinds"]):
        new["kinds"] = old["kinds"]  # a pass accumulating more kinds serves this one too, and goes on with all
    if old == new:
        train = state.progress["train"]
        log(f"resuming from {stats_dir}: {train['documents']} training documents, {train['tokens']} tokens already read"
            + (f" (kinds {', '.join(state.kinds)})" if state.kinds != tuple(run["kinds"]) else ""))
        if legacy:
            log(f"{stats_dir}: recording the per-layer model fingerprint these statistics predate")
            state.run = {**run, "kinds": state.run["kinds"]}
            state.save(stats_dir)
        return state
    differing = sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k))
    if "kinds" in differing:
        differing[differing.index("kinds")] = f"kinds: they hold {','.join(old['kinds'])}, not {','.join(new['kinds'])}"
    if not force:
        raise CalibrationError(
            f"--stats {stats_dir} holds statistics of a different calibration (differs in: {', '.join(differing)}); "
            f"pass --force to discard them, or choose another --stats folder"
        )
    log(f"--force: discarding statistics in {stats_dir} (they differ in: {', '.join(differing)})")
    return fresh()


def calibrate(config: CalibrationConfig, *, log: Log = _stderr) -> CalibrationResult:
    """Run the whole calibration described by ``config`` and write maps of its first kind to ``config.out_dir``."""
    started = time.perf_counter()
    if config.out_dir is None:
        raise CalibrationError("--out: give the maps folder to write")
    state, stats_dir, pass_info = collect_stats(config, log=log)
    return _solve_and_write(
        state, stats_dir, config.out_dir, config.lam, splits=config.splits, kind=config.kinds[0], quant=config.quant,
        group_size=config.group_size, force=config.force,
        extra={"max_tokens": config.max_tokens, "max_doc_pieces": config.max_doc_pieces, "pass": pass_info,
               "_started": started}, log=log,
    )


def collect_stats(config: CalibrationConfig, *, log: Log = _stderr) -> tuple[StatsState, pathlib.Path, dict[str, Any]]:
    """Run (or resume) the statistics pass of ``config`` for its map kinds: ``(state, stats folder, pass timing)``."""
    from sgl_ridgefill.cpu.dtype import DtypeChoice, choose_dtype
    from sgl_ridgefill.models import resolve_model

    from .capture import load_model, read_config
    from .device import place
    from .corpus import open_corpus
    from .statpass import check_enough_rows, run_pass
    from .targets import kv_dim, recurrent_layers, sink_rule

    out_dir = config.out_dir
    if out_dir is not None and out_dir.exists() and not config.force:
        raise CalibrationError(f"--out {out_dir} already exists (use --force to replace it)")
    corpus = open_corpus(config.corpus)
    if len(corpus.documents) < config.heldout_docs + 1:
        raise CalibrationError(
            f"--corpus {corpus.name} has {len(corpus.documents)} document(s); --heldout-docs {config.heldout_docs} "
            f"needs at least {config.heldout_docs + 1} ({config.heldout_docs} held out, the rest to fit)"
        )
    model_dir = resolve_model(config.model)
    hf_config = read_config(model_dir)
    num_layers = int(hf_config["num_hidden_layers"])
    config.check_splits(num_layers, f"model {model_dir}")
    placement = place(config.device)
    dtype = choose_dtype(config.dtype)  # said first, once the inputs are known to be valid
    if placement.stats_device.type == "cuda" and not dtype.chosen_by_user:
        dtype = DtypeChoice("bfloat16", "a CUDA device runs bfloat16 natively")
    accumulate, why = choose_accumulation(config.accumulate, placement.stats_device)
    log(dtype.line())
    log(placement.line())
    log(f"accumulation: {accumulate} ({why})")
    log(f"loading {model_dir} ({hf_config['architectures'][0]}, {num_layers} layers) in {dtype.dtype}")
    model, tokenizer, hf_config = load_model(model_dir, dtype.dtype, placement.device_map)
    d = int(hf_config["hidden_size"])
    kv_kinds = [k for k in config.kinds if map_kind(k).predicts_kv]
    if kv_kinds and recurrent_layers(model):
        raise CalibrationError(
            f"--kind/--kinds {','.join(kv_kinds)}: this hybrid model's Gated DeltaNet layers need their input, "
            "which maps of K and V do not give; fit residual or normalised maps"
        )
    run = {
        "model": _hf_fingerprint(model, hf_config),
        "tokenizer": tokenizer_fingerprint(tokenizer),
        "model_dir": str(pathlib.Path(model_dir).resolve()),
        "corpus": corpus.describe(),
        "splits": sorted(config.splits),
        "num_layers": num_layers,
        "d": d,
        "vocab": max(int(hf_config["vocab_size"]), len(tokenizer)),
        "kv_dim": kv_dim(model),
        "kinds": [kind for kind in MAP_KINDS if kind in config.kinds],
        "sink": sink_rule(),  # rows left out of the fit
        "doc_tokens": config.doc_tokens,
        "min_doc_tokens": config.min_doc_tokens,
        "heldout_docs": config.heldout_docs,
        "seed": config.seed,
        "dtype": dtype.dtype,
        "accumulate": accumulate,  # a pass resumes only with the products it started with
    }
    stats_dir = config.resolved_stats_dir
    state = _open_state(stats_dir, run, config.force, log)
    save = lambda s: s.save(stats_dir)  # noqa: E731
    timing = run_pass(model, tokenizer, corpus, state, config, save=save, log=log, device=placement.stats_device)
    check_enough_rows(state, corpus.name, config)
    pass_info = {**timing.as_dict(), "peak_memory_mib": round(peak_memory_mib(), 1)}
    log(
        f"pass: {timing.tokens} tokens this run, {pass_info['tokens_per_s']} tok/s; forward {timing.forward_s:.1f} s, "
        f"accumulation {timing.accumulate_s:.1f} s ({pass_info['accumulate_overhead']:.1%} of forward); "
        f"peak memory {pass_info['peak_memory_mib']:.0f} MiB"
    )
    log(f"statistics of kind(s) {', '.join(state.kinds)} for split(s) {', '.join(map(str, state.splits))} kept in {stats_dir}")
    return state, stats_dir, pass_info


def resolve(
    stats_dir: pathlib.Path,
    out_dir: pathlib.Path,
    lam: float | None,
    *,
    splits: tuple[int, ...] | None = None,
    kind: str = DEFAULT_KIND,
    quant: str = "bf16",
    group_size: int = 128,
    force: bool = False,
    log: Log = _stderr,
) -> CalibrationResult:
    """Re-solve saved statistics (another ``lam``, ``None`` = choose on held-out) into a new maps folder of
    map kind ``kind`` (one the statistics hold)."""
    stats_dir, out_dir = pathlib.Path(stats_dir), pathlib.Path(out_dir)
    if lam is not None and not lam > 0:
        raise CalibrationError(f"--lambda must be a positive number or 'auto', got {lam!r}")
    if out_dir.exists() and not force:
        raise CalibrationError(f"--out {out_dir} already exists (use --force to replace it)")
    state = load_stats(stats_dir)
    map_kind(kind)  # a known kind, or a ValueError naming the known ones
    if kind not in state.kinds:
        raise CalibrationError(
            f"--kind {kind}: the statistics in {stats_dir} hold kind(s) {', '.join(state.kinds)}, not {kind}; "
            f"accumulate it with `sgl-ridgefill calibrate stats ... --kinds {','.join((*state.kinds, kind))}`"
        )
    available = tuple(sorted(state.splits))
    splits = tuple(splits) if splits else available
    absent = [s for s in splits if s not in available]
    if absent:
        raise CalibrationError(
            f"--splits: the statistics in {stats_dir} cover split(s) {', '.join(map(str, available))}, "
            f"not {', '.join(map(str, absent))}"
        )
    if not state.progress["exhausted"] and state.progress["train"]["tokens"] == 0:
        raise CalibrationError(f"--stats {stats_dir}: the pass read no training tokens yet")
    return _solve_and_write(state, stats_dir, out_dir, lam, splits=splits, kind=kind, quant=quant,
                            group_size=group_size, force=force, extra={"_started": time.perf_counter()}, log=log)


def model_folder_fingerprints(model_dir: pathlib.Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(model, tokenizer)`` fingerprints of the HF folder ``model_dir``, as a maps folder records them.

    The model is loaded in bfloat16 (no matmul runs; the fingerprint rounds weights to bf16 anyway, so it is
    the same for any dtype the model is served or calibrated in)."""
    from .capture import load_model

    hf_model, tokenizer, hf_config = load_model(model_dir, "bfloat16")
    return _hf_fingerprint(hf_model, hf_config), tokenizer_fingerprint(tokenizer)


def fingerprint(maps_dir: pathlib.Path, model: str, *, force: bool = False, log: Log = _stderr) -> pathlib.Path:
    """Record the fingerprints of ``model`` (a folder or known name) in the existing maps folder ``maps_dir``.

    For folders written without a model fingerprint or before per-layer fingerprints. A fingerprint the
    folder already records must match the model, unless ``force``.
    """
    from sgl_ridgefill.models import resolve_model

    model_dir = resolve_model(model)
    model_fp, tokenizer_fp = model_folder_fingerprints(model_dir)
    try:
        warnings = refingerprint_maps_folder(maps_dir, model=model_fp, tokenizer=tokenizer_fp, force=force)
    except MapsError as exc:
        raise CalibrationError(str(exc)) from None
    for warning in warnings:
        log(f"checked against the folder's previous fingerprint: {warning}")
    log(f"recorded the fingerprints of {model_dir} in {maps_dir}")
    return pathlib.Path(maps_dir)


def _solve_and_write(
    state: StatsState,
    stats_dir: pathlib.Path,
    out_dir: pathlib.Path,
    lam: float | None,
    *,
    splits: tuple[int, ...],
    kind: str,
    quant: str,
    group_size: int,
    force: bool,
    extra: dict[str, Any],
    log: Log,
) -> CalibrationResult:
    progress = state.progress
    fits: dict[int, SplitFit] = {}
    maps = []
    for split in splits:
        start = time.perf_counter()
        train, heldout, heldout_all = (side[split, kind] for side in (state.train, state.heldout, state.heldout_all))
        exact = state.exact_kv[split] if map_kind(kind).predicts_kv else None
        fit = fit_split(train, heldout if heldout.rows else None, lam, kind=kind, exact=exact, heldout_all=heldout_all)
        fits[split] = fit
        sinks = {side: progress[side]["sinks"].get(str(split), 0) for side in ("train", "heldout")}
        log(f"split {split} ({kind}): solved in {time.perf_counter() - start:.1f} s; sink rows left out: "
            f"{sinks['train']} training, {sinks['heldout']} held-out")
        _log_scores(fit, log)
        maps.append(SplitMaps(split, fit.A, fit.b, fit.info(train.rows, heldout.rows, heldout_all.rows, sinks)))
    started = extra.pop("_started")
    calibration = {
        "corpus": {**state.run["corpus"], "read": progress["train_sources"], "heldout_read": progress["heldout_sources"]},
        "documents": progress["train"]["documents"],
        "tokens": progress["train"]["tokens"],
        "pieces": progress["train"]["pieces"],
        "longest_document_tokens": max(progress["train"]["longest"], progress["heldout"]["longest"]),
        "doc_tokens": state.run["doc_tokens"],
        **({"max_doc_pieces": extra.pop("max_doc_pieces")} if "max_doc_pieces" in extra else {}),
        "min_doc_tokens": state.run["min_doc_tokens"],
        "heldout_documents": progress["heldout"]["documents"],
        "heldout_tokens": progress["heldout"]["tokens"],
        "heldout_ids": progress["heldout_ids"],
        "read_ids": list(progress["done"]),  # every document the statistics pass read (eval leaves them out)
        "skipped_short_documents": len(progress["skipped_short"]),
        "corpus_exhausted": progress["exhausted"],
        "seed": state.run["seed"],
        "dtype": state.run["dtype"],
        "model_dir": state.run["model_dir"],
        **{k: v for k, v in extra.items() if v is not None},
    }
    try:
        write_maps_folder(
            out_dir, maps, model=state.run["model"], tokenizer=state.run["tokenizer"], quant=quant,
            group_size=group_size, default_split=splits[0], calibration=calibration,
            token_counts=state.token_counts, stats_dir=stats_dir, map_kind=kind, sink=state.run["sink"],
            calibration_dtype=state.run["dtype"], force=force,
        )
    except MapsError as exc:
        raise CalibrationError(str(exc)) from None
    log(f"wrote {out_dir} ({kind}, {quant}) in {time.perf_counter() - started:.1f} s since start; statistics kept in {stats_dir}")
    return CalibrationResult(out_dir, stats_dir, fits, calibration)


def _log_scores(fit: SplitFit, log: Log) -> None:
    how = "chosen on held-out documents" if fit.lam_chosen_on_heldout else "given"
    log(f"  lambda {fit.lam:g} ({how}), alpha {fit.alpha:.4g}")
    if fit.r2 is None:
        log("  no held-out documents: no scores")
        return
    nan = [float("nan")] * len(fit.r2)
    columns = (fit.r2, fit.r2_identity or nan, fit.r2_all or nan, fit.r2_identity_all or nan)
    log("         normal rows (sinks left out)   all rows")
    log("  layer   R2 ridge   R2 identity      R2 ridge   R2 identity")
    for offset, row in enumerate(zip(*columns)):
        log(f"  {fit.split + offset:5d}   {row[0]:8.4f}   {row[1]:11.4f}      {row[2]:8.4f}   {row[3]:11.4f}")
    means = [sum(c) / len(c) for c in columns]
    log(f"   mean   {means[0]:8.4f}   {means[1]:11.4f}      {means[2]:8.4f}   {means[3]:11.4f}")
