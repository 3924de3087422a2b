"""The shape of sgl-ridgefill's hook table and its machinery: a :class:`Hook` row, the targets of the rows that
apply in a process, the README's table, registration with SGLang's ``HookRegistry``, and the startup check
that every hook took effect. ``patches.py`` declares the rows (every change to SGLang, once)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass

logger = logging.getLogger("sgl_ridgefill")

ALWAYS, CPU, ENABLED = "always", "cpu", "enabled"  # every process; the CPU recipe; --prefill-backend ridgefill
WHEN_TEXT = {ALWAYS: "always", CPU: "CPU recipe", ENABLED: "RidgeFill on"}


@dataclass(frozen=True)
class Hook:
    """One change to SGLang: ``function`` on ``targets`` (dotted names), ``when`` it applies; an ``after_*``
    function runs after the target, an ``around_*`` one instead of it (given the original first)."""

    targets: tuple[str, ...]
    function: Callable
    when: str

    @property
    def kind(self) -> str:
        return self.function.__name__.split("_", 1)[0]

    def __post_init__(self) -> None:
        assert self.kind in ("after", "around") and self.when in WHEN_TEXT, self


def targets_of(hooks: Iterable[Hook], *when: str) -> tuple[str, ...]:
    """The dotted targets of the hooks that apply ``when``, in registration order."""
    return tuple(t for hook in hooks if hook.when in when for t in hook.targets)


def markdown(hooks: Iterable[Hook]) -> str:
    """The README's table of hooks: what each patches, how, and when."""
    lines = ["| SGLang target | hook | when |", "|---|---|---|"]
    for hook in hooks:
        shown = ", ".join(f"`{t}`" for t in hook.targets)
        lines.append(f"| {shown} | `{hook.function.__name__}` ({hook.kind.upper()}) | {WHEN_TEXT[hook.when]} |")
    return "\n".join(lines) + "\n"


def register(hooks: Iterable[Hook], when: tuple[str, ...]) -> tuple[str, ...]:
    """Register with SGLang's ``HookRegistry`` the hooks that apply ``when``, in order; returns their targets."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    kinds = {"after": HookType.AFTER, "around": HookType.AROUND}
    hooks = tuple(hooks)
    for hook in hooks:
        if hook.when in when:
            for target in hook.targets:
                HookRegistry.register(target, hook.function, kinds[hook.kind])
    return targets_of(hooks, *when)


def missing_hooks(targets: tuple[str, ...]) -> list[str]:
    """Targets whose hook is not in place (never applied, or replaced since)."""
    import inspect
    import pkgutil

    from sglang.srt.plugins.hook_registry import HookRegistry

    missing = []
    for target in targets:
        if target not in HookRegistry._patched:  # noqa: SLF001
            missing.append(target)
            continue
        owner, attr = target.rsplit(".", 1)
        fn = inspect.getattr_static(pkgutil.resolve_name(owner), attr, None)
        fn = getattr(fn, "__func__", fn)  # classmethod / staticmethod
        if getattr(fn, "__wrapped__", None) is None:
            missing.append(target)
    return missing


def verify_after_apply(targets: tuple[str, ...]) -> None:
    """Run :func:`verify_hooks` on ``targets`` right after SGLang's next ``HookRegistry.apply_hooks()``.

    SGLang's plugin loader runs every plugin's ``register`` and then applies all registered hooks at once;
    ``apply_hooks`` skips targets already patched. Applying RidgeFill's hooks from its own ``register`` (to
    verify them there) would therefore drop the hooks that a plugin loaded later puts on the same targets.
    Instead the class attribute ``apply_hooks`` is wrapped for one call: the loader's own call applies every
    plugin's hooks, restores the original and then verifies (a ``SystemExit`` leaves the loader, which
    catches only ``Exception``)."""
    from sglang.srt.plugins.hook_registry import HookRegistry

    original = HookRegistry.__dict__["apply_hooks"]

    def apply_then_verify(cls) -> None:
        HookRegistry.apply_hooks = original
        original.__func__(cls)
        verify_hooks(targets)

    HookRegistry.apply_hooks = classmethod(apply_then_verify)


def verify_hooks(targets: tuple[str, ...]) -> None:
    """Stop this process when a required hook did not take effect (SGLang would otherwise start without it);
    call it after SGLang has applied the hooks (:func:`verify_after_apply`)."""
    missing = missing_hooks(targets)
    if missing:
        msg = (
            "sgl-ridgefill: --prefill-backend ridgefill was requested but these SGLang hooks did not take effect: "
            + ", ".join(missing)
            + ". Refusing to start a server that would silently run exact prefill."
        )
        logger.critical(msg)
        raise SystemExit(msg)
