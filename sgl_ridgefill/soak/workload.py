"""The soak's workload: a fixed, seeded list of jobs, each one or more ``/generate`` calls.

A job has a kind (:data:`KINDS`): a RidgeFill arm or control, an exact request (asked for, or exact because
of its length or its prompt logprobs), a request the server must refuse, a duplicate or reused rid, a
client abort, a session of several turns, long decodes (alone, or three at once: the decode growth a small pool
must hold, and what ``--retract-every`` retracts), or later questions on a cached document (the namespace
policy chooses its rows again over the reused cache and upgrades the filled ones it chooses in place; one such
question is aborted while it runs, and an exact question on the same document must still match stock).
Prompts are token ids of varied lengths, shorter and longer than the tail and spanning several prefill chunks;
a third of them start with a prefix of random length of an earlier prompt, so that radix-cache hits land at
random offsets. Every call decodes greedily
(temperature 0, ``ignore_eos``) 1 to 8 tokens (a long decode 64 to 200), so its output is a function of its
prompt.

Engine-free: builds plain data, sends nothing.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

NO_PARAMS = "<no custom_params>"  # Call.ridgefill when the body carries no custom_params at all
NAMESPACE_POLICY = "soak-namespace"  # the policy (cache namespace) the RidgeFill server serves by name
MAX_NEW_TOKENS = 8
LONG_DECODE_TOKENS = (64, 200)  # a long decode's output: running requests that a small pool must grow room for

# kind -> weight of the random draws; every kind also occurs at least once (the first jobs).
KINDS: dict[str, float] = {
    "ridgefill": 10, "identity": 5, "nofill": 5, "exact_every": 5, "control_random": 4, "value_rescale": 4,
    "splice": 1.5, "namespace": 7, "exact_disabled": 8, "exact_arm": 5, "plain": 8, "named_plain": 2,
    "prompt_logprobs": 3, "bad_params": 4, "sampling_mask": 2.5, "reserved_key": 2, "too_long": 2,
    "dup_rid": 3, "rid_reuse": 4, "abort_queue": 3, "abort_timeout": 2, "abort_stream": 3, "session": 5,
    "later_questions": 5, "later_question_abort": 2, "long_decode": 3, "decode_crowd": 2,
}
# Bodies the server must refuse with a 4xx: in the tokenizer (parse) or at admission (scheduler).
BAD_PARAMS: tuple[Any, ...] = (
    {"tail": -1}, {"tail": 0}, {"tail": 2**64}, {"split": 0}, {"split": 99}, {"arm": "fast"}, {"enabled": "yes"},
    {"unknown_key": 1}, {"seed": -1}, {"exact_every": 0}, {"control": "sometimes"}, {"policy": "no-such-policy"},
    {"policy": "x" * 201}, {"splice": "keys", "arm": "nofill"}, {"value_rescale": 4, "arm": "nofill"}, "fast", 3,
    [1, 2], {"tail": 1.5}, {"tail": "20"}, {"ridgefill": {}},
)


@dataclass(frozen=True)
class Shape:
    """What the workload is sized against: the server's tail, chunk and context, the model's token ids."""

    tail: int = 20
    chunk: int = 48
    context_length: int = 512
    token_low: int = 2  # token ids are drawn from [token_low, token_high)
    token_high: int = 1024

    def __post_init__(self) -> None:
        if not 1 <= self.tail < self.chunk * 6 < self.context_length:
            raise ValueError(
                f"the workload needs 1 <= tail < 6 * chunk < context length, got tail {self.tail}, chunk {self.chunk}, "
                f"context length {self.context_length}"
            )
        if not 0 <= self.token_low < self.token_high:
            raise ValueError(f"empty token range [{self.token_low}, {self.token_high})")

    @property
    def longest(self) -> int:
        """The longest prompt of an ordinary call: six chunks, a margin below the context."""
        return min(6 * self.chunk, self.context_length - MAX_NEW_TOKENS - 1)


@dataclass(frozen=True)
class Call:
    """One ``/generate`` call. ``expect``: ``ok`` (2xx), ``refused`` (4xx) or ``any`` (2xx or 4xx, e.g. the
    second of two calls with one rid). ``exact``: True when the server must run it exactly (its response
    must say ``"ran": false``), None when either is right. ``abort``: how the client gives up on it."""

    input_ids: tuple[int, ...]
    max_new_tokens: int
    ridgefill: Any = NO_PARAMS
    rid: str | None = None
    extra: tuple[tuple[str, Any], ...] = ()  # further top-level body keys
    temperature: float = 0.0
    expect: str = "ok"
    exact: bool | None = None
    abort: str | None = None  # None, "endpoint" (/abort_request), "timeout" (client timeout), "stream"
    abort_after_s: float = 0.0

    def body(self) -> dict[str, Any]:
        """The JSON body (a session turn gets ``session_params`` from :meth:`Job.bodies`)."""
        sampling: dict[str, Any] = {"max_new_tokens": self.max_new_tokens, "temperature": self.temperature,
                                    "ignore_eos": True}
        if self.ridgefill != NO_PARAMS:
            sampling["custom_params"] = {"ridgefill": self.ridgefill}
        body: dict[str, Any] = {"input_ids": list(self.input_ids), "sampling_params": sampling, "return_logprob": True}
        if self.rid is not None:
            body["rid"] = self.rid
        if self.abort == "stream":
            body["stream"] = True
        body.update(dict(self.extra))
        return body


@dataclass(frozen=True)
class Job:
    """One unit of the workload, run by one client thread. ``session``: the session id its calls continue
    (opened before the first call, closed after the last); ``together``: its calls are sent at once."""

    index: int
    kind: str
    calls: tuple[Call, ...]
    session: str | None = None
    together: bool = False
    tags: frozenset[str] = field(default_factory=frozenset)

    def bodies(self) -> Iterator[dict[str, Any]]:
        previous = None
        for call in self.calls:
            body = call.body()
            if self.session is not None:
                body["session_params"] = {"id": self.session, "rid": previous}
            previous = call.rid
            yield body


class _Prompts:
    """Prompts of varied lengths; some start with a prefix of an earlier prompt (a radix hit)."""

    def __init__(self, rng: random.Random, shape: Shape):
        self.rng, self.shape = rng, shape
        self.history: list[tuple[int, ...]] = []

    def fresh(self, n: int) -> tuple[int, ...]:
        return tuple(self.rng.randrange(self.shape.token_low, self.shape.token_high) for _ in range(n))

    def length(self) -> int:
        """Short (at most the tail), within one chunk, or several chunks, about equally often."""
        s, r = self.shape, self.rng.random()
        if r < 0.25:
            return self.rng.randint(1, s.tail)
        if r < 0.5:
            return self.rng.randint(s.tail + 1, s.chunk)
        return self.rng.randint(s.chunk + 1, s.longest)

    def draw(self, n: int | None = None) -> tuple[tuple[int, ...], bool]:
        """A prompt and whether it shares a prefix with an earlier one."""
        n = self.length() if n is None else n
        shared = bool(self.history) and self.rng.random() < 0.35
        if shared:
            earlier = self.rng.choice(self.history)
            keep = self.rng.randint(1, min(len(earlier), n))
            ids = earlier[:keep] + self.fresh(n - keep)
        else:
            ids = self.fresh(n)
        self.history.append(ids)
        return ids, shared


class _Builder:
    def __init__(self, seed: int, shape: Shape):
        self.rng = random.Random(seed)
        self.shape = shape
        self.prompts = _Prompts(self.rng, shape)
        self.seed = seed

    def rid(self, job: int, call: int = 0) -> str:
        return f"soak-{self.seed}-{job}-{call}"

    def new_tokens(self) -> int:
        return self.rng.randint(1, MAX_NEW_TOKENS)

    def job(self, index: int, kind: str) -> Job:
        """A job of ``kind``; the draws are the only source of randomness, so a seed fixes the workload."""
        method = getattr(self, "_" + kind, None)
        return method(index) if method is not None else self._single(index, kind)

    def _single(self, index: int, kind: str) -> Job:
        ids, shared = self.prompts.draw()
        ridgefill, extra = self._params(kind, len(ids))
        tail = ridgefill.get("tail") if isinstance(ridgefill, dict) else None
        short = len(ids) <= (tail or self.shape.tail)  # a prompt no longer than its tail runs exactly
        exact = True if kind in ("exact_disabled", "exact_arm", "named_plain", "prompt_logprobs") or short else None
        call = Call(ids, self.new_tokens(), ridgefill, rid=self.rid(index), extra=extra, exact=exact)
        return Job(index, kind, (call,), tags=_tags(ids, shared, self.shape))

    def _params(self, kind: str, n: int) -> tuple[Any, tuple[tuple[str, Any], ...]]:
        rng = self.rng
        if kind == "ridgefill":  # the server's policy (selected rows, no_insert), other tails, the plain fill
            return rng.choice([{}, {"arm": "ridgefill"}, "ridgefill", True, {"tail": rng.choice([1, 4, 8, 64])},
                               {"policy": "plain", "tail": self.shape.tail}]), ()
        if kind == "identity":
            return {"arm": "identity"}, ()
        if kind == "nofill":
            return "nofill", ()
        if kind == "exact_every":
            return {"exact_every": rng.choice([1, 2, 3, 7, 16, 1_000_000])}, ()
        if kind == "control_random":
            return {"exact_every": rng.choice([2, 5, 11]), "control": "random", "seed": rng.randrange(2**31)}, ()
        if kind == "value_rescale":
            return {"value_rescale": rng.choice([0, 1, 4, 64])}, ()
        if kind == "splice":
            return {"splice": rng.choice(["keys", "values", "both", "key_norm"])}, ()
        if kind == "namespace":
            return rng.choice([NAMESPACE_POLICY, NAMESPACE_POLICY, {"policy": NAMESPACE_POLICY, "arm": "identity"},
                               {"policy": NAMESPACE_POLICY, "exact_every": 4},
                               {"policy": NAMESPACE_POLICY, "tail": rng.choice([4, 64])}]), ()
        if kind == "exact_disabled":
            return rng.choice([{"enabled": False}, False]), ()
        if kind == "exact_arm":
            return rng.choice(["exact", {"arm": "exact"}]), ()
        if kind == "named_plain":  # the shipped "plain" policy: tail 1,024, so these prompts run exactly
            return "plain", ()
        if kind == "prompt_logprobs":  # logprobs of filled rows: RidgeFill must run the request exactly
            return {}, (("logprob_start_len", 0),)
        extra = (("extra_key", f"tenant-{rng.randrange(3)}"),) if rng.random() < 0.2 else ()
        return NO_PARAMS, extra  # plain

    # ------------------------------------------------------------------ refused
    def _bad_params(self, index: int) -> Job:
        ids, shared = self.prompts.draw()
        call = Call(ids, self.new_tokens(), self.rng.choice(BAD_PARAMS), rid=self.rid(index), expect="refused")
        return Job(index, "bad_params", (call,), tags=_tags(ids, shared, self.shape))

    def _sampling_mask(self, index: int) -> Job:
        # SGLang refuses return_sampling_mask unless top_k is 1 or bounded; temperature 1 keeps the default
        # top_k, so the scheduler drops the Req it created (a refused request whose rid a later request may reuse).
        ids, shared = self.prompts.draw()
        ridgefill = self.rng.choice([NO_PARAMS, {}, {"arm": "identity"}])
        call = Call(ids, self.new_tokens(), ridgefill, rid=self.rid(index), extra=(("return_sampling_mask", True),),
                    temperature=1.0, expect="refused")
        return Job(index, "sampling_mask", (call,), tags=_tags(ids, shared, self.shape))

    def _reserved_key(self, index: int) -> Job:
        ids, shared = self.prompts.draw()
        key = self.rng.choice(["extra_key", "cache_salt"])
        call = Call(ids, self.new_tokens(), self.rng.choice([NO_PARAMS, {}]), rid=self.rid(index),
                    extra=((key, f"x|rf:{self.rng.randrange(10**6):06d}"),), expect="refused")
        return Job(index, "reserved_key", (call,), tags=_tags(ids, shared, self.shape))

    def _too_long(self, index: int) -> Job:
        n = self.shape.context_length + self.rng.randint(1, 64)
        call = Call(self.prompts.fresh(n), self.new_tokens(), self.rng.choice([NO_PARAMS, {}]), rid=self.rid(index),
                    expect="refused")
        return Job(index, "too_long", (call,))

    # ------------------------------------------------------------------ rids
    def _dup_rid(self, index: int) -> Job:
        """Two calls with one rid at once: SGLang refuses the second while the first is live (or runs both
        one after the other); either way no crash, and an exact one that ran still matches stock."""
        rid = self.rid(index)
        calls = []
        for ridgefill in self.rng.sample([{"enabled": False}, {}, "identity", NO_PARAMS], 2):
            ids, _ = self.prompts.draw(self.rng.randint(self.shape.tail + 1, self.shape.longest))
            exact = True if ridgefill == {"enabled": False} else None
            calls.append(Call(ids, MAX_NEW_TOKENS, ridgefill, rid=rid, expect="any", exact=exact))
        return Job(index, "dup_rid", tuple(calls), together=True)

    def _rid_reuse(self, index: int) -> Job:
        """A rid that was refused (or finished) is reused by an exact request, which must run exactly on its
        own prompt, never on the refused request's plan."""
        rid = self.rid(index)
        first_kind = self.rng.choice(["sampling_mask", "bad_params", "finished"])
        first = self.job(index, first_kind if first_kind != "finished" else "ridgefill").calls[0]
        first = Call(first.input_ids, first.max_new_tokens, first.ridgefill, rid=rid, extra=first.extra,
                     temperature=first.temperature, expect=first.expect, exact=first.exact)
        ids, _ = self.prompts.draw(self.rng.randint(1, self.shape.longest))
        second = Call(ids, self.new_tokens(), self.rng.choice([{"enabled": False}, "exact"]), rid=rid, exact=True)
        return Job(index, "rid_reuse", (first, second), tags=frozenset({f"reuse_after_{first_kind}"}))

    # ------------------------------------------------------------------ aborts
    def _abort(self, index: int, kind: str, how: str, after: float) -> Job:
        ids, shared = self.prompts.draw(self.rng.randint(self.shape.chunk, self.shape.longest))
        ridgefill = self.rng.choice([{}, "identity", {"enabled": False}, NO_PARAMS, NAMESPACE_POLICY])
        call = Call(ids, MAX_NEW_TOKENS, ridgefill, rid=self.rid(index), expect="any", abort=how, abort_after_s=after)
        return Job(index, kind, (call,), tags=_tags(ids, shared, self.shape))

    def _abort_queue(self, index: int) -> Job:
        return self._abort(index, "abort_queue", "endpoint", self.rng.uniform(0.0, 0.05))

    def _abort_timeout(self, index: int) -> Job:
        return self._abort(index, "abort_timeout", "timeout", self.rng.uniform(0.01, 0.2))

    def _abort_stream(self, index: int) -> Job:
        return self._abort(index, "abort_stream", "stream", 0.0)

    def _long_decode(self, index: int) -> Job:
        """A prompt that decodes 64 to 200 tokens, exact or under the server's or the namespace policy: a
        request that stays in the running batch for many steps, where a retraction (``--retract-every``) frees
        its KV and runs it again from the queue; an exact one must still match stock."""
        s = self.shape
        new = self.rng.randint(*LONG_DECODE_TOKENS)
        ids, shared = self.prompts.draw(self.rng.randint(1, max(1, min(s.longest, s.context_length - new - 1))))
        ridgefill = self.rng.choice([{"enabled": False}, {}, NAMESPACE_POLICY])
        exact = True if ridgefill == {"enabled": False} or len(ids) <= s.tail else None
        call = Call(ids, new, ridgefill, rid=self.rid(index), exact=exact)
        return Job(index, "long_decode", (call,), tags=_tags(ids, shared, s))

    def _decode_crowd(self, index: int) -> Job:
        """Three long decodes sent at once, each as long as the context allows: together they outgrow a
        768-token pool once they have decoded, so SGLang must hold them back or make room (measured: its
        admission holds them back; ``--retract-every`` retracts among them); exact ones must still match stock."""
        s = self.shape
        calls = []
        for t in range(3):
            new = self.rng.randint(*LONG_DECODE_TOKENS)
            top = max(1, min(s.longest, s.context_length - new - 1))
            ids, _ = self.prompts.draw(self.rng.randint((3 * top + 3) // 4, top))
            ridgefill = self.rng.choice([{"enabled": False}, {}, NAMESPACE_POLICY])
            exact = True if ridgefill == {"enabled": False} or len(ids) <= s.tail else None
            calls.append(Call(ids, new, ridgefill, rid=self.rid(index, t), exact=exact))
        return Job(index, "decode_crowd", tuple(calls), together=True)

    # ------------------------------------------------------------------ later questions on a cached document
    def _document(self) -> tuple[tuple[int, ...], int]:
        """A document longer than the tail and room for a question after it: ``(ids, question length)``."""
        s = self.shape
        question = self.rng.randint(1, max(1, s.tail // 2))
        return self.prompts.fresh(self.rng.randint(s.tail + 1, max(s.tail + 1, s.longest - question))), question

    def _later_questions(self, index: int) -> Job:
        """A document asked two or three questions under the namespace policy, one after another: the first
        fills it and chooses rows for itself; each later one reuses the cached document, chooses its own rows
        over it and makes exact in place the cached filled rows it chooses. Then an exact question on the same
        document, which must match stock whatever the namespace's rows hold."""
        document, question = self._document()
        calls = [Call(document + self.prompts.fresh(question), self.new_tokens(), NAMESPACE_POLICY,
                      rid=self.rid(index, t)) for t in range(self.rng.randint(2, 3))]
        calls.append(Call(document + self.prompts.fresh(question), self.new_tokens(), {"enabled": False},
                          rid=self.rid(index, len(calls)), exact=True))
        return Job(index, "later_questions", tuple(calls), tags=frozenset({"later_question"}))

    def _later_question_abort(self, index: int) -> Job:
        """A document filled by one question; a second question on it aborted while it may be choosing and
        upgrading its rows; a third that must still complete over whatever the cache then holds."""
        document, question = self._document()

        def ask(t: int, **how: Any) -> Call:
            return Call(document + self.prompts.fresh(question), MAX_NEW_TOKENS, NAMESPACE_POLICY,
                        rid=self.rid(index, t), **how)

        calls = (ask(0), ask(1, expect="any", abort="endpoint", abort_after_s=self.rng.uniform(0.0, 0.3)), ask(2))
        return Job(index, "later_question_abort", calls, tags=frozenset({"later_question"}))

    # ------------------------------------------------------------------ sessions
    def _session(self, index: int) -> Job:
        """Two or three turns; each turn's prompt is the history (earlier turns and their outputs) plus its
        own tokens, so a turn's arm applies to the whole concatenation, planned from what the scheduler actually runs."""
        turns, calls, total = self.rng.randint(2, 3), [], 0
        budget = self.shape.longest - turns * MAX_NEW_TOKENS
        for t in range(turns):
            n = self.rng.randint(1, max(1, (budget - total) // (turns - t)))
            total += n + MAX_NEW_TOKENS
            ids = self.prompts.fresh(n)
            ridgefill = self.rng.choice([{"enabled": False}, NO_PARAMS, {}, "identity", "exact"])
            exact = True if ridgefill in ({"enabled": False}, "exact") else None
            calls.append(Call(ids, self.new_tokens(), ridgefill, rid=self.rid(index, t), exact=exact))
        return Job(index, "session", tuple(calls), session=f"soak-session-{self.seed}-{index}")


def _tags(ids: tuple[int, ...], shared: bool, shape: Shape) -> frozenset[str]:
    tags = {"radix_shared"} if shared else set()
    n = len(ids)
    tags.add("short" if n <= shape.tail else "one_chunk" if n <= shape.chunk else "multi_chunk")
    return frozenset(tags)


def build_workload(requests: int, seed: int, shape: Shape = Shape()) -> list[Job]:
    """Jobs totalling at least ``requests`` calls: one of every kind first (in a seeded order), then kinds
    drawn by :data:`KINDS`' weights."""
    if requests < 1:
        raise ValueError(f"the soak needs at least one request, got {requests}")
    builder = _Builder(seed, shape)
    first = list(KINDS)
    builder.rng.shuffle(first)
    names, weights = list(KINDS), list(KINDS.values())
    jobs: list[Job] = []
    calls = 0
    while calls < requests:
        kind = first[len(jobs)] if len(jobs) < len(first) else builder.rng.choices(names, weights)[0]
        job = builder.job(len(jobs), kind)
        jobs.append(job)
        calls += len(job.calls)
    return jobs


def count_calls(jobs: list[Job]) -> dict[str, int]:
    """Calls per kind."""
    out: dict[str, int] = {}
    for job in jobs:
        out[job.kind] = out.get(job.kind, 0) + len(job.calls)
    return out
