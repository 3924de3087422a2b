"""Regenerate ``docs/RESULTS.md``: fit the maps, run ``sgl-ridgefill eval`` for each model, map kind and
split, copy each report next to it, and join them.

    python -m sgl_ridgefill.eval.results                 # everything (hours on a 2-core CPU; resumable)
    python -m sgl_ridgefill.eval.results --only qwen2.5-0.5b-s12
    python -m sgl_ridgefill.eval.results --only-group choose-split   # the map kind x split comparison
    python -m sgl_ridgefill.eval.results --list          # each run's status and its calibrate and eval commands
    python -m sgl_ridgefill.eval.results --report-only   # rewrite each run's report from its raw results
    python -m sgl_ridgefill.eval.results --render-only   # rejoin the reports already in docs/results/

Raw results (``results.jsonl``, server logs) are written under ``--runs-dir``; the repository keeps the reports,
plots, ``summary.json`` and the records (``results.jsonl``, for runs made since it was kept) under
``docs/results/<run>/``, so ``--report-only`` works on any machine and a run stopped on one resumes on another
from its records (its maps are fitted again there). Every step resumes where it stopped; the runs of
the ``choose-split`` group make the "map kind × split × rows" table (``tradeoff.py``), where a run not made
yet reads "not run".
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import shlex
import shutil
import subprocess
import sys

from ..cpu.dtype import DTYPES
from ..maps import kinds
from ..models.fetch import default_cache_dir
from ..tools import args as argtypes
from .domain import DOMAIN_R2
from .runner import RECORDS
from .tradeoff import PlannedRun

REPO_DOCS = pathlib.Path(__file__).resolve().parents[2] / "docs"
COMMAND = "python -m sgl_ridgefill.eval.results"
RAW = RECORDS  # a run's records; kept in the repository too, so a run resumes and reports anywhere
CALIBRATION_TOKENS = 200_000
RESIDUAL = kinds.DEFAULT_KIND  # the map kind of every maps folder written before kinds (manifest without map_kind)
MAP_KINDS = tuple(kinds.MAP_KINDS)
CHOOSE_SPLIT = "choose-split"  # the group of runs behind the map kind x split x rows table
QUESTION_BLIND = "question-blind"  # rows chosen without reading the question, against the question-aware ones
SELECTION_LAYERS = "selection-layers"  # how the rows are chosen on a deeper model: which lower layers, a reserve
CALIBRATION_DOMAIN = "calibration-domain"  # maps fitted on prose, code or both, measured on haystacks of each
LENGTH = "length"  # the quality preset at 16K and 32K, and maps fitted on documents as long as the prompts
LATER_QUESTIONS = "later-questions"  # questions asked second and third on a cached document, by reuse design
GROUPS = (CHOOSE_SPLIT, QUESTION_BLIND, SELECTION_LAYERS, CALIBRATION_DOMAIN, LENGTH, LATER_QUESTIONS)
BUILTIN = "builtin"


@dataclasses.dataclass(frozen=True)
class Run:
    name: str
    model: str
    splits: tuple[int, ...]  # the maps folder's splits (one calibration pass fits them all)
    split: int
    lengths: tuple[int, ...]
    extra: tuple[str, ...] = ()  # more `sgl-ridgefill eval` flags
    map_kind: str = RESIDUAL
    group: str = ""  # CHOOSE_SPLIT: a row of the map kind x split x rows table
    corpus: str = BUILTIN  # what the maps are fitted on: the builtin corpus, or a part of it (builtin:code)
    calibrate_extra: tuple[str, ...] = ()  # more `sgl-ridgefill calibrate` flags (then maps of their own)
    maps_tag: str = ""  # names the maps folder of a run with calibrate_extra

    def __post_init__(self) -> None:
        if bool(self.calibrate_extra) != bool(self.maps_tag):
            raise ValueError(f"run {self.name!r}: calibrate_extra and maps_tag go together (maps of their own, named)")
        if self.map_kind not in MAP_KINDS:
            raise ValueError(f"run {self.name!r}: map kind {self.map_kind!r} is not one of {', '.join(MAP_KINDS)}")
        if self.split not in self.splits:
            raise ValueError(f"run {self.name!r}: split {self.split} is not among its maps' splits {self.splits}")

    @property
    def rows_select(self) -> str | None:
        """The run's ``--rows-select`` (None: the reference attention selection)."""
        return self.extra[self.extra.index("--rows-select") + 1] if "--rows-select" in self.extra else None

    def _corpus_suffix(self) -> str:
        corpus = "" if self.corpus == BUILTIN else "-" + corpus_label(self.corpus)
        return corpus + (f"-{self.maps_tag}" if self.maps_tag else "")

    def maps_name(self) -> str:
        kind = "" if self.map_kind == RESIDUAL else self.map_kind.replace("+", "-") + "-"
        return f"{self.model}-{kind}s{'-'.join(map(str, self.splits))}-{CALIBRATION_TOKENS // 1000}k{self._corpus_suffix()}"

    def stats_name(self) -> str:
        return f"{self.model}-s{'-'.join(map(str, self.splits))}-{CALIBRATION_TOKENS // 1000}k{self._corpus_suffix()}"

    @property
    def shares_stats_pass(self) -> bool:
        """The choose-split runs and every run of another map kind share one statistics pass holding every map
        kind; the other residual runs calibrate in one command, which keeps its statistics beside the maps."""
        return self.group == CHOOSE_SPLIT or self.map_kind != RESIDUAL

    def own_stats(self, maps: pathlib.Path, stats: pathlib.Path) -> pathlib.Path:
        """Where the statistics behind ``maps`` are: ``stats`` (the shared pass), or where calibrate keeps them
        beside the maps."""
        from ..calibration.config import default_stats_dir

        return stats if self.shares_stats_pass else default_stats_dir(maps)

    def calibrate_commands(self, maps: pathlib.Path, stats: pathlib.Path, dtype: str | None = None) -> list[list[str]]:
        """The choose-split runs and every run of another map kind share one statistics pass holding every map
        kind (the same documents, so their text-haystack prompts pair across kinds), then fit their kind; the
        other residual runs calibrate in one. ``dtype``: the model's dtype in the pass (None: this CPU's)."""
        cli = [sys.executable, "-m", "sgl_ridgefill.cli", "calibrate"]
        common = ["--model", self.model, "--corpus", self.corpus, "--splits", ",".join(map(str, self.splits)),
                  "--max-tokens", str(CALIBRATION_TOKENS), *(("--dtype", dtype) if dtype else ()), *self.calibrate_extra]
        if not self.shares_stats_pass:
            return [[*cli, *common, "--out", str(maps), "--force"]]
        return [[*cli, "stats", *common, "--kinds", "all", "--stats", str(stats)],  # resumes; a no-op once done
                [*cli, "fit", "--stats", str(stats), "--kind", self.map_kind, "--out", str(maps), "--force"]]

    def eval_command(self, maps: pathlib.Path, out: pathlib.Path, *, report_only: bool = False,
                     exact_from: tuple[pathlib.Path, ...] = ()) -> list[str]:
        reuse = [a for folder in exact_from for a in ("--exact-from", str(folder))] if not report_only else []
        return [sys.executable, "-m", "sgl_ridgefill.cli", "eval", "--model", self.model, "--maps", str(maps),
                "--split", str(self.split), "--tail", str(TAIL), "--lengths", ",".join(map(str, self.lengths)),
                "--out", str(out), *self.extra, *reuse, *(("--report-only",) if report_only else ())]


