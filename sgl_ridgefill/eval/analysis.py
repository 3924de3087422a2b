"""Summary of an evaluation run's ``results.jsonl``: retrieval, loss, agreement and splice tables with
paired intervals.

The runner appends one JSON record per line (kinds ``meta``, ``check``, ``needle``, ``doc``, ``loss``; ``plan``
and ``session`` say what each invocation set out to do and what it cost). Runs
are partial or resumed, so any arm may be missing and a later record with the same identity (kind, length,
sample or document, arm) replaces an earlier one. ``summarize`` returns plain JSON-serialisable tables
(lists of flat rows; ``None`` where a number is undefined); ``report`` turns them into Markdown and plots.
"""

from __future__ import annotations

import dataclasses
import json
import math
import pathlib
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from .answers import near_miss_examples, near_miss_rows
from .arms import CUT, EXACT, IDENTITY, NOFILL_LONGTAIL, RIDGEFILL, arm_sort_key, is_splice, splice_parts
from .metrics import TokenScores, key_token_mask, kl_topk, mean_loss, new_token_mask, top1_agreement
from .retrieval import ALL, exact_rows, retrieval_diffs, retrieval_rows, sample_scores
from .stats import bootstrap_mean, interval_fields, json_number, stratified_paired_bootstrap

LOSS_METRICS = ("key", "new", "all")
SPLICE_METRICS = ("key", "new")
_ZERO_LOSS_GAP = 1e-6  # nat; below this RidgeFill and exact are indistinguishable and a share is undefined


def load_records(path: str | pathlib.Path) -> list[dict[str, Any]]:
    """Every record of a ``results.jsonl``, in file order. A truncated last line (a run killed mid-write)
    is skipped; a malformed line anywhere else raises ``ValueError`` naming the line."""
    path = pathlib.Path(path)
    lines = path.read_text().splitlines()
    last = max((i for i, line in enumerate(lines) if line.strip()), default=-1)
    records = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            if i == last:
                break
            raise ValueError(f"{path}:{i + 1}: not a JSON record ({exc.msg})") from None
        if not isinstance(record, dict) or "kind" not in record:
            raise ValueError(f"{path}:{i + 1}: a record must be a JSON object with a 'kind', got {line[:80]!r}")
        records.append(record)
    return records


