"""The selector registry: every name a policy may call, in one place.

Importing this module registers the built-in selectors. Other code adds its own with
``SELECTORS.register(spec)``; a duplicate name is refused, and an unknown name is answered with the
known ones.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Generic, TypeVar

from . import attention, lexical, probe, random_control, token_classes
from .random_control import random_rows
from .spec import SelectorSpec

__all__ = ["RESERVED_NAMES", "SELECTORS", "Registry", "UnknownNameError", "random_rows"]

T = TypeVar("T")

# Words the policy language uses for its own syntax or operators; a selector named like one could
# never be called.
RESERVED_NAMES = frozenset(
    {"policy", "arm", "split", "tail", "select", "budget", "reserve", "up", "to", "plus", "correct", "cache",
     "top", "size", "true", "false", "from", "tokens"}
)


class UnknownNameError(LookupError):
    """A name that is not registered; ``known`` lists the registered names."""

    def __init__(self, kind: str, name: str, known: tuple[str, ...]) -> None:
        super().__init__(f"unknown {kind} {name!r}; known {kind}s: {', '.join(known) or '(none)'}")
        self.name = name
        self.known = known


class Registry(Generic[T]):
    """Name -> item, refusing duplicates; ``kind`` names the items in messages ("selector")."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}

    def add(self, name: str, item: T) -> T:
        if name in self._items:
            raise ValueError(f"{self.kind} {name!r} is already registered")
        if name in RESERVED_NAMES:
            raise ValueError(f"{self.kind} name {name!r} is a reserved word of the policy language")
        self._items[name] = item
        return item

    def get(self, name: str) -> T:
        try:
            return self._items[name]
        except KeyError:
            raise UnknownNameError(self.kind, name, self.names()) from None

    def names(self) -> tuple[str, ...]:
        return tuple(sorted(self._items))

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._items)


class SelectorRegistry(Registry[SelectorSpec]):
    def register(self, spec: SelectorSpec) -> SelectorSpec:
        """Register ``spec`` under ``spec.name``."""
        return self.add(spec.name, spec)


SELECTORS = SelectorRegistry("selector")
for _spec in (
    attention.SPEC,
    token_classes.PROTECTED_CLASSES,
    lexical.SPEC,
    token_classes.DIGITS,
    token_classes.SPECIAL_TOKENS,
    random_control.SPEC,
    probe.SPEC,
):
    SELECTORS.register(_spec)