# The shallower splits run the four main arms and the splices only, on fewer prompts, to fit a 2-core CPU.
_SHALLOW = ("--depths", "3", "--docs", "2", "--needle-arms", "exact,nofill,identity,ridgefill",
            "--loss-arms", "exact,nofill,identity,ridgefill,splice:keys,splice:values,splice:both,splice:key_norm")

# Longer prompts at half depth: the same reduced set at 8K, and one prompt per depth and haystack at 16K.
_LONG_16K = ("--depths", "1", "--docs", "1", "--needle-arms", "exact,nofill,identity,ridgefill",
             "--loss-arms", "exact,nofill,identity,ridgefill,splice:keys")

TAIL = 1024

# Choosing the split and the map kind: 96 filled-region samples per run (enough to tell a 5-point difference),
# paired across runs by sample. The reference (residual maps at split 12) and the best kind there (kv+context)
# also run the needle-row oracle, the random-rows control and the per-layer key splices (13-17, 18-23); the
# others the headline arms.
_QUALITY = ("--preset", "quality", "--needle-arms", "exact,ridgefill,ridgefill+rows",
            "--loss-arms", "exact,ridgefill,ridgefill+rows,splice:keys")
_QUALITY_DIAGNOSTICS = ("--preset", "quality",
                        "--needle-arms", "exact,ridgefill,ridgefill+rows,ridgefill+random,ridgefill+needle-rows,"
                                         "ridgefill+needle-random",
                        "--loss-arms", "exact,identity,ridgefill,ridgefill+rows,splice:keys")
# The needle-row oracle says the needles' own rows close the gap that attention-selected rows leave: the same
# 10 % budget with up to 2 % of it reserved for sentences sharing three or more words with the question.
LEXICAL_ROWS = ("attention_topk(q=64, share=10%, layers=[3, 7, 11]) budget 10% "
                "reserve lexical_net(min_shared=3) up to 2%")
_QUALITY_LEXICAL = ("--preset", "quality", "--needle-arms", "exact,ridgefill+rows",
                    "--loss-arms", "exact,ridgefill+rows", "--rows-select", LEXICAL_ROWS)
# Attention peaks on one or two tokens of a needle; pooling the scores over 8 rows either side brings the rest
# of the needle with its peak (selectors/attention.py), inside the same 10 % budget.
POOLED_ROWS = "attention_topk(q=64, share=10%, layers=[3, 7, 11], pool=8)"
_QUALITY_POOLED = ("--preset", "quality", "--needle-arms", "exact,ridgefill+rows",
                   "--loss-arms", "exact,ridgefill+rows", "--rows-select", POOLED_ROWS)
# The question's attention finds needles; key tokens anywhere in the tail need what the whole tail attends to. Half
# the budget may go to the rows the tail's 1,024 tokens attend to most, the rest to the question's.
POOLED_TAIL_ROWS = ("attention_topk(q=64, share=10%, layers=[3, 7, 11], pool=8) budget 10% "
                    "reserve attention_topk(q=1024, share=5%, layers=[3, 7, 11], pool=8) up to 5%")