def latest_records(records: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The records left after later duplicates replace earlier ones (unknown kinds are dropped)."""
    latest: dict[tuple, Mapping[str, Any]] = {}
    for record in records:
        identity = _identity(record)
        if identity is not None:
            latest.pop(identity, None)  # re-insert so the order is that of the surviving record
            latest[identity] = record
    return list(latest.values())


def _identity(record: Mapping[str, Any]) -> tuple | None:
    kind = record.get("kind")
    if kind in ("meta", "check"):
        return (kind,)
    if kind == "needle":
        return (kind, record["length"], record.get("task"), record["sample"], record["arm"])
    if kind == "doc":
        return (kind, record["length"], record["doc"])
    if kind == "loss":
        return (kind, record["length"], record["doc"], record["arm"])
    return None


def summarize(records: Iterable[Mapping[str, Any]], *, n_resamples: int = 5000) -> dict[str, Any]:
    """All tables of one run, as a JSON-serialisable dict of lists of flat rows:

    ``meta``, ``check``: the last such record (or None). ``retrieval``, ``retrieval_diffs``, ``exact_rows``,
    ``samples``: the needle tables of :mod:`.retrieval` (pooled and per haystack). ``near_misses``,
    ``near_miss_examples``: :mod:`.answers`. ``loss``: {length, arm, metric ("key", "new", "all"), n_docs,
    n_tokens, docs_without_tokens, docs_unmeasured, mean, median, low, high} over per-document mean losses.
    ``loss_diffs``: {length, metric, arm, vs, n, diff, low, high}, documents resampled within their corpus
    source (pooled when a source has one document). ``agreement``: {length, arm, n_docs, n_tokens, top1,
    top1_doc_mean, kl_mean, kl_median, vs_identity_n, vs_identity_diff, vs_identity_low, vs_identity_high}.
    ``splice``: {length, arm, kind, layers, metric, n_docs, loss, ridgefill, exact, share}. ``wall``:
    :func:`wall_time`. Intervals are 95%
    BCa with ``n_resamples`` resamples.
    """
    if n_resamples < 1:
        raise ValueError(f"n_resamples must be >= 1, got {n_resamples}")
    records = list(records)
    latest = latest_records(records)
    by_kind: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for record in latest:
        by_kind[record["kind"]].append(record)
    documents = _documents(by_kind["doc"], by_kind["loss"])
    needles = by_kind["needle"]
    return {
        "meta": dict(by_kind["meta"][-1]) if by_kind["meta"] else None,
        "check": dict(by_kind["check"][-1]) if by_kind["check"] else None,
        "retrieval": retrieval_rows(needles, n_resamples),
        "retrieval_diffs": retrieval_diffs(needles, n_resamples),
        "exact_rows": exact_rows(needles),
        "samples": sample_scores(needles),
        "near_misses": near_miss_rows(needles, n_resamples),
        "near_miss_examples": near_miss_examples(needles),
        "loss": _loss(documents, n_resamples),
        "loss_diffs": _loss_diffs(documents, n_resamples),
        "agreement": _agreement(documents, n_resamples),
        "splice": _splice(documents),
        "wall": wall_time(records),
    }


NOT_RECORDED = "not recorded"  # a session whose plan named no CPU (or no maps' fingerprint): an older run's


def wall_time(records: Iterable[Mapping[str, Any]]) -> dict[str, Any] | None:
    """What the run has cost so far, every resumption included (None: a run from before sessions were
    recorded): ``sessions``, ``seconds`` and ``requests``, and where some sessions did not end normally:

    - ``stopped``: sessions killed before writing their own record; their requests name them
      (``ResultStore.begin_session``), so each counts up to its last finished request;
    - ``untimed_requests``, ``untimed_request_seconds``: requests of such sessions from before requests named
      theirs. An unnamed session record counts the requests just before it as its own; the others before
      them ran in sessions whose wall time is lost, and only their requests' own time is known.

    and where sessions' plans differ, ``cpus`` and ``maps``: requests by CPU (with where its bfloat16 matmuls
    ran) and by the maps' fingerprint (a run resumed on another machine fills with maps fitted again there);
    requests of sessions whose plan named neither count as :data:`NOT_RECORDED`.
    """
    from .runner import REQUEST_KINDS

    recorded: dict[str, Mapping[str, Any]] = {}  # named sessions that wrote their record
    machine: dict[str, str] = {}  # named sessions whose plan names the CPU they ran on
    maps: dict[str, str] = {}  # named sessions whose plan names the fingerprint of the maps they filled with
    last_at: dict[str, float] = {}  # named sessions: the time of their last request
    count: Counter[str] = Counter()
    unnamed = []  # session records without a name (older runs)
    pending: list[Mapping[str, Any]] = []  # unnamed requests since the last unnamed session record
    untimed: list[Mapping[str, Any]] = []
    unnamed_requests = 0  # requests from before requests named their session
    for r in records:
        kind = r.get("kind")
        if kind == "session" and r.get("session") is None:
            unnamed.append(r)
            own = min(int(r["requests"]), len(pending))
            untimed += pending[: len(pending) - own]
            pending = []
        elif kind == "session":
            recorded[r["session"]] = r
        elif kind == "plan" and r.get("session") is not None:
            if r.get("cpu") is not None:
                through = f"; bfloat16 matmuls {r['bf16_matmuls']}" if r.get("bf16_matmuls") else ""
                machine[r["session"]] = f"{r['cpu']} ({r.get('cpu_capability')}{through})"
            fit = r.get("maps") or {}
            if fit.get("sha256"):
                maps[r["session"]] = f"{fit['sha256']} (held-out R² {fit['heldout_r2']})"
        elif kind in REQUEST_KINDS and "copied_from" not in r:
            if r.get("session") is None:
                pending.append(r)
                unnamed_requests += 1
            else:
                last_at[r["session"]] = max(last_at.get(r["session"], 0.0), float(r.get("at", 0.0)))
                count[r["session"]] += 1
    untimed += pending
    stopped = [name for name in last_at if name not in recorded]
    if not (unnamed or recorded or stopped):
        return None
    done = [*unnamed, *recorded.values()]
    out: dict[str, Any] = {
        "sessions": len(done) + len(stopped),
        "seconds": round(sum(float(r["seconds"]) for r in done) + sum(last_at[name] for name in stopped), 1),
        "requests": sum(int(r["requests"]) for r in done) + sum(count[name] for name in stopped),
    }
    if stopped:
        out["stopped"] = len(stopped)
    if untimed:
        out["untimed_requests"] = len(untimed)
        out["untimed_request_seconds"] = round(sum(float(r.get("seconds") or 0.0) for r in untimed), 1)
    # "<cpu> (<capability>)" and the maps' fingerprint: requests, those of sessions whose plan does not name
    # them (or from before requests named their session) counted as not recorded
    for key, by_session in (("cpus", machine), ("maps", maps)):
        counted: Counter[str] = Counter()
        for name, n in count.items():
            counted[by_session.get(name, NOT_RECORDED)] += n
        counted[NOT_RECORDED] += unnamed_requests
        counted = +counted  # drop the zero count
        if by_session and len(counted) > 1:
            out[key] = dict(counted)
    return out


def meta_record(records: Iterable[Mapping[str, Any]]) -> Mapping[str, Any]:
    """A run's meta record (its settings, dtype and machine), or ``{}`` for records without one."""
    return next((r for r in records if r.get("kind") == "meta"), {})


