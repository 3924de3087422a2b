"""The TTFT benchmark's measurement loop: exact and RidgeFill alternating on one server.

For each prompt length, ``pairs`` pairs are sent. A pair is one prompt (random token ids, a fixed seed per
length and pair, so every pair has its own prompt) sent once exactly (``{"ridgefill": {"enabled":
false}}``) and once with RidgeFill (``{"ridgefill": {...}}``); even pairs send the exact arm first, odd
pairs RidgeFill first, so a drift in machine speed hits both arms alike. With a policy that selects exact
rows the pair holds a third arm, the bare fill (the same split and tail, no rows), and the order rotates by
one arm per pair. The radix cache is flushed before every request: the second arm of a pair would otherwise
reuse the first arm's prefix (RidgeFill requests reuse exact cached prefixes by design). Each response's
``cached_tokens`` is kept as a check, and each RidgeFill response's exact rows feed the FLOP-counted bound.
"""

from __future__ import annotations

import dataclasses
import random
import statistics
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from ..tools.flops import ModelDims, RidgeFillShape, flop_bound, layer_pass_bound

EXACT, BARE, RIDGEFILL = "exact", "bare", "ridgefill"
ARMS = (EXACT, RIDGEFILL)
EXACT_PARAMS: dict[str, Any] = {"ridgefill": {"enabled": False}}


class TimingClient(Protocol):
    def flush_cache(self) -> None: ...

    def time_generate(self, input_ids: list[int], custom_params: dict[str, Any] | None, *, stream: bool = False) -> Any: ...


class CpuProbe(Protocol):
    """``procstat.ServerCpu``: CPU seconds per server process, sampled around each request."""

    def sample(self) -> dict[str, float]: ...

    @staticmethod
    def delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]: ...


def resolve_split(rf_params: Mapping[str, Any], splits_by_length: Mapping[int, int], split: int,
                  length: int | None = None) -> int:
    """The split the RidgeFill arm runs a ``length``-token prompt at: one the requests ask for (``rf_params``),
    else the policy's for that length (``split S from N tokens``), else the base ``split``."""
    return int(rf_params.get("split") or splits_by_length.get(length) or split)


def resolve_tail(rf_params: Mapping[str, Any], tail: int) -> int:
    """The tail the RidgeFill arm runs at: one the requests ask for (``rf_params``), else the configured ``tail``."""
    return int(rf_params.get("tail") or tail)


@dataclasses.dataclass(frozen=True)
class BenchConfig:
    """What to measure. ``rf_params`` is the request's ``custom_params["ridgefill"]`` for the RidgeFill arm
    (``{}``: the server's settings); ``split``/``tail``/``exact_fraction`` only feed the bounds, unless
    ``rf_params`` sets ``split``/``tail``, which then win; ``splits_by_length`` (``{length: split}``) is the
    split a policy's ``split S from N tokens`` runs each length at (the bounds and the bare fill follow it);
    ``map_kind`` (the maps' kind) prices the fill.
    ``bare_params``: the bare fill's ``custom_params["ridgefill"]``, a third arm beside a policy with rows
    (``None``: no such arm); ``selector_flops``: what the RidgeFill arm's selection costs, per prompt length
    (``{length: FLOPs}``), for its FLOP-counted bound. The bounds of a RidgeFill arm use the exact rows its
    responses report (their median) where they report them, else ``exact_fraction``."""

    lengths: tuple[int, ...]
    vocab_size: int
    pairs: int = 3
    split: int = 12
    tail: int = 1024
    exact_fraction: float = 0.0
    rf_params: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    seed: int = 0
    warmup: int = 1
    flush: bool = True
    stream: bool = False
    map_kind: str | None = None
    bare_params: Mapping[str, Any] | None = None
    selector_flops: Mapping[int, float] = dataclasses.field(default_factory=dict)
    policy: str | None = None  # the RidgeFill arm's policy, as named on the command line
    splits_by_length: Mapping[int, int] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.lengths:
            raise ValueError("--lengths: give at least one prompt length")
        for n in self.lengths:
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise ValueError(f"--lengths: every length must be a positive integer, got {n!r}")
        if self.pairs < 1:
            raise ValueError(f"--pairs must be >= 1, got {self.pairs}")
        if self.warmup < 0:
            raise ValueError(f"--warmup must be >= 0, got {self.warmup}")
        if self.vocab_size < 2:
            raise ValueError(f"vocab size must be >= 2, got {self.vocab_size}")
        if not 0.0 <= self.exact_fraction < 1.0:
            raise ValueError(f"--exact-fraction must be in [0, 1), got {self.exact_fraction}")
        if not isinstance(self.rf_params, Mapping):
            raise ValueError(f"--rf-params must be a JSON object, got {self.rf_params!r}")

    def split_at(self, length: int) -> int:
        """The split the RidgeFill arm runs a ``length``-token prompt at."""
        return resolve_split(self.rf_params, self.splits_by_length, self.split, length)

    @property
    def split_label(self) -> str:
        """``12``, or ``12/14`` when the split changes with the length (in the order of the lengths)."""
        return "/".join(dict.fromkeys(str(self.split_at(n)) for n in (self.lengths or (0,))))

    @property
    def bound_tail(self) -> int:
        return resolve_tail(self.rf_params, self.tail)

    @property
    def arms(self) -> tuple[str, ...]:
        return ARMS if self.bare_params is None else (EXACT, BARE, RIDGEFILL)

    def shape(self, length: int, exact_rows: int | None = None) -> RidgeFillShape:
        tail = min(self.bound_tail, length)
        exact = int(round(self.exact_fraction * (length - tail))) if exact_rows is None else exact_rows
        return RidgeFillShape(num_tokens=length, split=self.split_at(length), tail=self.bound_tail, exact_rows=exact,
                              map_kind=self.map_kind)

    def arm_params(self, arm: str, length: int | None = None) -> dict[str, Any]:
        """An arm's ``custom_params``; the bare fill's split follows the RidgeFill arm's at ``length``."""
        if arm == EXACT:
            return EXACT_PARAMS
        if arm != BARE:
            return {"ridgefill": dict(self.rf_params)}
        params = dict(self.bare_params)
        if length is not None and "split" in params:
            params["split"] = self.split_at(length)
        return {"ridgefill": params}