_QUALITY_POOLED_TAIL = ("--preset", "quality", "--needle-arms", "exact,ridgefill+rows",
                        "--loss-arms", "exact,ridgefill+rows", "--rows-select", POOLED_TAIL_ROWS)
# pool=8 was chosen by the attention the 96 prompts of the niah_single/niah_multikey grid give the needle rows;
# the other two needle tasks (four needles to find, four values or four keys) are fresh prompts for it.
_QUALITY_POOLED_FRESH = ("--preset", "quality", "--tasks", "niah_multivalue,niah_multiquery",
                         "--needle-arms", "exact,ridgefill,ridgefill+rows", "--loss-arms", "exact", "--rows-select", POOLED_ROWS)
# Later questions on a cached document (namespace cache mode): the niah_multikey prompts asked first, and asked
# second or third after questions about the document's other keys filled it and chose its rows (the shipped
# rows policy's selection, which reads the question). The first run is from before later questions chose their
# rows again over the cached document (they kept the first question's); the -reselect run is the same after.
_LATER = ("--tasks", "niah_multikey", "--depths", "5", "--seeds", "4", "--docs", "0",
          "--needle-arms", "exact,ridgefill+rows,ridgefill+rows@q2,ridgefill+rows@q3", "--rows-select", POOLED_TAIL_ROWS)
# Rows chosen without the question (a cache that serves several questions chooses them before it knows the
# next one): the paper's control, the attention of the 64 tokens before the tail, and the same with up to 3 % of
# the prefix for digit tokens (numbers are rare and often what is asked for); against the shipped selection,
# which reads the question, on the same 96 filled-region samples (the exact arm runs once, in the first).
BLIND_ROWS = 'attention_topk(q=64, share=10%, layers=[3, 7, 11], query="before_tail", pool=8)'
BLIND_DIGITS_ROWS = BLIND_ROWS + " budget 10% reserve digits() up to 3%"


def _selection_flags(rows_select: str, *, exact: bool, bare: bool = False, rows: bool = True) -> tuple[str, ...]:
    """The quality preset's needle samples (no documents) with the rows arm choosing its rows by ``rows_select``;
    the exact arm only in the run that holds it for its group, the bare fill where ``bare``, the rows arm unless
    ``rows`` is false (``rows_select`` is then still recorded, as a run resumed without its rows arm compares it)."""
    arms = ",".join(a for a, on in (("exact", exact), ("ridgefill", bare), ("ridgefill+rows", rows)) if on)
    return ("--preset", "quality", "--docs", "0", "--needle-arms", arms, "--rows-select", rows_select)


_AWARE = _selection_flags(POOLED_TAIL_ROWS, exact=True, bare=True)
_BLIND = _selection_flags(BLIND_ROWS, exact=True)
_BLIND_DIGITS = _selection_flags(BLIND_DIGITS_ROWS, exact=True)
_QWEN_SPLITS = (12, 14, 16)  # one calibration pass: sgl-ridgefill calibrate --splits 12,14,16
_SMOL_SPLITS = (15,)


def pooled_tail_rows(layers: tuple[int, ...]) -> str:
    """The shipped rows selection (:data:`POOLED_TAIL_ROWS`) reading the attention of ``layers``."""
    return POOLED_TAIL_ROWS.replace("layers=[3, 7, 11]", f"layers=[{', '.join(map(str, layers))}]")


# The calibration's domain: residual maps at split 12 fitted on the builtin mix, on its code alone (the Python
# standard library) and on its prose alone (the King James Bible and the Python documentation), each measured on
# haystacks of prose and of code (96 filled-region samples) and scored on the other passes' held-out rows
# (`calibrate score`: DOMAIN_R2 beside each report).
_DOMAIN = ("--preset", "quality", "--haystacks", "text,code", "--docs", "0", "--needle-arms", "exact,ridgefill")
DOMAIN_CORPORA = (BUILTIN, "builtin:code", "builtin:prose")


def corpus_label(corpus: str) -> str:
    """A corpus spec in a run's or a maps folder's name: ``mix`` for the whole builtin corpus, ``code`` for
    ``builtin:code``, ``kjv-code`` for ``builtin:kjv,code``."""
    return "mix" if corpus == BUILTIN else corpus.removeprefix(BUILTIN + ":").replace(",", "-")


def _domain_name(corpus: str) -> str:
    return f"qwen2.5-0.5b-s12-domain-{corpus_label(corpus)}-q"


# Length: the quality preset's 96 filled-region samples at 16K, and 48 (four depths) at 32K, the longest prompt
# Qwen2.5-Coder-0.5B's 32K context holds with room for the answer; exact, the bare fill and the shipped rows
# selection. The maps are fitted on pieces of at most 2,048 tokens; the same at 16K with maps fitted on whole
# pieces of up to 16,384 tokens (one per document) says what longer calibration documents change.
_LENGTH = _selection_flags(POOLED_TAIL_ROWS, exact=True, bare=True)
# The shipped rows policy runs prompts of 12,288 tokens or more at split 14 (``split 14 from 12288 tokens``, after
# the 16K runs below), so at 32K: exact and the bare fill (the default policy, split 12) at split 12, whose rows
# arm stopped after its first 11 samples, and the shipped rows at split 14 in a run of their own, paired with them.
_LENGTH_32K = (*_selection_flags(POOLED_TAIL_ROWS, exact=True, bare=True, rows=False), "--depths", "4")
_LENGTH_32K_ROWS = (*_selection_flags(POOLED_TAIL_ROWS, exact=False), "--depths", "4")
# Key-token loss at 16K for the same three arms on 8 held-out documents of the builtin corpus (at 16K tokens, books
# of the King James Bible); the needle grid's exact arm comes from qwen2.5-0.5b-s12-16k-q (same maps, same prompts).
_LENGTH_LOSS = ("--preset", "quality", "--docs", "8", "--needle-arms", "exact",
                "--loss-arms", "exact,ridgefill,ridgefill+rows", "--rows-select", POOLED_TAIL_ROWS)