def progress(records: Iterable[Mapping[str, Any]]) -> dict[str, Any] | None:
    """How far a run is (None before an invocation recorded its plan): ``requests``, what the latest plan
    holds (every arm of every sample and document); ``done``, the distinct requests recorded (copied ones
    included); ``pace``, seconds from one request to the next within a session, over every session (the
    servers' start left out), or None before two requests ran in one."""
    from .runner import REQUEST_KINDS

    plan, done, times = None, set(), defaultdict(list)
    for r in records:
        if r.get("kind") == "plan":
            plan = r
        elif r.get("kind") in REQUEST_KINDS:
            done.add(_identity(r))
            if r.get("session") is not None and "copied_from" not in r:
                times[r["session"]].append(float(r["at"]))
    if plan is None:
        return None
    gaps = [b - a for at in map(sorted, times.values()) for a, b in zip(at, at[1:])]
    return {"requests": int(plan["requests"]), "done": len(done), "pace": sum(gaps) / len(gaps) if gaps else None}


# ---------------------------------------------------------------------------------------------- documents


@dataclasses.dataclass(frozen=True)
class Document:
    """One long document's scored tail under every arm that reached it.

    ``arms``: arm -> scores of positions start..N-1 (n tokens each); ``key``: [n] bool, key tokens (exact vs
    cut), ``None`` when either record is missing; ``new``: [n] bool, tokens outside any repeated span,
    ``None`` when the ``doc`` record is missing."""

    length: int
    doc: str
    arms: Mapping[str, TokenScores]
    key: np.ndarray | None
    new: np.ndarray | None
    source: str = "?"  # the corpus source (the stratum of paired intervals); "?" without a ``doc`` record

    def mask(self, metric: str) -> np.ndarray | None:
        if metric == "all":
            return np.ones(self.n, dtype=bool)
        return {"key": self.key, "new": self.new}[metric]

    @property
    def n(self) -> int:
        return len(next(iter(self.arms.values())).token_ids)

    def loss(self, arm: str, metric: str) -> float:
        """Mean loss of ``arm`` over ``metric``'s tokens; NaN when the arm, the mask or its tokens are missing."""
        mask = self.mask(metric)
        if arm not in self.arms or mask is None or not mask.any():
            return math.nan
        return float(mean_loss(self.arms[arm], mask))


def _documents(doc_records: Sequence[Mapping[str, Any]], loss_records: Sequence[Mapping[str, Any]]) -> list[Document]:
    prompts = {(r["length"], r["doc"]): r["prompt_ids"] for r in doc_records}
    sources = {(r["length"], r["doc"]): str(r.get("source") or "?") for r in doc_records}
    arms: dict[tuple, dict[str, TokenScores]] = defaultdict(dict)
    for r in loss_records:
        arms[(r["length"], r["doc"])][r["arm"]] = TokenScores.from_json(r["scores"])
    documents = []
    for (length, doc), scores in sorted(arms.items(), key=lambda kv: (kv[0][0], str(kv[0][1]))):
        sizes = {len(s.token_ids) for s in scores.values()}
        if len(sizes) != 1:
            raise ValueError(f"document {doc!r} (length {length}): arms score different numbers of tokens "
                             f"{ {arm: len(s.token_ids) for arm, s in scores.items()} }")
        key = key_token_mask(scores[EXACT], scores[CUT]) if EXACT in scores and CUT in scores else None
        new = None
        if (length, doc) in prompts:
            prompt_ids = prompts[(length, doc)]
            start = len(prompt_ids) - sizes.pop()
            for arm, s in scores.items():
                if arm != CUT and s.start != start:  # the cut record may count from its own shorter prompt
                    raise ValueError(f"document {doc!r} (length {length}), arm {arm!r}: scores start at {s.start}, "
                                     f"but the document's last {len(s.token_ids)} tokens start at {start}")
            new = np.asarray(new_token_mask(prompt_ids, start), dtype=bool)
        documents.append(Document(length, doc, scores, None if key is None else np.asarray(key, dtype=bool), new,
                                  sources.get((length, doc), "?")))
    return documents


