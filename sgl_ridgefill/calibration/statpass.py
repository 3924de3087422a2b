"""The statistics pass: read documents once through the unmodified model, accumulate, checkpoint.

Held-out documents are chosen first (whole documents, round-robin over the corpus's sources) and read
before any training document, so the scoring set does not depend on ``--max-tokens``. Only the first
``doc_tokens`` of a held-out document are read (scoring needs rows, not whole books). Training
documents follow, each source getting its weight's share of the tokens read (:class:`Mixer`), at most
``max_doc_pieces`` forward passes per document (so one long book cannot crowd out the rest), until
``max_tokens`` training tokens are read. Each piece adds to the statistics of every split and map kind
of the run (``targets.py``: features, targets, sink rows left out). Peak memory is the statistics plus one
forward pass's states and one upper layer's targets.

Statistics are checkpointed every ``checkpoint_seconds`` and at the end, always at a document
boundary, so re-running after an interruption resumes where the last checkpoint left off.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from typing import Any, Callable

import torch

from sgl_ridgefill.maps.kinds import map_kind

from .capture import capture_layer_inputs
from .config import CalibrationConfig, CalibrationError
from .corpus import Corpus, Document, Mixer, iter_pieces, pick_heldout
from .stats import StatsState, accumulation_dtype
from .targets import Accumulator, kv_projections


@dataclasses.dataclass
class PassTiming:
    """Seconds spent in this run (a resumed run counts only its own work)."""

    forward_s: float = 0.0
    accumulate_s: float = 0.0
    tokens: int = 0

    def as_dict(self) -> dict[str, float]:
        total = self.forward_s + self.accumulate_s
        return {
            "tokens": self.tokens,
            "forward_s": round(self.forward_s, 6),
            "accumulate_s": round(self.accumulate_s, 6),
            "tokens_per_s": round(self.tokens / total, 1) if total else 0.0,
            "accumulate_overhead": round(self.accumulate_s / self.forward_s, 4) if self.forward_s else 0.0,
        }


class _Tokens:
    """Token ids per document, memoised only for the few documents looked at twice (held-out picks)."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self._memo: dict[str, list[int]] = {}

    def __call__(self, doc: Document, *, keep: bool = False) -> list[int]:
        if doc.id in self._memo:
            return self._memo.pop(doc.id) if not keep else self._memo[doc.id]
        ids = self._tokenizer(doc.text(), add_special_tokens=True, verbose=False)["input_ids"]
        if keep:
            self._memo[doc.id] = ids
        return ids


def _progress_bar(enabled: bool, **kwargs: Any):
    import sys

    from tqdm.auto import tqdm

    # Redraw less often into logs than on a terminal.
    interval = 0.2 if sys.stderr.isatty() else 10.0
    return tqdm(disable=not enabled, unit="tok", unit_scale=True, dynamic_ncols=True, mininterval=interval, **kwargs)


@contextlib.contextmanager
def float32_products(device: torch.device | str):
    """Float32 products that are float32 on CUDA, not TF32 (which a process may have allowed)."""
    if torch.device(device).type != "cuda":
        yield
        return
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(previous)


def run_pass(
    model: torch.nn.Module,
    tokenizer: Any,
    corpus: Corpus,
    state: StatsState,
    config: CalibrationConfig,
    *,
    save: Callable[[StatsState], None],
    log: Callable[[str], None],
    device: torch.device | str = "cpu",
) -> PassTiming:
    """Accumulate statistics into ``state`` (resuming from its progress) on ``device``; calls ``save`` at
    checkpoints (which writes from host memory)."""
    with float32_products(device):
        return _run_pass(model, tokenizer, corpus, state, config, save=save, log=log, device=device)


