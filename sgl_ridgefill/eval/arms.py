"""The arms and controls an evaluation compares, as per-request ``custom_params["ridgefill"]``.

The RidgeFill server an evaluation talks to runs with a rows policy (``rows_policy_text``) as its own
policy, so an arm without ``"policy"`` gets the policy's selected rows; the arms without rows name the
shipped ``plain`` policy (no selection). Every arm carries the split and tail explicitly.

Diagnostic arms (where the fill's error sits, and whether the needle's rows are the lever):

- ``splice:KIND@FIRST-LAST`` (loss): the splice on upper layers FIRST..LAST only, the others keep the fill;
  :func:`splice_ranges` gives the default ranges, the filled upper layers cut in two halves;
- ``ridgefill+needle-rows`` (needles): the sample's own needle tokens run exactly (``exact_rows``), an
  oracle for "the needle rows' keys are the lever"; ``ridgefill+needle-random``: as many random prefix rows.

Later-question arms (needles, ``niah_multikey``; asked for by name, not part of ``all``): the sample's
question asked second (``ridgefill+rows@q2``) or third (``ridgefill+rows@q3``) on the same document, after
questions about its other keys filled it and chose its rows; the later question reuses that cached KV
(the rows policy's namespace cache mode), as a document-QA client would.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..tools.flops import ModelDims, RidgeFillShape, ridgefill_prefill_flops
from ..request_schema import SPLICES, parse_splice

EXACT, NOFILL, IDENTITY, RIDGEFILL = "exact", "nofill", "identity", "ridgefill"
IDENTITY_ROWS, RIDGEFILL_ROWS, RIDGEFILL_RANDOM, NOFILL_LONGTAIL = (
    "identity+rows", "ridgefill+rows", "ridgefill+random", "nofill+longtail",
)
RIDGEFILL_NEEDLE_ROWS, RIDGEFILL_NEEDLE_RANDOM = "ridgefill+needle-rows", "ridgefill+needle-random"
SPLICE = "splice:"
SPLICE_ARMS = tuple(f"{SPLICE}{s}" for s in SPLICES)  # every upper layer; splice_arm() names a layer range
CUT = "cut"  # loss only: the tail scored with the context cut to the tail itself

# The same arms on every prompt, needle or document.
COMMON_ARMS = (EXACT, NOFILL, IDENTITY, RIDGEFILL, IDENTITY_ROWS, RIDGEFILL_ROWS, RIDGEFILL_RANDOM, NOFILL_LONGTAIL)
NEEDLE_ROW_ARMS = (RIDGEFILL_NEEDLE_ROWS, RIDGEFILL_NEEDLE_RANDOM)  # needles only: they need the needle spans
NEEDLE_ARMS = COMMON_ARMS + NEEDLE_ROW_ARMS
LATER_ARMS = ("ridgefill+rows@q2", "ridgefill+rows@q3")  # the question asked 2nd / 3rd on a cached document
LOSS_ARMS = COMMON_ARMS + SPLICE_ARMS
ALL_ARMS = NEEDLE_ARMS + LATER_ARMS + SPLICE_ARMS + (CUT,)
# Display order in every table and plot; a layer-range splice follows its all-layer splice.
ARM_ORDER = (EXACT, NOFILL, IDENTITY, RIDGEFILL, IDENTITY_ROWS, RIDGEFILL_ROWS, *LATER_ARMS, RIDGEFILL_RANDOM,
             RIDGEFILL_NEEDLE_ROWS, RIDGEFILL_NEEDLE_RANDOM, NOFILL_LONGTAIL, *SPLICE_ARMS, CUT)
ROWS_SHARE = 10  # percent of the prefix the rows arms select (the reference "+ rows" arms)
ROWS_POLICY = "eval-rows"


def default_rows_select(split: int, share: int = ROWS_SHARE) -> str:
    """The reference "+ rows" selection: attention top-k rows from the last 64 prompt tokens, summed over
    layers 3, 7, 11 and 15 where they lie below the split (the reference studies' choice), else layer S-1."""
    layers = [layer for layer in (3, 7, 11, 15) if layer < split] or [split - 1]
    return f"attention_topk(q=64, share={share}%, layers=[{', '.join(map(str, layers))}])"


def rows_policy_text(split: int, tail: int, select: str | None = None, cache: str = "namespace") -> str:
    """The server policy of an evaluation: ``select`` (the body of a ``.rfpolicy`` ``select`` statement, its
    clauses included), by default :func:`default_rows_select`. Its cache mode is ``namespace``, for the
    later-question arms (every other request starts from an emptied cache, so it reuses nothing);
    ``no_insert`` on hybrid models, whose namespace mode the server refuses."""
    what = f"{ROWS_SHARE} % of the prefix by attention" if select is None else "--rows-select"
    return (
        f"# Written by sgl-ridgefill eval: the \"+ rows\" arms ({what}).\n"
        f'policy "{ROWS_POLICY}" {{\n  arm ridgefill\n  split {split}\n  tail {tail}\n'
        f"  select {select or default_rows_select(split)}\n"
        f"  cache {cache}\n}}\n"
    )


def check_rows_select(select: str, split: int) -> None:
    """``ValueError`` naming the problem when ``select`` does not make a rows policy at ``split``: it must parse
    and compile as the body of a ``select`` statement and pick rows (the server checks it against the model)."""
    from ..policy import PolicyError, compile_policy, parse_policy

    try:
        policy = compile_policy(parse_policy(rows_policy_text(split, 1, select), "--rows-select"))
    except PolicyError as e:
        raise ValueError(f"--rows-select {select!r} is not a selection this model can run:\n{e}") from None
    if not policy.has_selection():
        raise ValueError(f"--rows-select {select!r} selects no rows")


def longtail_tail(config: Mapping[str, Any], length: int, split: int, tail: int, map_kind: str | None = None) -> int:
    """The tail at which the no-fill arm costs what RidgeFill costs at ``tail`` with maps of ``map_kind`` (FLOP
    count, tools/flops.py): the fill's multiply-adds spent on more exact tail rows instead."""
    dims = ModelDims.from_hf_config(config)
    shape = RidgeFillShape(num_tokens=length, split=split, tail=tail, map_kind=map_kind)
    target = ridgefill_prefill_flops(dims, shape).total
    lo, hi = tail, length
    while lo < hi:  # the no-fill cost grows with the tail; the smallest tail whose cost reaches the target
        mid = (lo + hi) // 2
        flops = ridgefill_prefill_flops(dims, RidgeFillShape(num_tokens=length, split=split, tail=mid))
        if flops.total - flops.fill >= target:
            hi = mid
        else:
            lo = mid + 1
    return lo


def is_splice(arm: str) -> bool:
    """Whether ``arm`` is a splice test, on every upper layer or on a layer range."""
    return arm.startswith(SPLICE)


def splice_arm(kind: str, layers: tuple[int, int] | None = None) -> str:
    """``splice:KIND`` or ``splice:KIND@FIRST-LAST``."""
    return f"{SPLICE}{kind}" + ("" if layers is None else f"@{layers[0]}-{layers[1]}")


def splice_parts(arm: str) -> tuple[str, tuple[int, int] | None] | None:
    """``(kind, (first, last) or None)`` of a splice arm; None when ``arm`` is no valid splice arm."""
    if not is_splice(arm):
        return None
    value = arm[len(SPLICE):]
    kind, at, layers = value.partition("@")
    if kind not in SPLICES or (at and not _is_range(layers)):
        return None
    return parse_splice(value)


def _is_range(text: str) -> bool:
    """``FIRST-LAST`` with ``FIRST <= LAST`` (arm names always spell both ends)."""
    first, dash, last = text.partition("-")
    return dash == "-" and first.isdigit() and last.isdigit() and int(first) <= int(last)


def splice_ranges(split: int, num_layers: int) -> tuple[tuple[int, int], ...]:
    """The default layer ranges of the per-layer splices: the upper layers whose input the map predicts,
    ``split + 1 .. num_layers - 1`` (layer ``split`` itself reads the exact split state), cut in two halves,
    the second one the larger when they cannot be equal (split 12 of 24: 13-17 and 18-23)."""
    first, last = split + 1, num_layers - 1
    if first > last:
        return ()
    if first == last:
        return ((first, last),)
    middle = first + (last - first + 1) // 2
    return ((first, middle - 1), (middle, last))


def parse_splice_layers(text: str, split: int, num_layers: int) -> tuple[tuple[int, int], ...]:
    """``--splice-layers``: ``auto`` (:func:`splice_ranges`), ``none``, or ``FIRST-LAST,...`` (a single layer
    ``L`` is ``L-L``) within the upper layers ``split .. num_layers - 1``. Raises ``ValueError`` naming the bad
    range."""
    text = text.strip()
    if text == "auto":
        return splice_ranges(split, num_layers)
    if text == "none":
        return ()
    ranges = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        part = f"{part}-{part}" if part.isdigit() else part
        if not _is_range(part):
            raise ValueError(f"--splice-layers {text!r}: {part!r} is not FIRST-LAST (e.g. 13-17), 'auto' or 'none'")
        first, last = (int(x) for x in part.split("-"))
        if not split <= first <= last < num_layers:
            raise ValueError(f"--splice-layers {text!r}: {part} is outside the upper layers {split}-{num_layers - 1} "
                             f"(split {split} of {num_layers} layers)")
        ranges.append((first, last))
    if not ranges:
        raise ValueError(f"--splice-layers {text!r}: give FIRST-LAST ranges, 'auto' or 'none'")
    return tuple(dict.fromkeys(ranges))


def needle_rows(spans: tuple[tuple[int, int], ...]) -> list[int]:
    """Every token position of the needle spans ``[start, end)``: the ``exact_rows`` of the needle-row oracle."""
    return sorted({p for start, end in spans for p in range(start, end)})


def arm_params(arm: str, *, split: int, tail: int, longtail: int | None = None, seed: int = 0,
               needle_spans: tuple[tuple[int, int], ...] | None = None) -> dict[str, Any]:
    """``custom_params`` for one request of ``arm``; ``seed`` draws the random controls' rows;
    ``needle_spans`` (the sample's) are the needle-row arms' exact rows."""
    base = {"split": split, "tail": tail}
    if arm in (EXACT, CUT):
        return {"ridgefill": {"arm": "exact"}}
    if arm in (NOFILL, IDENTITY, RIDGEFILL):
        return {"ridgefill": {**base, "arm": arm, "policy": "plain"}}
    if arm in (IDENTITY_ROWS, RIDGEFILL_ROWS):
        return {"ridgefill": {**base, "arm": arm.split("+")[0], "policy": ROWS_POLICY}}
    if arm in LATER_ARMS:
        return {"ridgefill": {**base, "arm": RIDGEFILL, "policy": ROWS_POLICY}}
    if arm == RIDGEFILL_RANDOM:
        return {"ridgefill": {**base, "arm": RIDGEFILL, "policy": ROWS_POLICY, "control": "random", "seed": seed}}
    if arm == NOFILL_LONGTAIL:
        if longtail is None:
            raise ValueError("the nofill+longtail arm needs its tail (longtail_tail)")
        return {"ridgefill": {"split": split, "tail": longtail, "arm": NOFILL, "policy": "plain"}}
    if arm in NEEDLE_ROW_ARMS:
        if not needle_spans:
            raise ValueError(f"the {arm} arm needs the sample's needle spans")
        rows = {"exact_rows": needle_rows(needle_spans)}
        if arm == RIDGEFILL_NEEDLE_RANDOM:
            rows.update(control="random", seed=seed)
        return {"ridgefill": {**base, "arm": RIDGEFILL, "policy": "plain", **rows}}
    if splice_parts(arm) is not None:
        return {"ridgefill": {**base, "arm": RIDGEFILL, "policy": "plain", "splice": arm[len(SPLICE):]}}
    raise ValueError(f"unknown arm {arm!r}; known: {', '.join(ALL_ARMS)}")


def later_position(arm: str) -> int | None:
    """Which question on the cached document a later-question arm asks (2 or 3); ``None`` for other arms."""
    return LATER_ARMS.index(arm) + 2 if arm in LATER_ARMS else None


def parse_arms(text: str, allowed: tuple[str, ...], also: tuple[str, ...] = ()) -> tuple[str, ...]:
    """``"all"`` (``allowed``) or a comma-separated list of arm names from ``allowed`` and ``also`` (``exact``
    is always included: everything is paired against it). Where ``allowed`` holds the splices, a layer-range
    splice ``splice:KIND@FIRST-LAST`` is allowed too."""
    if text == "all":
        return allowed
    allowed = allowed + also
    arms = tuple(a.strip() for a in text.split(",") if a.strip())
    ranged = any(is_splice(a) for a in allowed)
    unknown = [a for a in arms if a not in allowed and not (ranged and splice_parts(a) is not None)]
    if unknown:
        known = ", ".join(allowed) + (", splice:KIND@FIRST-LAST" if ranged else "")
        raise ValueError(f"unknown arm(s) {', '.join(unknown)}; known: {known}")
    return tuple(dict.fromkeys((EXACT,) + arms))


def with_splice_ranges(arms: tuple[str, ...], ranges: tuple[tuple[int, int], ...]) -> tuple[str, ...]:
    """``arms`` plus ``splice:keys@FIRST-LAST`` for each of ``ranges`` when ``splice:keys`` is among them
    (the per-layer splices are reported beside the all-layer one)."""
    if splice_arm("keys") not in arms:
        return arms
    return tuple(dict.fromkeys(arms + tuple(splice_arm("keys", r) for r in ranges)))


def arm_sort_key(arm: str) -> tuple[int, int, str]:
    """Display order: :data:`ARM_ORDER`, a layer-range splice after its all-layer splice by first layer,
    unknown arms last, alphabetically."""
    parts = splice_parts(arm)
    if parts is not None and parts[1] is not None:
        return (ARM_ORDER.index(splice_arm(parts[0])), parts[1][0], arm)
    if arm in ARM_ORDER:
        return (ARM_ORDER.index(arm), -1, "")
    return (len(ARM_ORDER), -1, arm)