def _arms_by_length(documents: Sequence[Document]) -> dict[int, list[str]]:
    arms: dict[int, set[str]] = defaultdict(set)
    for d in documents:
        arms[d.length].update(d.arms)
    return {length: sorted(a, key=arm_sort_key) for length, a in sorted(arms.items())}


# ---------------------------------------------------------------------------------------------------- loss


def _loss(documents: Sequence[Document], n_resamples: int) -> list[dict[str, Any]]:
    rows = []
    for length, arms in _arms_by_length(documents).items():
        docs = [d for d in documents if d.length == length]
        for arm in arms:
            have = [d for d in docs if arm in d.arms]
            for metric in LOSS_METRICS:
                measured = [d for d in have if d.mask(metric) is not None]
                used = [d for d in measured if d.mask(metric).any()]
                values = np.array([d.loss(arm, metric) for d in used])
                row: dict[str, Any] = {
                    "length": length, "arm": arm, "metric": metric, "n_docs": len(used),
                    "n_tokens": int(sum(d.mask(metric).sum() for d in used)),
                    "docs_without_tokens": len(measured) - len(used), "docs_unmeasured": len(have) - len(measured),
                    "median": json_number(np.median(values)) if len(values) else None,
                }
                if len(values):
                    row.update(interval_fields(bootstrap_mean(values, n_resamples=n_resamples), "mean"))
                else:
                    row.update({"mean": None, "low": None, "high": None})
                rows.append(row)
    return rows


def _loss_pairs(arms: Sequence[str]) -> list[tuple[str, str]]:
    pairs = [(arm, EXACT) for arm in arms if arm != EXACT and EXACT in arms]
    pairs += [(arm, IDENTITY) for arm in arms if arm not in (EXACT, IDENTITY) and IDENTITY in arms]
    if RIDGEFILL in arms and NOFILL_LONGTAIL in arms:
        pairs.append((RIDGEFILL, NOFILL_LONGTAIL))
    return pairs


def _loss_diffs(documents: Sequence[Document], n_resamples: int) -> list[dict[str, Any]]:
    rows = []
    for length, arms in _arms_by_length(documents).items():
        docs = [d for d in documents if d.length == length]
        for metric in LOSS_METRICS:
            for arm, vs in _loss_pairs(arms):
                (a, b), strata = _paired_strata(docs, metric, arm, vs)
                if len(a):
                    interval = stratified_paired_bootstrap(a, b, strata, n_resamples=n_resamples)
                    rows.append({"length": length, "metric": metric, "arm": arm, "vs": vs, "n": len(a),
                                 **interval_fields(interval, "diff")})
    return rows


def _paired(docs: Sequence[Document], metric: str, *arms: str) -> tuple[np.ndarray, ...]:
    """Per-document losses of ``arms`` over the documents where every one of them is finite."""
    return _paired_strata(docs, metric, *arms)[0]


def _paired_strata(docs: Sequence[Document], metric: str, *arms: str) -> tuple[tuple[np.ndarray, ...], list[str]]:
    """:func:`_paired`, and the source of each document kept (the stratum of its paired interval)."""
    values = np.array([[d.loss(arm, metric) for arm in arms] for d in docs]).reshape(len(docs), len(arms))
    keep = np.isfinite(values).all(axis=1)
    values = values[keep]
    return tuple(values[:, i] for i in range(len(arms))), [d.source for d, k in zip(docs, keep) if k]


# ----------------------------------------------------------------------------------------------- agreement


