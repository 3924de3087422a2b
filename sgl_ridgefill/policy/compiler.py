"""``PolicyAst`` -> ``CompiledPolicy``: resolve defaults, check every value against the maps folder
and the model, and bind the selection. Everything the runtime needs is decided here, once per policy.

Defaults: ``arm ridgefill``; ``split`` from the maps folder's default; ``tail 1024``; ``cache auto``;
no selection, no corrections. ``split S from N tokens`` lines give prompts of at least ``N`` tokens
another split; the selection is bound against the smallest split the policy can run at. Serving needs
a split, written or from the maps folder; ``policy check`` without ``--maps`` leaves a maps-folder
split unresolved (``defer_split``) and checks the rest.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re

import torch

from sgl_ridgefill.selectors.base import Requirement, SelectionInputs
from sgl_ridgefill.selectors.rows import empty_rows
from sgl_ridgefill.selectors.spec import BindContext

from . import ast
from .corrections import TerminalState, ValueRescale, compile_correction
from .errors import PolicyError, Span, did_you_mean
from .formatter import format_literal, format_policy
from .plan import SelectionPlan
from .selection import compile_selection
from .targets import MapsInfo, ModelInfo

from ..vocabulary import ARMS, CACHE_MODES, DEFAULT_ARM, DEFAULT_CACHE_MODE, DEFAULT_TAIL  # noqa: F401 - re-exported

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")


@dataclasses.dataclass(frozen=True)
class CompiledPolicy:
    """A checked policy with every default resolved.

    split: layers ``0..split-1`` run exactly for every row (for ``arm exact`` it is unused: the number
        of layers when known, else the written value or 0). None only when compiled with
        ``defer_split=True`` and neither the policy nor a maps folder gives one. It is the split of
        prompts shorter than every ``splits_by_length`` threshold.
    splits_by_length: ``(tokens, split)`` pairs, ascending, from ``split S from N tokens``: a prompt of
        at least ``tokens`` tokens runs at ``split`` (the largest threshold it reaches wins); see
        :meth:`split_for`.
    tail: the last ``tail`` prompt rows run every layer exactly (default 1024).
    requirements: statistics the runtime computes before calling ``select``.
    identity: short hash of the canonical policy (comments excluded) and the resolved split and tail;
        part of cache namespaces.
    needs_tokens / needs_token_counts: ``select`` reads ``SelectionInputs.tokens`` / ``.token_counts``.
    warnings: advice that does not stop the policy (``policy check`` prints it).
    """

    name: str
    arm: str
    split: int | None
    tail: int
    cache_mode: str
    value_rescale_c: int | None
    terminal_state: TerminalState | None
    requirements: tuple[Requirement, ...]
    identity: str
    selection: SelectionPlan | None = None
    needs_tokens: bool = False
    needs_token_counts: bool = False
    warnings: tuple[str, ...] = ()
    splits_by_length: tuple[tuple[int, int], ...] = ()
    source: ast.PolicyAst | None = dataclasses.field(default=None, compare=False, repr=False)

    def split_for(self, prompt_tokens: int | None) -> int | None:
        """The split a prompt of ``prompt_tokens`` tokens runs at (``None``: length unknown, the base split)."""
        split = self.split
        for tokens, longer in self.splits_by_length:
            if prompt_tokens is not None and prompt_tokens >= tokens:
                split = longer
        return split

    def has_selection(self) -> bool:
        """Whether the policy computes any prefix rows exactly (besides the tail)."""
        return self.selection is not None

    def select(self, inputs: SelectionInputs) -> torch.Tensor:
        """Exact prefix rows for one request: sorted unique [k] int64 in [0, inputs.prefix_len)."""
        if self.selection is None:
            return empty_rows()
        return self.selection.select(inputs)


def describe_splits(base, by_length: tuple[tuple[int, int], ...]) -> str:
    """``12``, or ``12 (14 from 12288 tokens)``: a base split and the ``(tokens, split)`` pairs of a schedule."""
    longer = ", ".join(f"{split} from {tokens} tokens" for tokens, split in by_length)
    return f"{base} ({longer})" if longer else str(base)


class _Compiler:
    def __init__(self, policy: ast.PolicyAst, maps: MapsInfo | None, model: ModelInfo | None, defer_split: bool) -> None:
        self.policy = policy
        self.maps = maps
        self.model = model
        self.defer_split = defer_split

    def fail(self, message: str, span: Span | None = None) -> PolicyError:
        span = span if span is not None else self.policy.name_span
        return PolicyError(message, span=span, source=self.policy.source, filename=self.policy.filename)

    def statements(self) -> dict[type, ast.Statement]:
        found: dict[type, ast.Statement] = {}
        for stmt in self.policy.statements:
            if isinstance(stmt, ast.CorrectStmt) or (isinstance(stmt, ast.SplitStmt) and stmt.from_tokens is not None):
                continue
            if type(stmt) in found:
                first = found[type(stmt)].span
                where = f" (first at line {first.line})" if first is not None else ""
                keyword = ast.STATEMENT_KEYWORDS[type(stmt)]
                raise self.fail(f"{keyword} is set twice{where}", stmt.span)
            found[type(stmt)] = stmt
        return found

    def num_layers(self) -> int | None:
        maps, model = self.maps, self.model
        if maps is not None and model is not None and maps.num_layers != model.num_layers:
            raise self.fail(
                f"the maps folder was fitted on a {maps.num_layers}-layer model, but this model has {model.num_layers} layers"
            )
        if model is not None:
            return model.num_layers
        return maps.num_layers if maps is not None else None

    def arm(self, stmt: ast.ArmStmt | None) -> str:
        if stmt is None:
            return DEFAULT_ARM
        if stmt.value not in ARMS:
            hint = did_you_mean(stmt.value, ARMS) or f"; arms: {', '.join(ARMS)}"
            raise self.fail(f"unknown arm {stmt.value!r}{hint}", stmt.value_span)
        return stmt.value

    def whole(self, what: str, lit: ast.Number) -> int:
        if not isinstance(lit, ast.IntLit):
            raise self.fail(f"{what} must be a whole number, got {format_literal(lit)}", lit.span)
        return lit.value

    def split(self, stmt: ast.SplitStmt | None, arm: str, layers: int | None) -> int | None:
        if stmt is None:
            if arm == "exact":
                return layers if layers is not None else 0
            if self.maps is not None:
                return self.maps.default_split
            if self.defer_split:
                return None
            raise self.fail(
                f"split is not set and there is no maps folder to take a default from; add a line such as "
                f"`split {layers // 2 if layers else 12}`"
            )
        return self.split_value(stmt, arm, layers)

    def split_value(self, stmt: ast.SplitStmt, arm: str, layers: int | None) -> int:
        split = self.whole("split", stmt.value)
        span = stmt.value.span
        if split < 1:
            raise self.fail(f"split must be at least 1, got {split}", span)
        if layers is not None and split > layers:
            raise self.fail(f"split {split} is out of range: the model has {layers} layers (split 1 to {layers})", span)
        if arm == "ridgefill" and self.maps is not None and split != self.maps.num_layers and split not in self.maps.splits:
            have = ", ".join(str(s) for s in self.maps.splits)
            noun = "split" if len(self.maps.splits) == 1 else "splits"
            raise self.fail(f"split {split} has no maps in the maps folder, which has {noun} {have}", span)
        return split

    def splits_by_length(self, arm: str, layers: int | None) -> tuple[tuple[int, int], ...]:
        """The ``split S from N tokens`` lines as ``(N, S)``, ascending in ``N``."""
        seen: dict[int, ast.SplitStmt] = {}
        for stmt in self.policy.statements:
            if not isinstance(stmt, ast.SplitStmt) or stmt.from_tokens is None:
                continue
            if arm == "exact":
                raise self.fail("arm exact runs every layer exactly for every prompt: a split by prompt length has "
                                 "nothing to choose", stmt.span)
            lit = stmt.from_tokens
            if not isinstance(lit, ast.IntLit):
                raise self.fail(f"a split's prompt length must be a whole number, got {format_literal(lit)}", lit.span)
            if lit.value < 1:
                raise self.fail(f"a split's prompt length must be at least 1 token, got {lit.value}", lit.span)
            if lit.value in seen:
                first = seen[lit.value].span
                where = f" (first at line {first.line})" if first is not None else ""
                raise self.fail(f"split from {lit.value} tokens is set twice{where}", stmt.span)
            seen[lit.value] = stmt
        return tuple((tokens, self.split_value(stmt, arm, layers)) for tokens, stmt in sorted(seen.items()))

    def tail(self, stmt: ast.TailStmt | None) -> int:
        if stmt is None:
            return DEFAULT_TAIL
        tail = self.whole("tail", stmt.value)
        if tail < 1:
            raise self.fail(f"tail must be at least 1 row, got {tail}", stmt.value.span)
        return tail

    def cache(self, stmt: ast.CacheStmt | None) -> str:
        if stmt is None:
            return DEFAULT_CACHE_MODE
        if stmt.value not in CACHE_MODES:
            hint = did_you_mean(stmt.value, CACHE_MODES) or f"; cache modes: {', '.join(CACHE_MODES)}"
            raise self.fail(f"unknown cache mode {stmt.value!r}{hint}", stmt.value_span)
        return stmt.value

    def corrections(self, arm: str, split: int | None, tail: int) -> tuple[ValueRescale | None, TerminalState | None]:
        seen: dict[str, ast.CorrectStmt] = {}
        rescale = terminal = None
        for stmt in self.policy.statements:
            if not isinstance(stmt, ast.CorrectStmt):
                continue
            fix = compile_correction(stmt.call, arm=arm, split=split, tail=tail, model=self.model, fail=self.fail)
            if stmt.call.name in seen:
                raise self.fail(f"correction {stmt.call.name}() is given twice", stmt.span)
            seen[stmt.call.name] = stmt
            if isinstance(fix, ValueRescale):
                rescale = fix
            else:
                terminal = fix
        return rescale, terminal

    def name(self) -> str:
        if not _NAME.fullmatch(self.policy.name):
            raise self.fail(
                f"policy name {format_literal(ast.StrLit(self.policy.name))} must be 1 to 100 letters, digits, "
                "'.', '_' or '-', starting with a letter or digit"
            )
        return self.policy.name

    def warnings(self, arm: str, split: int | None, layers: int | None, selection: SelectionPlan | None, cache: str) -> tuple[str, ...]:
        notes = []
        model = self.model
        shallow = split is not None and model is not None and 2 * split < model.num_layers
        if arm == "ridgefill" and shallow and not model.has_qk_norm and selection is None:
            notes.append(
                f"split {split} is shallower than half of {model.num_layers} layers on a model without QK-norm; such "
                "splits can be worse than identity fill: prefer half depth or deeper, or select attention rows"
            )
        if cache == "namespace" and selection is not None:
            asks = [s.spec.name for s in selection.selectors() if s.spec.name in ("probe", "lexical_net") or dict(s.args).get("query") == "last"]
            if asks:
                notes.append(
                    f"cache namespace shares filled rows across requests, but {asks[0]}() chooses rows by the question; "
                    "a reused cache is unverified for other questions (prefer query=\"before_tail\" or no selection)"
                )
        return tuple(notes)

    def compile(self) -> CompiledPolicy:
        name = self.name()
        found = self.statements()
        layers = self.num_layers()
        arm = self.arm(found.get(ast.ArmStmt))
        split = self.split(found.get(ast.SplitStmt), arm, layers)
        by_length = self.splits_by_length(arm, layers)
        # The selection and corrections must hold at every split a request can run at: the smallest binds.
        known = [s for s in (split, *(s for _, s in by_length)) if s is not None]
        lowest = min(known) if split is not None else None  # a deferred base split could be the smallest
        tail = self.tail(found.get(ast.TailStmt))
        cache = self.cache(found.get(ast.CacheStmt))
        for other in sorted(set(known) - {lowest}):
            self.corrections(arm, other, tail)
        rescale, terminal = self.corrections(arm, lowest, tail)
        selection = None
        select = found.get(ast.SelectStmt)
        if select is not None:
            if arm == "exact":
                raise self.fail("arm exact computes every row exactly, so select has nothing to choose", select.span)
            context = BindContext(
                arm=arm,
                split=lowest,
                tail=tail,
                num_layers=layers,
                attention_layers=self.model.attention_layers if self.model is not None else None,
            )
            selection = compile_selection(select, context, self.fail)
        selectors = selection.selectors() if selection is not None else ()
        canonical = format_policy(self.policy, comments=False) + f"resolved arm={arm} split={split} tail={tail}\n"
        return CompiledPolicy(
            name=name,
            arm=arm,
            split=split,
            tail=tail,
            cache_mode=cache,
            value_rescale_c=rescale.c if rescale is not None else None,
            terminal_state=terminal,
            requirements=selection.requirements() if selection is not None else (),
            identity=hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:16],
            selection=selection,
            needs_tokens=any(s.needs_tokens for s in selectors),
            needs_token_counts=any(s.needs_token_counts for s in selectors),
            warnings=self.warnings(arm, split, layers, selection, cache),
            splits_by_length=by_length,
            source=self.policy,
        )


def compile_policy(
    policy: ast.PolicyAst, *, maps: MapsInfo | None = None, model: ModelInfo | None = None, defer_split: bool = False
) -> CompiledPolicy:
    """Check ``policy`` against the maps folder and the model (either may be None) and resolve it.

    A policy without ``split`` takes the maps folder's default; with no maps folder it is refused, unless
    ``defer_split`` (``policy check`` without ``--maps``): then its split stays None, to be decided by the
    maps folder at serve time, and checks that need the split are skipped. Serving never defers.

    Raises ``PolicyError`` (and nothing else for a parsed policy) with the offending place marked.
    """
    return _Compiler(policy, maps, model, defer_split).compile()