def make_prompt(length: int, vocab_size: int, seed: int, pair: int) -> list[int]:
    """Random token ids for one pair; the low and high ends of the vocabulary (special tokens) are avoided."""
    lo = min(100, vocab_size // 4)
    hi = max(lo + 1, int(vocab_size * 0.95))
    rng = random.Random(f"sgl-ridgefill-bench:{seed}:{length}:{pair}")
    return [rng.randrange(lo, hi) for _ in range(length)]


def pair_order(pair: int, arms: tuple[str, ...] = ARMS) -> tuple[str, ...]:
    """The arms rotated by one per pair: with two arms, even pairs run exact first, odd pairs RidgeFill first."""
    k = pair % len(arms)
    return arms[k:] + arms[:k]


@dataclasses.dataclass(frozen=True)
class Record:
    length: int
    pair: int
    arm: str
    position: int  # 0: first in its pair, 1: second
    seconds: float
    cached_tokens: int
    server_cpu: Mapping[str, float] | None = None  # CPU seconds per server process during the request
    exact_rows: int | None = None  # prefix rows the response says ran exactly (RidgeFill arms)

    @property
    def scheduler_cores(self) -> float | None:
        """CPU seconds of the scheduler process over wall seconds: the cores it kept busy."""
        if not self.server_cpu or self.seconds <= 0:
            return None
        busy = [v for k, v in self.server_cpu.items() if "schedul" in k]  # /proc comm is cut at 15 chars
        return sum(busy) / self.seconds if busy else None


@dataclasses.dataclass(frozen=True)
class LengthSummary:
    """Per prompt length and RidgeFill arm (``arm``: ``ridgefill``, or ``bare`` for the bare fill beside a
    policy with rows): medians of exact and of the arm, the speedup (ratio of medians) with the spread of the
    per-pair ratios, both bounds (with the exact rows the arm's responses reported) and the fraction of each
    reached."""

    length: int
    exact_median: float
    ridgefill_median: float
    speedup: float
    pair_ratios: tuple[float, ...]
    layer_bound: float
    flop_bound: float
    cache_hits: int
    exact_cores: float | None = None  # median scheduler cores busy per arm (with a CPU probe)
    ridgefill_cores: float | None = None
    arm: str = RIDGEFILL
    exact_rows: float | None = None  # median exact prefix rows the arm's responses reported

    @property
    def ratio_min(self) -> float:
        return min(self.pair_ratios)

    @property
    def ratio_max(self) -> float:
        return max(self.pair_ratios)

    @property
    def layer_fraction(self) -> float:
        return self.speedup / self.layer_bound

    @property
    def flop_fraction(self) -> float:
        return self.speedup / self.flop_bound

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out.update(
            pair_ratios=list(self.pair_ratios), ratio_min=self.ratio_min, ratio_max=self.ratio_max,
            layer_fraction=self.layer_fraction, flop_fraction=self.flop_fraction,
        )
        return out


def summarize(records: Sequence[Record], config: BenchConfig, dims: ModelDims) -> list[LengthSummary]:
    out = []
    for length in config.lengths:
        rows = [r for r in records if r.length == length]
        for arm in config.arms[1:]:
            summary = _summary(rows, length, arm, config, dims)
            if summary is not None:
                out.append(summary)
    return out


def _summary(rows: Sequence[Record], length: int, arm: str, config: BenchConfig, dims: ModelDims) -> LengthSummary | None:
    by_pair: dict[int, dict[str, float]] = {}
    for r in rows:
        by_pair.setdefault(r.pair, {})[r.arm] = r.seconds
    complete = {p: t for p, t in by_pair.items() if EXACT in t and arm in t}
    if not complete:
        return None
    exact = [t[EXACT] for t in complete.values()]
    filled = [t[arm] for t in complete.values()]
    reported = [r.exact_rows for r in rows if r.arm == arm and r.exact_rows is not None]
    exact_rows = statistics.median(reported) if reported else None
    shape = config.shape(length, None if exact_rows is None else int(round(exact_rows)))
    selector = config.selector_flops.get(length, 0.0) if arm == RIDGEFILL else 0.0
    cores = {a: [r.scheduler_cores for r in rows if r.arm == a and r.scheduler_cores is not None] for a in (EXACT, arm)}
    return LengthSummary(
        length=length,
        exact_median=statistics.median(exact),
        ridgefill_median=statistics.median(filled),
        speedup=statistics.median(exact) / statistics.median(filled),
        pair_ratios=tuple(t[EXACT] / t[arm] for _, t in sorted(complete.items())),
        layer_bound=layer_pass_bound(shape, dims.num_layers),
        flop_bound=flop_bound(dims, shape, selector_flops=selector),
        cache_hits=sum(1 for r in rows if r.cached_tokens > 0 and r.arm in (EXACT, arm)),
        exact_cores=statistics.median(cores[EXACT]) if cores[EXACT] else None,
        ridgefill_cores=statistics.median(cores[arm]) if cores[arm] else None,
        arm=arm,
        exact_rows=exact_rows,
    )


def run_bench(
    client: TimingClient,
    config: BenchConfig,
    dims: ModelDims,
    *,
    progress: Callable[[str], None] | None = None,
    cpu_probe: CpuProbe | None = None,
) -> tuple[list[Record], list[LengthSummary]]:
    """Measure every length (after ``config.warmup`` untimed pairs at the first length)."""
    say = progress or (lambda _msg: None)

    def timed(ids: list[int], arm: str) -> tuple[Any, dict[str, float] | None]:
        if config.flush:
            client.flush_cache()
        before = cpu_probe.sample() if cpu_probe is not None else None
        t = client.time_generate(ids, config.arm_params(arm, len(ids)), stream=config.stream)
        cpu = cpu_probe.delta(before, cpu_probe.sample()) if cpu_probe is not None else None
        return t, cpu

    for w in range(config.warmup):
        ids = make_prompt(config.lengths[0], config.vocab_size, config.seed, -1 - w)
        for arm in pair_order(w, config.arms):
            timed(ids, arm)
        say(f"warm-up pair {w + 1}/{config.warmup} done")
    records: list[Record] = []
    for length in config.lengths:
        for pair in range(config.pairs):
            ids = make_prompt(length, config.vocab_size, config.seed, pair)
            for position, arm in enumerate(pair_order(pair, config.arms)):
                t, cpu = timed(ids, arm)
                rec = Record(length, pair, arm, position, float(t.seconds), int(getattr(t, "cached_tokens", 0)), cpu,
                             _reported_exact_rows(t) if arm != EXACT else None)
                records.append(rec)
                cores = f"  scheduler cores {rec.scheduler_cores:.2f}" if rec.scheduler_cores is not None else ""
                say(f"N={length} pair {pair + 1}/{config.pairs} {arm:9s} {t.seconds:8.3f} s{cores}")
    return records, summarize(records, config, dims)


def _reported_exact_rows(timing: Any) -> int | None:
    """The exact prefix rows a RidgeFill response reports (``meta_info["ridgefill"]["exact"]``), if any."""
    info = (getattr(timing, "meta_info", None) or {}).get("ridgefill")
    if isinstance(info, list):
        info = info[0] if info else None
    if not isinstance(info, Mapping) or not info.get("ran"):
        return None
    value = info.get("exact")
    return int(value) if isinstance(value, int) else None