_LONG_DOCS = ("--doc-tokens", "16384", "--max-doc-pieces", "1", "--min-doc-tokens", "4096")


# SmolLM2-135M has 30 layers: the shipped selection reads layers 3, 7 and 11 (chosen on the 24-layer Qwen); the
# same selection from layers spread below its split 15 and from the three just below it, on the same 96
# filled-region samples (kv+context maps, the exact arm once).
SMOL_LAYER_SETS = ((3, 7, 11), (4, 9, 14), (8, 11, 14))
# Every layer set above left the needle partly filled in about half of the prompts (those scored 16 against 85 for
# the rest): the shipped selection (layers 3, 7 and 11) with up to 3 % of the prefix reserved inside the same 10 %
# budget, for digit tokens (the reserve that brought the question-blind selection on Qwen to the question-aware
# one's score; the needles' values are numbers) or for the sentences that share words with the question
# (lexical_net, as the Qwen3.8-27B policy reserves).
RESERVES = {"digits": "digits() up to 3%", "lexical": "lexical_net() up to 3%"}


def reserve_rows(reserve: str) -> str:
    """The shipped selection reading layers 3, 7 and 11 with one of :data:`RESERVES` inside its budget."""
    return POOLED_TAIL_ROWS + " reserve " + RESERVES[reserve]


# Qwen2.5-Coder-1.5B has 28 layers: at 4K the shipped selection (layers 3, 7 and 11) missed 3 of 96 filled-region
# needles, all niah_multikey in text. The same selection from layers at the same relative depths below its split
# 14, and from the three just below it; the rows arm only, beside the exact arm of qwen2.5-1.5b-s14-q (same
# prompts, same group).
QWEN_1_5B_LAYER_SETS = ((3, 8, 13), (11, 12, 13))
# Layers 3/8/13 did no better (93.8): the shipped layers with the lexical reserve that held SmolLM2's prose needles
# whole (:data:`RESERVES`). Its first measurement (96.9, the same three needles missed as without it) read Qwen's
# "forasmuch|-kernel" as one word, so the needle shared three words with the question, not four; its rows arm is
# measured again with a token opening with punctuation starting a word (the whole needle in each of the 48 prose
# prompts, by the offline count on their tokens and float32 attention).
QWEN_1_5B_RESERVES = ("lexical",)
# It held every one of them (100.0, paired with exact +0.0): the reserve the shipped policy carries.
QWEN_1_5B_SHIPPED_RESERVE = "lexical"
# Two of the three needles both missed were held in part (17 of 20 and 8 of 23 rows: the number's last digits
# beyond the pool's window; the third not at all). The shipped selection with every sentence of up to 32 tokens
# taken whole behind its peak, in both of its rankings (attention_topk's sentence); whole sentences cost rows,
# so a needle the question attends to less may be left out. It missed the same three (96.9): one needle left out
# whole (0 of its 20 rows, 17 before), one held in part as before, one not at all.
SENTENCE_TOKENS = 32


def sentence_rows() -> str:
    """The shipped selection (:data:`POOLED_TAIL_ROWS`) taking every sentence of up to :data:`SENTENCE_TOKENS`
    tokens whole behind its peak."""
    return POOLED_TAIL_ROWS.replace("pool=8)", f"pool=8, sentence={SENTENCE_TOKENS})")


