"""Run an evaluation against a RidgeFill server: the stock check, needle tasks and long-document loss,
every arm on every prompt, appended to a resumable JSONL file (records: ``analysis.py``).

Requests go one at a time, every arm of a prompt before the next prompt, and the radix cache is emptied
before each, so no arm extends another arm's cached prefix (an exact prefix would leave RidgeFill nothing
to fill).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import pathlib
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from . import arms as A
from .arms import RIDGEFILL

RECORDS = "results.jsonl"  # a run's records, in its --out folder (and kept beside its report)
CHECK_NEW_TOKENS = 8
TOP_LOGPROBS = 20  # for decoding agreement (KL over the exact arm's top 20, metrics.kl_topk)


class Client(Protocol):
    """What the runner sends requests through: ``tools.client.BenchClient`` (a server) or
    ``engine_client.EngineClient`` (an offline engine)."""

    def flush_cache(self) -> None: ...

    def generate(self, body: dict[str, Any]) -> dict[str, Any]: ...


@dataclasses.dataclass(frozen=True)
class EvalPlan:
    split: int
    tail: int
    lengths: tuple[int, ...]
    needle_arms: tuple[str, ...]
    loss_arms: tuple[str, ...]
    longtail: dict[int, int]  # length -> tail of the nofill+longtail arm
    upgrade_rows: int = 0  # the server's exact upgrade (0: off, and an answer that reports one stops the run)


# The records one request each writes (``run_needle``, ``run_loss``): what a session's time is spent on.
REQUEST_KINDS = ("needle", "loss")


class ResultStore:
    """``results.jsonl``: one JSON record per line, appended and flushed as each request finishes.

    Between :meth:`begin_session` and :meth:`end_session` every request record this invocation writes carries
    the session's name and its time into the session (``session``, ``at``, seconds by ``clock``), so a session
    stopped before it writes its own record (the process killed) still counts up to its last request
    (``analysis.wall_time``)."""

    def __init__(self, path: pathlib.Path, *, clock: Callable[[], float] = time.perf_counter):
        self.path = path
        self.done: set[tuple] = set()
        self.meta: dict | None = None
        self.clock = clock
        self.session: tuple[str, float] | None = None  # (name, clock at its start)
        self.session_requests = 0
        if path.exists():
            from .analysis import load_records

            raw = path.read_bytes()
            if raw and not raw.endswith(b"\n"):  # a run killed mid-write: drop the partial record
                path.write_bytes(raw[: raw.rfind(b"\n") + 1])
            for rec in load_records(path):
                self.done.add(self.key(rec))
                if rec.get("kind") == "meta" and self.meta is None:
                    self.meta = rec

    @staticmethod
    def key(rec: dict) -> tuple:
        return (rec.get("kind"), rec.get("length"), rec.get("task"), rec.get("sample") or rec.get("doc"), rec.get("arm"))

    def has(self, **rec: Any) -> bool:
        return self.key(rec) in self.done

    def begin_session(self) -> None:
        """This invocation's session starts now (servers and the stock check are part of it)."""
        self.session = (f"{time.strftime('%Y-%m-%dT%H:%M:%S')}/{uuid.uuid4().hex[:8]}", self.clock())
        self.session_requests = 0

    def end_session(self) -> dict:
        """The session's own record: its wall time and the requests it completed."""
        if self.session is None:
            raise RuntimeError("end_session() without begin_session()")
        name, start = self.session
        self.session = None
        return session_record(self.clock() - start, self.session_requests, name)

    def add(self, rec: dict) -> None:
        if self.session is not None and rec.get("kind") in REQUEST_KINDS and "copied_from" not in rec:
            name, start = self.session
            rec = {**rec, "session": name, "at": round(self.clock() - start, 1)}
            self.session_requests += 1
        elif self.session is not None and rec.get("kind") == "plan":
            rec = {**rec, "session": self.session[0]}  # the machine it names ran this session's requests
        with self.path.open("a") as f:
            f.write(json.dumps(rec) + "\n")
        self.done.add(self.key(rec))


def stable_seed(name: str) -> int:
    """A per-sample seed for the random-rows control (the same on every run, different across samples)."""
    return int(hashlib.sha256(name.encode()).hexdigest()[:8], 16)