def _run_pass(model, tokenizer, corpus, state, config, *, save, log, device) -> PassTiming:
    state.to(device)
    progress = state.progress
    splits, kinds = tuple(sorted(state.splits)), state.kinds
    num_layers = state.run["num_layers"]
    layers = sorted(set(splits) | set(range(min(splits), num_layers)))
    projections = kv_projections(model, layers) if any(map_kind(k).predicts_kv for k in kinds) else {}
    for split in splits if projections else ():
        state.exact_kv.setdefault(split, projections[split].exact_map())
    accumulator = Accumulator(kinds, projections, state.run["sink"], accumulation_dtype(state.run["accumulate"]))
    vocab = state.token_counts.numel()
    tokens = _Tokens(tokenizer)
    timing = PassTiming()
    order = corpus.ordered(config.seed)
    by_id = {doc.id: doc for doc in order}
    done = set(progress["done"])

    if not progress["heldout_ids"] and config.heldout_docs:
        chosen = pick_heldout(order, config.heldout_docs, lambda d: len(tokens(d, keep=True)) >= config.min_doc_tokens)
        if len(chosen) < config.heldout_docs:
            raise CalibrationError(
                f"--corpus {corpus.name}: only {len(chosen)} document(s) have at least --min-doc-tokens "
                f"{config.min_doc_tokens} tokens; --heldout-docs {config.heldout_docs} needs "
                f"{config.heldout_docs} of them, plus more to fit the maps"
            )
        progress["heldout_ids"] = [doc.id for doc in chosen]
    heldout_ids = set(progress["heldout_ids"])
    missing = [i for i in progress["heldout_ids"] if i not in by_id]
    if missing:
        raise CalibrationError(f"held-out document(s) {', '.join(missing[:3])} are no longer in the corpus; use --force")

    def consume(doc: Document, side: str, pieces: list[list[int]], bar) -> None:
        counters = progress[side]
        stats = state.heldout if side == "heldout" else state.train
        for piece in pieces:
            ids = torch.tensor(piece, dtype=torch.int64)
            start = time.perf_counter()
            states = {l: x.to(device) for l, x in capture_layer_inputs(model, ids, layers).items()}
            middle = time.perf_counter()
            for split in splits:
                every = {k: state.heldout_all[split, k] for k in kinds} if side == "heldout" else None
                sinks = accumulator.add(states, split, {k: stats[split, k] for k in kinds}, every)
                counters["sinks"][str(split)] = counters["sinks"].get(str(split), 0) + sinks
            state.token_counts += torch.bincount(ids, minlength=vocab)[:vocab]
            del states
            timing.forward_s += middle - start
            timing.accumulate_s += time.perf_counter() - middle
            timing.tokens += len(piece)
            counters["tokens"] += len(piece)
            counters["pieces"] += 1
            counters["longest"] = max(counters["longest"], len(piece))
            bar.update(len(piece))
        counters["documents"] += 1
        per_source = progress[f"{side}_sources"].setdefault(doc.source, {"documents": 0, "tokens": 0})
        per_source["documents"] += 1
        per_source["tokens"] += sum(len(p) for p in pieces)
        progress["done"].append(doc.id)
        done.add(doc.id)

    last_save = time.monotonic()

    def maybe_save() -> None:
        nonlocal last_save
        if time.monotonic() - last_save >= config.checkpoint_seconds:
            save(state)
            last_save = time.monotonic()

    todo = [by_id[i] for i in progress["heldout_ids"] if i not in done]
    if todo:
        with _progress_bar(config.progress, desc="held-out") as bar:
            for doc in todo:
                piece = tokens(doc)[: config.doc_tokens]
                consume(doc, "heldout", [piece], bar)
                maybe_save()

    train = progress["train"]
    budget_hit = train["tokens"] >= config.max_tokens
    read = {name: entry["tokens"] for name, entry in progress["train_sources"].items()}
    mixer = Mixer(corpus, config.seed, read, done | heldout_ids)
    with _progress_bar(config.progress, desc="calibrate", total=config.max_tokens, initial=min(train["tokens"], config.max_tokens)) as bar:
        while not budget_hit and (doc := mixer.next()) is not None:
            ids = tokens(doc)
            if len(ids) < config.min_doc_tokens:
                progress["skipped_short"].append([doc.id, len(ids)])
                progress["done"].append(doc.id)
                done.add(doc.id)
                continue
            pieces = []
            room = config.max_tokens - train["tokens"]
            for piece in iter_pieces(ids, config.doc_tokens, config.min_doc_tokens):
                if room <= 0 or len(pieces) == config.max_doc_pieces:
                    break
                pieces.append(piece)
                room -= len(piece)
            consume(doc, "train", pieces, bar)
            read[doc.source] = progress["train_sources"][doc.source]["tokens"]
            budget_hit = train["tokens"] >= config.max_tokens
            maybe_save()
    progress["exhausted"] = not budget_hit
    save(state)
    skipped = len(progress["skipped_short"])
    log(
        f"read {train['documents']} training documents ({train['tokens']} tokens) and {progress['heldout']['documents']} "
        f"held-out documents; {skipped} shorter than --min-doc-tokens {config.min_doc_tokens} skipped"
        + ("; the corpus ran out before --max-tokens" if progress["exhausted"] else "")
    )
    state.to("cpu")  # solving and saving read host memory
    return timing


def check_enough_rows(state: StatsState, corpus_name: str, config: CalibrationConfig) -> None:
    """A fit needs at least ``d_in`` training rows (of the widest kind); say why there are too few."""
    train = state.progress["train"]
    d = max(map_kind(kind).d_in(state.run["d"]) for kind in state.kinds)
    if train["tokens"] >= d:
        return
    skipped = state.progress["skipped_short"]
    detail = ""
    if skipped:
        examples = ", ".join(f"{doc_id}: {n} tokens" for doc_id, n in skipped[:3])
        detail = f"; {len(skipped)} document(s) were shorter than --min-doc-tokens {config.min_doc_tokens} ({examples})"
    raise CalibrationError(
        f"--corpus {corpus_name} is too small: {train['tokens']} training tokens from {train['documents']} "
        f"document(s){detail}; fitting d_in={d} needs at least {d} rows (100x that is recommended)"
    )