# Half depth and one shallower split for the Qwen2-family 0.5B (24 layers, no QK-norm) and SmolLM2-135M
# (Llama family, 30 layers, 8K context); T = 1024. Then the split and map-kind comparison on the 0.5B.
RUNS = (
    Run("qwen2.5-0.5b-s12", "qwen2.5-coder-0.5b", (6, 12), 12, (4096,)),
    Run("smollm2-135m-s15", "smollm2-135m", (8, 15), 15, (4096,)),
    Run("smollm2-135m-s8", "smollm2-135m", (8, 15), 8, (4096,), _SHALLOW),
    Run("qwen2.5-0.5b-s6", "qwen2.5-coder-0.5b", (6, 12), 6, (4096,), _SHALLOW),
    Run("qwen2.5-0.5b-s12-8k", "qwen2.5-coder-0.5b", (6, 12), 12, (8192,), _SHALLOW),
    Run("qwen2.5-0.5b-s12-16k", "qwen2.5-coder-0.5b", (6, 12), 12, (16384,), _LONG_16K),
    Run("qwen2.5-0.5b-s12-later-q", "qwen2.5-coder-0.5b", (6, 12), 12, (4096,), _LATER),
    # The same prompts on the server whose later questions choose their rows again over the cached document
    # (run before the exact upgrade existed: as with --upgrade-rows 0).
    Run("qwen2.5-0.5b-s12-later-reselect-q", "qwen2.5-coder-0.5b", (6, 12), 12, (4096,), _LATER,
        group=LATER_QUESTIONS),
    # And with the exact upgrade: each first question rewrites the document exactly while it decodes alone.
    Run("qwen2.5-0.5b-s12-later-upgrade-q", "qwen2.5-coder-0.5b", (6, 12), 12, (4096,),
        _LATER + ("--upgrade-rows", "512"), group=LATER_QUESTIONS),
    # A second real model, Qwen2.5-Coder-1.5B (28 layers, d = 1,536) at half depth, exact, the bare fill and rows:
    # at 4K the 0.5B's selection, at 8K the one its shipped policy qwen2.5-1.5b-rows makes (the same with the
    # lexical reserve the 4K selection-layers runs chose).
    Run("qwen2.5-1.5b-s14-q", "qwen2.5-coder-1.5b", (14,), 14, (4096,),
        _selection_flags(POOLED_TAIL_ROWS, exact=True, bare=True), group=SELECTION_LAYERS),
    Run("qwen2.5-1.5b-s14-8k-q", "qwen2.5-coder-1.5b", (14,), 14, (8192,),
        _selection_flags(reserve_rows(QWEN_1_5B_SHIPPED_RESERVE), exact=True, bare=True)),
    Run("qwen2.5-0.5b-s12-aware-q", "qwen2.5-coder-0.5b", (6, 12), 12, (4096,), _AWARE, group=QUESTION_BLIND),
    Run("qwen2.5-0.5b-s12-blind-q", "qwen2.5-coder-0.5b", (6, 12), 12, (4096,), _BLIND, group=QUESTION_BLIND),
    Run("qwen2.5-0.5b-s12-blind-digits-q", "qwen2.5-coder-0.5b", (6, 12), 12, (4096,), _BLIND_DIGITS,
        group=QUESTION_BLIND),
    # SmolLM2's context is 8,192 tokens: its longest prompts leave room for the answer.
    Run("smollm2-135m-s15-8k", "smollm2-135m", (8, 15), 15, (8064,), _SHALLOW),
    Run("qwen2.5-0.5b-residual-s12-q", "qwen2.5-coder-0.5b", _QWEN_SPLITS, 12, (4096,), _QUALITY_DIAGNOSTICS,
        group=CHOOSE_SPLIT),
    Run("qwen2.5-0.5b-residual-s14-q", "qwen2.5-coder-0.5b", _QWEN_SPLITS, 14, (4096,), _QUALITY, group=CHOOSE_SPLIT),
    Run("qwen2.5-0.5b-residual-s16-q", "qwen2.5-coder-0.5b", _QWEN_SPLITS, 16, (4096,), _QUALITY, group=CHOOSE_SPLIT),
    *(Run(f"qwen2.5-0.5b-{kind.replace('+', '-')}-s12-q", "qwen2.5-coder-0.5b", _QWEN_SPLITS, 12, (4096,),
          _QUALITY_DIAGNOSTICS if kind == "kv+context" else _QUALITY, map_kind=kind, group=CHOOSE_SPLIT)
      for kind in MAP_KINDS[1:]),
    Run("qwen2.5-0.5b-kv-context-s12-lexical-q", "qwen2.5-coder-0.5b", _QWEN_SPLITS, 12, (4096,), _QUALITY_LEXICAL,
        map_kind="kv+context", group=CHOOSE_SPLIT),
    Run("qwen2.5-0.5b-kv-context-s12-pooled-q", "qwen2.5-coder-0.5b", _QWEN_SPLITS, 12, (4096,), _QUALITY_POOLED,
        map_kind="kv+context", group=CHOOSE_SPLIT),
    Run("qwen2.5-0.5b-kv-context-s12-pooled-fresh-q", "qwen2.5-coder-0.5b", _QWEN_SPLITS, 12, (4096,),
        _QUALITY_POOLED_FRESH, map_kind="kv+context", group=CHOOSE_SPLIT),
    Run("qwen2.5-0.5b-kv-context-s12-pooled-tail-q", "qwen2.5-coder-0.5b", _QWEN_SPLITS, 12, (4096,),
        _QUALITY_POOLED_TAIL, map_kind="kv+context", group=CHOOSE_SPLIT),
    Run("qwen2.5-0.5b-residual-s12-pooled-q", "qwen2.5-coder-0.5b", _QWEN_SPLITS, 12, (4096,), _QUALITY_POOLED,
        group=CHOOSE_SPLIT),
    # SmolLM2-135M at half depth: the paper's map finds no filled-region needle there; the context kind against it.
    Run("smollm2-135m-residual-s15-q", "smollm2-135m", _SMOL_SPLITS, 15, (4096,), _QUALITY, group=CHOOSE_SPLIT),
    Run("smollm2-135m-kv-context-s15-q", "smollm2-135m", _SMOL_SPLITS, 15, (4096,), _QUALITY, map_kind="kv+context",
        group=CHOOSE_SPLIT),
    Run("smollm2-135m-kv-context-s15-pooled-q", "smollm2-135m", _SMOL_SPLITS, 15, (4096,), _QUALITY_POOLED,
        map_kind="kv+context", group=CHOOSE_SPLIT),
    *(Run(f"smollm2-135m-kv-context-s15-l{'-'.join(map(str, layers))}-q", "smollm2-135m", _SMOL_SPLITS, 15, (4096,),
          _selection_flags(pooled_tail_rows(layers), exact=i == 0), map_kind="kv+context", group=SELECTION_LAYERS)
      for i, layers in enumerate(SMOL_LAYER_SETS)),
    *(Run(f"smollm2-135m-kv-context-s15-l3-7-11-{reserve}-q", "smollm2-135m", _SMOL_SPLITS, 15, (4096,),
          _selection_flags(reserve_rows(reserve), exact=False), map_kind="kv+context", group=SELECTION_LAYERS)
      for reserve in RESERVES),
    *(Run(f"qwen2.5-1.5b-s14-l{'-'.join(map(str, layers))}-q", "qwen2.5-coder-1.5b", (14,), 14, (4096,),
          _selection_flags(pooled_tail_rows(layers), exact=False), group=SELECTION_LAYERS)
      for layers in QWEN_1_5B_LAYER_SETS),
    *(Run(f"qwen2.5-1.5b-s14-l3-7-11-{reserve}-q", "qwen2.5-coder-1.5b", (14,), 14, (4096,),
          _selection_flags(reserve_rows(reserve), exact=False), group=SELECTION_LAYERS)
      for reserve in QWEN_1_5B_RESERVES),
    Run("qwen2.5-1.5b-s14-l3-7-11-sentence-q", "qwen2.5-coder-1.5b", (14,), 14, (4096,),
        _selection_flags(sentence_rows(), exact=False), group=SELECTION_LAYERS),
    *(Run(_domain_name(corpus), "qwen2.5-coder-0.5b", (12,), 12, (4096,), _DOMAIN, group=CALIBRATION_DOMAIN,
          corpus=corpus) for corpus in DOMAIN_CORPORA),
    Run("qwen2.5-0.5b-s12-16k-q", "qwen2.5-coder-0.5b", (6, 12), 12, (16384,), _LENGTH, group=LENGTH),
    Run("qwen2.5-0.5b-s12-16k-longdocs-q", "qwen2.5-coder-0.5b", (12,), 12, (16384,), _LENGTH, group=LENGTH,
        calibrate_extra=_LONG_DOCS, maps_tag="docs16k"),
    Run("qwen2.5-0.5b-s12-32k-q", "qwen2.5-coder-0.5b", (6, 12), 12, (32640,), _LENGTH_32K, group=LENGTH),
    Run("qwen2.5-0.5b-s14-32k-q", "qwen2.5-coder-0.5b", (14,), 14, (32640,), _LENGTH_32K_ROWS, group=LENGTH),
    Run("qwen2.5-0.5b-s12-16k-loss-q", "qwen2.5-coder-0.5b", (6, 12), 12, (16384,), _LENGTH_LOSS, group=LENGTH),
    # The 16K misses with the shipped selection: one needle held in part (20 of 21 rows), two held whole yet
    # answered with another key's number; the sentence selection's rows arm on the same prompts.
    Run("qwen2.5-0.5b-s12-16k-sentence-q", "qwen2.5-coder-0.5b", (6, 12), 12, (16384,),
        _selection_flags(sentence_rows(), exact=False), group=LENGTH),
    # The other two held every needle whole. One of them (text/4/1), run again in float32 on an AVX2 CPU with the
    # shipped split-12 maps, answers right with its own needle exact and with a later key's number once the other
    # keys' needles are exact too (256 rows either side of each needle exact as well); at split 14 or 16 (maps from
    # 50K tokens) the shipped rows, the bare fill and every needle exact each answer it right. The shipped
    # selection's rows arm at split 14 on the same prompts.
    Run("qwen2.5-0.5b-s14-16k-q", "qwen2.5-coder-0.5b", (14,), 14, (16384,),
        _selection_flags(POOLED_TAIL_ROWS, exact=False), group=LENGTH),
    # Split 14 answered all three right (97.9, exact's score, paired +0.0), at a lower speed bound (1.54x against
    # 1.73x at 16K); the shipped rows policy now runs prompts of 12,288 tokens or more there. Whether the shipped
    # split could have: the needle held in part is the kind of miss the lexical reserve held whole on the 1.5B at
    # 4K (every prose niah_multikey needle), so the shipped split-12 selection with that reserve inside its 10 %
    # budget (what qwen2.5-1.5b-rows ships), the rows arm on the 16K run's prompts and maps.
    # Not run yet, and read beforehand from the prompts alone (no model): on the five prompts split 12 or exact
    # answered wrongly, lexical_net nominates the whole needle (21 of 21 rows) and none of the other keys' needles
    # (they share two of the question's words, under its four), while four of those five wrong answers are another
    # key's value; so it can fix the needle held in part (text/3/0), not the keys told apart wrongly.
    Run("qwen2.5-0.5b-s12-16k-lexical-q", "qwen2.5-coder-0.5b", (6, 12), 12, (16384,),
        _selection_flags(reserve_rows(QWEN_1_5B_SHIPPED_RESERVE), exact=False), group=LENGTH),
)


