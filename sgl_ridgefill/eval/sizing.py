"""How many prompts an evaluation runs: the needle grid's settings, presets of them, and the count printed
before a run starts.

The needle samples are every task x haystack x seed x depth of ``needles.depth_grid``: ``--depths`` positions
over the filled prefix plus four around the tail boundary, of which two (256 and 32 tokens before it) are
in the filled prefix too. So a niah task gives ``haystacks x seeds x (depths + 2)`` filled-region samples
(cwe: one straddling sample per seed). Telling a 5-point retrieval difference from noise takes about 100
paired filled-region samples: the ``quality`` preset gives 2 x 2 x 2 x 12 = 96.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any


@dataclasses.dataclass(frozen=True)
class Preset:
    """Needle-grid settings that stand in for the flags of the same names; a flag given explicitly wins."""

    name: str
    doc: str
    tasks: str
    depths: int
    seeds: int
    lengths: tuple[int, ...]
    haystacks: str
    min_filled: int = 0  # the run warns when it makes fewer filled-region samples

    def settings(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in GRID}


GRID = ("tasks", "depths", "seeds", "lengths", "haystacks")
DEFAULTS = {"tasks": "niah_single", "depths": 5, "seeds": 1, "lengths": (4096,), "haystacks": "noise,text"}
PRESETS = {p.name: p for p in (
    Preset("quality", "the headline comparisons: 96 filled-region samples at 4K, paired across maps folders and splits",
           tasks="niah_single,niah_multikey", depths=10, seeds=2, lengths=(4096,), haystacks="noise,text",
           min_filled=96),
)}


def preset_help() -> str:
    return "; ".join(f"{p.name}: {p.doc} (--tasks {p.tasks} --depths {p.depths} --seeds {p.seeds} "
                     f"--lengths {','.join(map(str, p.lengths))} --haystacks {p.haystacks})" for p in PRESETS.values())


def apply_preset(args: argparse.Namespace) -> Preset | None:
    """Fill the needle-grid flags the command line left out (``None``) from ``args.preset``, then from
    :data:`DEFAULTS`; returns the preset (None without one). Raises ``ValueError`` for an unknown preset."""
    preset = None
    if getattr(args, "preset", None) is not None:
        if args.preset not in PRESETS:
            raise ValueError(f"--preset {args.preset!r}: known presets are {', '.join(PRESETS)}")
        preset = PRESETS[args.preset]
    for name in GRID:
        if getattr(args, name, None) is None:
            setattr(args, name, (preset.settings() if preset else DEFAULTS)[name])
    return preset


def sample_counts(samples: Iterable[Any]) -> dict[str, int]:
    """Samples per region, and ``total``."""
    counts = collections.Counter(s.region for s in samples)
    return {"total": sum(counts.values()), "filled": counts["filled"], "tail": counts["tail"],
            "straddle": counts["straddle"]}


def request_counts(samples: Sequence[Any], needle_arms: Sequence[str], docs: Mapping[int, Sequence[Any]],
                   loss_arms: Sequence[str]) -> tuple[int, int]:
    """The needle requests and the loss requests (the loss arms plus the cut arm per document) of a run."""
    n_docs = sum(len(d) for d in docs.values())
    return len(samples) * len(needle_arms), n_docs * (len(loss_arms) + 1)


def plan_text(samples: Sequence[Any], needle_arms: Sequence[str], docs: Mapping[int, Sequence[Any]],
              loss_arms: Sequence[str]) -> str:
    """What a run will send, before it starts: samples by region, documents, and requests (the loss arms
    plus the cut arm per document)."""
    counts = sample_counts(samples)
    n_docs = sum(len(d) for d in docs.values())
    needle_requests, loss_requests = request_counts(samples, needle_arms, docs, loss_arms)
    regions = ", ".join(f"{counts[r]} {r}" for r in ("filled", "tail", "straddle") if counts[r])
    return (f"{counts['total']} needle samples ({regions or 'none'}) x {len(needle_arms)} arms = {needle_requests} "
            f"requests; {n_docs} documents x {len(loss_arms) + 1} arms (with cut) = {loss_requests} requests; "
            f"{needle_requests + loss_requests} in all (before resuming)")


def too_few_filled(preset: Preset | None, samples: Iterable[Any]) -> str | None:
    """A warning when ``preset`` asks for more filled-region samples than ``samples`` hold."""
    if preset is None or not preset.min_filled:
        return None
    filled = sample_counts(samples)["filled"]
    if filled >= preset.min_filled:
        return None
    return (f"warning: {filled} filled-region samples, fewer than the {preset.min_filled} the {preset.name} preset "
            "is sized for; a 5-point difference may not be told from noise")