def _agreement(documents: Sequence[Document], n_resamples: int) -> list[dict[str, Any]]:
    """Top-1 agreement with exact and top-k KL from exact, per arm; the interval is on the difference of
    per-document top-1 agreement against ``identity`` over the documents both arms reached."""
    rows = []
    for length, arms in _arms_by_length(documents).items():
        docs = [d for d in documents if d.length == length and EXACT in d.arms]
        per_doc: dict[str, dict[str, float]] = {}
        for arm in arms:
            if arm == EXACT:
                continue
            top1, kl, doc_top1 = [], [], {}
            for d in docs:
                if arm in d.arms:
                    divergence = np.asarray(kl_topk(d.arms[EXACT], d.arms[arm]), dtype=float)
                    listed = ~np.isnan(divergence)  # positions where both arms have a top list (not the first)
                    agree = np.asarray(top1_agreement(d.arms[EXACT], d.arms[arm]), dtype=bool)[listed]
                    top1.append(agree)
                    kl.append(divergence[listed])
                    doc_top1[d.doc] = float(agree.mean()) if len(agree) else math.nan
            if not top1:
                continue
            per_doc[arm] = doc_top1
            tokens, kls = np.concatenate(top1), np.concatenate(kl)
            rows.append({"length": length, "arm": arm, "n_docs": len(top1), "n_tokens": len(tokens),
                         "top1": json_number(tokens.mean()) if len(tokens) else None,
                         "top1_doc_mean": json_number(np.nanmean(list(doc_top1.values()))),
                         "kl_mean": json_number(np.nanmean(kls)) if np.isfinite(kls).any() else None,
                         "kl_median": json_number(np.nanmedian(kls)) if np.isfinite(kls).any() else None})
        for row in rows:
            if row["length"] == length:
                row.update(_vs_identity(per_doc, row["arm"], n_resamples, {d.doc: d.source for d in docs}))
    return rows


def _vs_identity(per_doc: Mapping[str, Mapping[str, float]], arm: str, n_resamples: int,
                 sources: Mapping[str, str]) -> dict[str, Any]:
    empty = {"vs_identity_n": 0, "vs_identity_diff": None, "vs_identity_low": None, "vs_identity_high": None}
    if arm == IDENTITY or IDENTITY not in per_doc:
        return empty
    shared = [doc for doc in per_doc[arm] if doc in per_doc[IDENTITY]]
    if not shared:
        return empty
    a = np.array([per_doc[arm][doc] for doc in shared])
    b = np.array([per_doc[IDENTITY][doc] for doc in shared])
    interval = stratified_paired_bootstrap(a, b, [sources[doc] for doc in shared], n_resamples=n_resamples)
    return {"vs_identity_n": len(shared), "vs_identity_diff": json_number(interval.estimate),
            "vs_identity_low": json_number(interval.low), "vs_identity_high": json_number(interval.high)}


# -------------------------------------------------------------------------------------------------- splice


def _splice(documents: Sequence[Document]) -> list[dict[str, Any]]:
    """For each splice arm (every upper layer, or a layer range): its loss, RidgeFill's and exact's over the
    documents all three reached, and the share of RidgeFill's excess loss the splice removes,
    (L_ridgefill - L_splice) / (L_ridgefill - L_exact). ``kind`` is the splice (keys, values, ...), ``layers``
    ``"all"`` or ``"FIRST-LAST"``."""
    rows = []
    for length, arms in _arms_by_length(documents).items():
        docs = [d for d in documents if d.length == length]
        for arm in (a for a in arms if is_splice(a) and splice_parts(a) is not None):
            kind, layers = splice_parts(arm)
            for metric in SPLICE_METRICS:
                splice, ridgefill, exact = _paired(docs, metric, arm, RIDGEFILL, EXACT)
                if not len(splice):
                    continue
                l_s, l_rf, l_ex = float(splice.mean()), float(ridgefill.mean()), float(exact.mean())
                gap = l_rf - l_ex
                rows.append({"length": length, "arm": arm, "kind": kind, "layers": _layers_text(layers),
                             "metric": metric, "n_docs": len(splice),
                             "loss": l_s, "ridgefill": l_rf, "exact": l_ex,
                             "share": None if abs(gap) < _ZERO_LOSS_GAP else (l_rf - l_s) / gap})
    return rows


def _layers_text(layers: tuple[int, int] | None) -> str:
    return ALL if layers is None else f"{layers[0]}-{layers[1]}"