def exact_sources(run: Run, runs: tuple[Run, ...], runs_dir: pathlib.Path,
                  docs: pathlib.Path = REPO_DOCS) -> tuple[pathlib.Path, ...]:
    """The result folders made so far of ``run``'s group siblings on the same model (here, else the records
    the repository keeps): they share their prompts and dtype, so the exact arm runs once per model and group
    (``sgl-ridgefill eval --exact-from``)."""
    if not run.group:
        return ()
    found = []
    for other in runs:
        if other.group == run.group and other.model == run.model and other.name != run.name:
            found += [d for d in (runs_dir / other.name, docs / "results" / other.name) if (d / RAW).exists()][:1]
    return tuple(found)


def planned(runs: tuple[Run, ...], docs: pathlib.Path, group: str = CHOOSE_SPLIT) -> list[PlannedRun]:
    """The rows of the map kind x split x rows table: each run of ``group`` at each of its lengths."""
    return [PlannedRun(run.name, run.model, run.map_kind, run.split, length, docs / "results" / run.name,
                       run.rows_select)
            for run in runs if run.group == group for length in run.lengths]


def run_status(run: Run, runs_dir: pathlib.Path, docs: pathlib.Path) -> str:
    """What is left of ``run``: not started, started (its requests done of those planned and about how long the
    rest take at its pace so far; its records, for a run from before plans were recorded), or reported."""
    results = runs_dir / run.name / RAW
    if not results.exists():
        kept = docs / "results" / run.name / RAW
        if kept.exists():
            return _records_left(kept, kept=True)
        reported = (docs / "results" / run.name / "REPORT.md").exists()
        return "reported; raw results not on this machine" if reported else "not started"
    report = runs_dir / run.name / "REPORT.md"
    if report.exists() and report.stat().st_mtime >= results.stat().st_mtime:
        return f"done: {sum(1 for _ in results.open())} records, reported"
    return "started: " + _records_left(results, kept=False)