def prompt_sha(ids: Sequence[int]) -> str:
    """A short hash of a prompt's token ids: runs pair a sample across maps folders and splits only when
    its prompt is the same (a text haystack leaves out each maps folder's calibration documents)."""
    return hashlib.sha256(np.asarray(ids, dtype="<i8").tobytes()).hexdigest()[:16]


def session_record(seconds: float, requests: int, session: str | None = None) -> dict:
    """One invocation of ``sgl-ridgefill eval`` on a results file: its wall time (servers and the stock check
    included) and the requests it completed; a resumed run has several (``analysis.wall_time``)."""
    rec = {"kind": "session", "ended": time.strftime("%Y-%m-%dT%H:%M:%S"), "seconds": round(seconds, 1),
           "requests": requests}
    return rec if session is None else {**rec, "session": session}


def plan_record(*, requests: int, pending: int, cpu: Mapping[str, str] | None = None,
                maps: Mapping[str, Any] | None = None) -> dict:
    """What an invocation set out to do: ``requests``, every arm of every sample and document, and ``pending``,
    those not done yet (``analysis.progress``, what ``results --list`` says is left); ``cpu``, the machine its
    servers run on (``cpu``, ``cpu_capability``, and ``bf16_matmuls`` where they run through float32; none for
    a server given by address); ``maps``, the fingerprint of the maps it fills with (``sha256``,
    ``heldout_r2``): a run resumed elsewhere runs on maps fitted again there."""
    rec = {"kind": "plan", "requests": requests, "pending": pending, **(cpu or {})}
    return {**rec, "maps": dict(maps)} if maps else rec


class RanExact(RuntimeError):
    """A RidgeFill arm ran exactly: the server says so, or it came back bit-identical to the exact arm."""


class UpgradedAnswer(RuntimeError):
    """A fill arm's answer was decoded over rows the server's exact upgrade rewrote, in a run that leaves the
    upgrade off: its tokens after the first read exact keys and values, not the fill's."""