def _records_left(path: pathlib.Path, *, kept: bool) -> str:
    """``6 of 336 requests (330 left, about 3.3 h at 36 s each; rerun to resume)``, or the records counted."""
    from ..cpu import dtype as cpu_dtype
    from .analysis import load_records, meta_record, progress

    where, then = (" kept in the repository", "rerun to resume or finish") if kept else ("", "rerun to resume")
    try:
        records = load_records(path)
        done = progress(records)
    except ValueError as exc:  # --list goes on to the other runs; the eval itself refuses the file
        done, then = None, f"{then}; unreadable: {exc}"
    if done is None:
        return f"{sum(1 for _ in path.open())} records{where or ' so far'} ({then})"
    left = max(done["requests"] - done["done"], 0)
    pace = done["pace"]
    about = "" if pace is None or not left else f", about {_duration(left * pace)} at {pace:.0f} s each"
    meta = meta_record(records)
    if about and meta.get("dtype") == "bfloat16" and not cpu_dtype.native_bf16():
        # A resumed run keeps its dtype (``sgl-ridgefill eval``): here its matmuls run through float32.
        where_paced = f"{meta['cpu']} ({meta.get('cpu_capability')})" if meta.get("cpu") else "the recording CPU"
        about += (f", {where_paced}'s pace: this CPU has no native bfloat16 and runs the run's bfloat16 matmuls "
                  f"through float32, ~{cpu_dtype.SLOWDOWN_WITHOUT_NATIVE}x its own float32's time")
    return f"{done['done']} of {done['requests']} requests{where} ({left} left{about}; {then})"


def recorded_dtype(run: Run, runs_dir: pathlib.Path, docs: pathlib.Path) -> str | None:
    """The dtype ``run``'s records were measured in (its results here, else those the repository keeps), or for a
    run not started the one its siblings' exact arm was measured in (``sgl-ridgefill eval`` runs in it too):
    maps fitted for it are fitted in that dtype. None: this CPU's."""
    from .shared_exact import source_dtype

    own = [d for d in (runs_dir / run.name, docs / "results" / run.name) if (d / RAW).exists()][:1]
    dtype = source_dtype(own or exact_sources(run, RUNS, runs_dir, docs))
    return dtype if dtype in DTYPES else None