def _generate(client: Client, ids: Sequence[int], custom: dict | None, *, max_new_tokens: int, flush: bool = True,
              **extra) -> tuple[dict, float]:
    """One greedy request and its wall time, from an emptied radix cache unless ``flush`` is false."""
    if flush:
        client.flush_cache()
    body = {"input_ids": list(ids), "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0.0}, **extra}
    if custom is not None:
        body["sampling_params"]["custom_params"] = custom
    start = time.perf_counter()
    out = client.generate(body)
    return out, time.perf_counter() - start


def _check_ran(arm: str, item: str, out: dict) -> None:
    """A RidgeFill arm the server says it ran exactly (``meta_info["ridgefill"]``) stops the run: its results
    would measure exact prefill under a RidgeFill label."""
    ran = (out.get("meta_info") or {}).get("ridgefill")
    if arm not in (A.EXACT, A.CUT) and isinstance(ran, dict) and ran.get("ran") is False:
        raise RanExact(f"{item}: the server ran the {arm} arm exactly: {ran.get('reason')}")


def _fingerprint(out: dict) -> str:
    """Everything a client sees of a greedy request, as text, for byte comparison."""
    meta = out.get("meta_info", {})
    keep = {k: meta.get(k) for k in ("output_token_logprobs", "output_top_logprobs", "input_token_logprobs",
                                      "input_top_logprobs", "completion_tokens")}
    return json.dumps({"text": out.get("text"), "output_ids": out.get("output_ids"), **keep}, sort_keys=True)


_CHECK_ARMS = (("enabled=false", {"ridgefill": {"enabled": False}}), ("arm=exact", {"ridgefill": "exact"}))


def fingerprints(client: Client, prompts: Sequence[Sequence[int]], custom: dict | None = None) -> list[str]:
    """What ``client`` answers to each of ``prompts`` (greedy, logprobs of the last 64 prompt tokens and of
    every output token), as text for byte comparison."""
    out = []
    for ids in prompts:
        lp = dict(return_logprob=True, logprob_start_len=max(len(ids) - 64, 0), top_logprobs_num=5)
        out.append(_fingerprint(_generate(client, ids, custom, max_new_tokens=CHECK_NEW_TOKENS, **lp)[0]))
    return out


def stock_check(ridgefill: Client, stock: Sequence[str], prompts: Sequence[Sequence[int]]) -> dict:
    """Send ``prompts`` to the RidgeFill server with RidgeFill disabled per request and as the exact arm, and
    compare the responses byte for byte with ``stock`` (:func:`fingerprints` of a stock server or engine)."""
    mismatches = []
    for name, custom in _CHECK_ARMS:
        for i, (ids, got, want) in enumerate(zip(prompts, fingerprints(ridgefill, prompts, custom), stock, strict=True)):
            if got != want:
                mismatches.append(f"prompt {i} ({len(ids)} tokens), {name}")
    return {"kind": "check", "passed": not mismatches, "prompts": len(prompts),
            "compared": "output ids, text, output and prompt logprobs (top 5), greedy, "
                        f"{CHECK_NEW_TOKENS} new tokens; RidgeFill server with enabled=false and arm=exact vs stock",
            "mismatches": mismatches}


def needle_jobs(store: ResultStore, samples, plan: EvalPlan) -> Iterator[tuple[Any, str]]:
    """The needle requests left to run; a later-question arm only on samples with enough other questions."""
    for sample in samples:
        for arm in plan.needle_arms:
            later = A.later_position(arm)
            if later is not None and len(sample.other_questions) < later - 1:
                continue
            if not store.has(kind="needle", length=sample.length, task=sample.task, sample=sample.id, arm=arm):
                yield sample, arm


# A needle record's row counts and the meta_info["ridgefill"] keys the server reports them under.
_REPORTED_ROWS = {"exact_rows": "exact", "filled_rows": "filled", "needle_rows": "watched", "needle_rows_exact": "watched_exact",
                  "upgrade_rows": "exact_upgrade"}
# A later question's: its needle was filled, or chosen exact, by the questions before it (the cached rows).
_REPORTED_LATER_ROWS = {"cached_rows": "cached", "cached_exact_rows": "cached_exact", "needle_rows": "watched_cached",
                        "needle_rows_exact": "watched_cached_exact", "tail_reused_filled": "tail_reused_filled",
                        # a plan that reselects: its rows among the whole prefix, the cached ones it made exact
                        "needle_rows_exact_after": "watched_exact", "upgraded_rows": "upgraded",
                        "upgrade_rows": "exact_upgrade"}


def _ask_before(client: Client, sample, custom: dict, later: int) -> None:
    """The ``later - 1`` questions about the sample's other keys, on its document, before its own: the first
    fills the document and chooses its rows, each answer enters the cache (the rows policy's namespace)."""
    client.flush_cache()
    before = {"ridgefill": {k: v for k, v in custom["ridgefill"].items() if k != "watch_rows"}}
    for i in range(later - 1):
        out, _ = _generate(client, sample.other_prompt(i), before, max_new_tokens=sample.max_new_tokens, flush=False)
        _check_ran(RIDGEFILL, f"{sample.id} (question {i + 1})", out)


def run_needle(client: Client, store: ResultStore, sample, arm: str, plan: EvalPlan) -> None:
    from .needles import string_match_all

    custom = A.arm_params(arm, split=plan.split, tail=plan.tail, longtail=plan.longtail.get(sample.length),
                          seed=stable_seed(sample.id), needle_spans=sample.needle_spans)
    if custom["ridgefill"].get("arm") not in (None, A.EXACT):  # did the fill arm's selection find the needle?
        custom["ridgefill"]["watch_rows"] = A.needle_rows(sample.needle_spans)
    later = A.later_position(arm)
    if later is not None:
        _ask_before(client, sample, custom, later)  # empties the cache, then fills it with the other questions
    out, seconds = _generate(client, sample.input_ids, custom, max_new_tokens=sample.max_new_tokens, flush=later is None)
    _check_ran(arm, sample.id, out)
    text = out.get("text", "")
    ran = (out.get("meta_info") or {}).get("ridgefill")
    reported = _REPORTED_ROWS if later is None else _REPORTED_LATER_ROWS
    rows = {name: ran[k] for name, k in reported.items() if isinstance(ran, dict) and isinstance(ran.get(k), int)}
    if rows.get("upgrade_rows") and not plan.upgrade_rows:
        raise UpgradedAnswer(f"{sample.id}: the server rewrote {rows['upgrade_rows']} rows of the {arm} arm's request "
                             "exactly while it decoded its answer, so the answer did not read the fill: run the "
                             "RidgeFill server with --ridgefill-upgrade-rows 0, or pass --upgrade-rows to measure it")
    if later is not None and {"cached_rows", "cached_exact_rows"} <= rows.keys():
        # The exact rows of its prefix: the cached exact rows but those in its own tail (all of them exact
        # but the slack the match took filled).
        boundary = sample.length - plan.tail
        in_tail = max(rows["cached_rows"] - boundary, 0) - rows.get("tail_reused_filled", 0)
        rows["exact_rows"] = rows["cached_exact_rows"] - in_tail
    store.add({
        "kind": "needle", "length": sample.length, "task": sample.task, "haystack": sample.haystack,
        "sample": sample.id, "prompt_sha": prompt_sha(sample.input_ids), "arm": arm, "region": sample.region,
        "depth": sample.depth, "position": sample.needle_spans[0][0], "score": string_match_all(text, sample.answers),
        "output": text, "answers": list(sample.answers), "distractor_answers": list(sample.distractor_answers),
        **rows, "seconds": round(seconds, 3),
    })


def loss_jobs(store: ResultStore, docs_by_length: dict[int, list], plan: EvalPlan) -> Iterator[tuple[Any, str]]:
    for length, docs in docs_by_length.items():
        for doc in docs:
            for arm in plan.loss_arms + (A.CUT,):
                if not store.has(kind="loss", length=length, doc=doc.id, arm=arm):
                    yield doc, arm


def _restores_both(arm: str) -> bool:
    """A ``both`` splice restores exact keys and values, so it may match the exact arm bit for bit."""
    parts = A.splice_parts(arm)
    return parts is not None and parts[0] == "both"


def record_doc(store: ResultStore, doc) -> None:
    """The document's token ids, once per run: what its loss records are scores of."""
    length = len(doc.prompt_ids)
    if not store.has(kind="doc", length=length, doc=doc.id):
        store.add({"kind": "doc", "length": length, "doc": doc.id, "source": doc.source, "prompt_ids": list(doc.prompt_ids)})


exact_scores: dict[tuple[int, str], Any] = {}  # (length, doc) -> the exact arm's logprobs, this process


def run_loss(client: Client, store: ResultStore, doc, arm: str, plan: EvalPlan) -> None:
    """Score the document's last ``T`` tokens: each arm over the whole document (only tail rows have
    outputs under RidgeFill), ``cut`` over the tail alone."""
    from .metrics import TokenScores

    length = len(doc.prompt_ids)
    record_doc(store, doc)
    boundary = length - plan.tail
    ids, start = doc.prompt_ids, boundary
    if arm == A.CUT:  # the tail alone, after the document's BOS when it has one (the attention sink)
        bos = doc.prompt_ids[:1] if doc.has_bos else ()
        ids, start = tuple(bos) + tuple(doc.prompt_ids[boundary:]), len(bos)
    custom = A.arm_params(arm, split=plan.split, tail=plan.tail, longtail=plan.longtail.get(length),
                          seed=stable_seed(doc.id))
    out, seconds = _generate(client, ids, custom, max_new_tokens=1, return_logprob=True, logprob_start_len=start,
                             top_logprobs_num=TOP_LOGPROBS)
    _check_ran(arm, doc.id, out)
    scores = TokenScores.from_meta_info(out["meta_info"], boundary)
    exact = exact_scores.get((length, doc.id))
    if arm == A.EXACT:
        exact_scores[(length, doc.id)] = scores.logprobs
    elif arm != A.CUT and not _restores_both(arm) and exact is not None and np.array_equal(exact, scores.logprobs,
                                                                                             equal_nan=True):
        raise RanExact(
            f"{doc.id}: the {arm} arm returned the exact arm's logprobs bit for bit; the server ran it exactly "
            "(is --chunked-prefill-size below the prompt length?)"
        )
    store.add({"kind": "loss", "length": length, "doc": doc.id, "arm": arm, "scores": scores.to_json(),
               "seconds": round(seconds, 3)})