def _duration(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds < 90 * 60 else f"{seconds / 3600:.1f} h"


def _sh(cmd: list[str], *, ok: tuple[int, ...] = (0,)) -> None:
    print("+ " + shlex.join(cmd), flush=True)
    done = subprocess.run(cmd)
    if done.returncode not in ok:
        raise subprocess.CalledProcessError(done.returncode, cmd)


# `sgl-ridgefill eval` exits 3 when the stock check failed or never ran (a run stopped before it): its report
# says so, and rewriting reports from partial results goes on.
_NO_CHECK = 3


def run_one(run: Run, runs_dir: pathlib.Path, docs: pathlib.Path, *, report_only: bool = False) -> pathlib.Path | None:
    """Run (or resume) one evaluation and copy its report to ``docs/results/<run>/``; with ``report_only``,
    rewrite the report from the raw results alone (None when the run has none yet)."""
    maps = runs_dir / "maps" / run.maps_name()
    out = runs_dir / run.name
    target = docs / "results" / run.name
    kept = target / RAW
    if kept.exists() and not (out / RAW).exists():  # a run started on another machine resumes from its records
        out.mkdir(parents=True, exist_ok=True)
        shutil.copy2(kept, out / RAW)
    if report_only and not (out / RAW).exists():
        print(f"{run.name}: no results under {out} yet; skipped", flush=True)
        return None
    if not report_only and not (maps / "manifest.json").exists():
        stats = runs_dir / "stats" / run.stats_name()
        for cmd in run.calibrate_commands(maps, stats, recorded_dtype(run, runs_dir, docs)):
            _sh(cmd)
    if run.group == CALIBRATION_DOMAIN and (maps / "manifest.json").exists():
        target.mkdir(parents=True, exist_ok=True)
        write_domain_scores(run, maps, runs_dir, target / DOMAIN_R2)
    command = run.eval_command(maps, out, report_only=report_only, exact_from=exact_sources(run, RUNS, runs_dir, docs))
    _sh(command, ok=(0, _NO_CHECK) if report_only else (0,))
    target.mkdir(parents=True, exist_ok=True)
    for f in out.iterdir():
        if f.suffix in (".md", ".png") or f.name in ("summary.json", "eval-rows.rfpolicy", RAW):
            shutil.copy2(f, target / f.name)
    return target


def write_domain_scores(run: Run, maps: pathlib.Path, runs_dir: pathlib.Path, path: pathlib.Path) -> dict:
    """``run``'s maps scored on the held-out rows of every calibration-domain pass made so far (its own and
    its siblings'), kept beside its report; a sibling not calibrated yet is left out until a later run."""
    from ..calibration.score import score_maps
    from ..calibration.stats import STATS_FILE

    scores = json.loads(path.read_text()) if path.exists() else {}
    for other in RUNS:
        if other.group != CALIBRATION_DOMAIN or other.corpus in scores:
            continue
        other_maps = runs_dir / "maps" / other.maps_name()
        stats = other.own_stats(other_maps, runs_dir / "stats" / other.stats_name())
        if (stats / STATS_FILE).exists():
            result = score_maps(maps, stats, splits=(run.split,))["splits"][str(run.split)]
            scores[other.corpus] = {"mean_r2": result["mean_r2"], "mean_r2_identity": result["mean_r2_identity"],
                                    "heldout_rows": result["heldout_rows"]}
    path.write_text(json.dumps(dict(sorted(scores.items())), indent=1) + "\n")
    return scores


def main(argv: list[str] | None = None) -> int:
    parser = argtypes.command_parser(COMMAND.removeprefix("python -m "), __doc__)
    parser.add_argument("--runs-dir", type=pathlib.Path, default=default_cache_dir().parent / "eval",
                        help="raw results and maps (default ~/.cache/sgl-ridgefill/eval)")
    parser.add_argument("--docs", type=pathlib.Path, default=REPO_DOCS, help="where RESULTS.md and results/ go")
    parser.add_argument("--only", default=None, help=f"comma-separated run names ({', '.join(r.name for r in RUNS)})")
    parser.add_argument("--only-group", default=None, choices=GROUPS,
                        help="the runs of one group (choose-split: the map kind x split x rows comparison; "
                             "question-blind: rows chosen without the question against the shipped selection; "
                             "selection-layers: which layers choose the rows on SmolLM2's 30 and on "
                             "Qwen2.5-Coder-1.5B's 28)")
    parser.add_argument("--list", action="store_true", help="print each run's calibrate and eval commands; run nothing")
    parser.add_argument("--report-only", action="store_true",
                        help="rewrite each run's report from its raw results (no requests), then join them")
    parser.add_argument("--render-only", action="store_true", help="only join the reports already under DOCS/results")
    args = parser.parse_args(argv)
    names = [r.name for r in RUNS]
    chosen = RUNS if args.only is None else tuple(r for r in RUNS if r.name in args.only.split(","))
    unknown = set((args.only or "").split(",")) - set(names) - {""}
    if unknown:
        parser.error(f"unknown run(s) {', '.join(sorted(unknown))}; known: {', '.join(names)}")
    if args.only_group:
        chosen = tuple(r for r in chosen if r.group == args.only_group)
    if args.report_only and args.render_only:
        parser.error("--report-only and --render-only: pick one")
    if args.list:
        for run in chosen:
            maps = args.runs_dir / "maps" / run.maps_name()
            stats = args.runs_dir / "stats" / run.stats_name()
            command = run.eval_command(maps, args.runs_dir / run.name, exact_from=exact_sources(run, RUNS, args.runs_dir, args.docs))
            print(f"# {run.name} ({run_status(run, args.runs_dir, args.docs)})\n"
                  + "\n".join(shlex.join(c) for c in run.calibrate_commands(
                      maps, stats, recorded_dtype(run, args.runs_dir, args.docs))) + "\n"
                  f"{shlex.join(command)}")
        return 0
    if not args.render_only:
        for run in chosen:
            run_one(run, args.runs_dir, args.docs, report_only=args.report_only)
    from .results_md import render_results_md

    present = [args.docs / "results" / n for n in names if (args.docs / "results" / n / "REPORT.md").exists()]
    if not present:
        print("no reports under docs/results yet", file=sys.stderr)
        return 1
    domain = [(run.corpus, plan) for run in RUNS for plan in planned((run,), args.docs, CALIBRATION_DOMAIN)]
    path = render_results_md(present, args.docs / "RESULTS.md", COMMAND, comparison=planned(RUNS, args.docs),
                             domain=domain)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
