"""Every RidgeFill server setting, declared once.

A setting named ``maps`` is the flag ``--ridgefill-maps`` of ``python -m sglang.launch_server``, the
environment variable ``RIDGEFILL_MAPS`` that carries it to SGLang's scheduler processes, the keyword
``ridgefill_maps`` of :func:`sgl_ridgefill.engine.ridgefill_engine` and the field ``maps`` of
:class:`~sgl_ridgefill.config.ServerConfig`. The flags (``cli_args.py``), the variables (``envs.py``), the
config, the offline engine's keywords and the README's flag table are all derived from :data:`SETTINGS`::

    python -m sgl_ridgefill.settings --markdown     # the README's "Serving" table

Where a setting comes from: a flag given on the command line always wins (it overwrites the variable
before SGLang starts any process); otherwise an exported ``RIDGEFILL_*`` variable applies; otherwise the
default. Engine-free: imports neither SGLang nor torch.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from .request_schema import MAX_POLICY_NAME, diagnostic_summary
from .vocabulary import ARMS, CACHE_MODES, DEFAULT_TAIL, FLAG_PREFIX, MAP_RESIDENCES, setting_flag  # noqa: F401

ENV_PREFIX = "RIDGEFILL_"
KEYWORD_PREFIX = "ridgefill_"

PREFILL_BACKENDS = ("default", "ridgefill")
MAP_DTYPES = ("auto", "bfloat16", "float32", "int8")
ALL_POLICIES = "all"  # --ridgefill-request-policies all
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


@dataclass(frozen=True, kw_only=True)
class Setting:
    """One server setting; ``default`` is :class:`ServerConfig`'s when neither flag nor variable is set."""

    name: str
    help: str  # one line: ``--help`` and the README table
    default: Any = None
    metavar: str | None = None
    prefixed: bool = True  # False: the flag is ``--NAME`` and ``ridgefill_engine`` has no keyword for it
    VALUE: ClassVar[str] = "str"  # the type of a value, for ServerConfig's field

    @property
    def flag(self) -> str:
        return setting_flag(self.name) if self.prefixed else "--" + self.name.replace("_", "-")

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.name.upper()

    @property
    def keyword(self) -> str | None:
        return KEYWORD_PREFIX + self.name if self.prefixed else None

    def parse(self, text: str) -> Any:
        """The value of the flag's or the variable's ``text``; ``ValueError`` says what is wrong with it."""
        return text

    def check(self, value: Any) -> None:
        """Raise ``ValueError`` naming the flag when ``value`` (not ``None``) is out of range."""
        if not isinstance(value, str):
            raise ValueError(f"{self.flag} must be a string, got {value!r}")

    def text(self, value: Any) -> str:
        """``value`` as the variable's text (what the flag exports, what ``ridgefill_engine`` sets)."""
        return str(value)

    def read(self, environ: Mapping[str, str]) -> Any:
        """The value ``environ`` holds, parsed (not checked), or the default when unset or empty."""
        text = environ.get(self.env)
        if text is None or text == "":
            return self.default
        try:
            return self.parse(text)
        except ValueError as e:
            raise ValueError(f"{self.env}={text!r} ({self.flag}) {e}") from None

    def argparse_kwargs(self) -> dict[str, Any]:
        return dict(default=None, metavar=self.metavar, help=self.help, type=self._argparse_type)

    def _argparse_type(self, text: str) -> Any:
        # argparse prints "argument FLAG: <message>"
        try:
            value = self.parse(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(f"{text!r} {e}") from None
        try:
            self.check(value)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e).removeprefix(self.flag + " ")) from None
        return value

    def usage(self) -> str:
        return f"{self.flag} {self.metavar}" if self.metavar else self.flag

    def config_field(self) -> tuple[str, str, Any]:
        """This setting's field of ``config.ServerConfig``: name, type, default."""
        annotation = self.VALUE if self.default is not None else f"{self.VALUE} | None"
        return self.name, annotation, field(default=self.default)


@dataclass(frozen=True, kw_only=True)
class IntSetting(Setting):
    VALUE: ClassVar[str] = "int"
    minimum: int

    def parse(self, text: str) -> int:
        try:
            return int(text)
        except ValueError:
            raise ValueError("is not an integer") from None

    def check(self, value: Any) -> None:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{self.flag} must be an integer, got {value!r}")
        if value < self.minimum:
            raise ValueError(f"{self.flag} must be >= {self.minimum}, got {value}")


@dataclass(frozen=True, kw_only=True)
class ChoiceSetting(Setting):
    choices: tuple[str, ...]

    def check(self, value: Any) -> None:
        if value not in self.choices:
            raise ValueError(f"{self.flag} {value!r} is not one of {', '.join(self.choices)}")

    def argparse_kwargs(self) -> dict[str, Any]:
        return dict(default=None, choices=list(self.choices), help=self.help)

    def usage(self) -> str:
        return f"{self.flag} {{{','.join(self.choices)}}}"


@dataclass(frozen=True, kw_only=True)
class SwitchSetting(Setting):
    """A flag without a value (``store_true``); its variable holds ``1`` (or ``0``: explicitly off)."""

    VALUE: ClassVar[str] = "bool"

    default: bool = False

    def parse(self, text: str) -> bool:
        if text.lower() in _TRUE:
            return True
        if text.lower() in _FALSE:
            return False
        raise ValueError(f"is not one of {', '.join(_TRUE + _FALSE)}")

    def check(self, value: Any) -> None:
        if not isinstance(value, bool):
            raise ValueError(f"{self.flag} must be true or false, got {value!r}")

    def text(self, value: Any) -> str:
        self.check(value)
        return "1" if value else "0"

    def argparse_kwargs(self) -> dict[str, Any]:
        return dict(help=self.help)


@dataclass(frozen=True, kw_only=True)
class NamesSetting(Setting):
    """Comma-separated names; the value is a tuple (empty: the default)."""

    VALUE: ClassVar[str] = "tuple[str, ...]"

    default: tuple[str, ...] = ()

    def parse(self, text: str) -> tuple[str, ...]:
        names = tuple(n.strip() for n in text.split(","))
        if not all(names):
            raise ValueError("has an empty name")
        return names

    def check(self, value: Any) -> None:
        if not isinstance(value, tuple) or not all(isinstance(n, str) and 0 < len(n) <= MAX_POLICY_NAME for n in value):
            raise ValueError(f"{self.flag} must be names of 1 to {MAX_POLICY_NAME} characters, got {value!r}")

    def text(self, value: Any) -> str:
        return value if isinstance(value, str) else ",".join(value)


SETTINGS: tuple[Setting, ...] = (
    ChoiceSetting(
        name="prefill_backend", prefixed=False, choices=PREFILL_BACKENDS, default="default",
        help="`ridgefill` turns RidgeFill on (default: SGLang's own prefill)",
    ),
    Setting(name="maps", metavar="DIR",
            help="maps folder from `sgl-ridgefill calibrate`; refused if it does not match the served model"),
    Setting(name="policy", metavar="FILE_OR_NAME",
            help="a `.rfpolicy` file or a shipped policy name (`sgl-ridgefill policy list`)"),
    IntSetting(name="split", minimum=1, metavar="S",
               help="split layer S; overrides the policy, its splits by prompt length too (default: the policy's for the "
                    "prompt's length, else the maps' default split)"),
    IntSetting(name="tail", minimum=1, metavar="T",
               help=f"tail length T in tokens; overrides the policy (default: the policy's, else {DEFAULT_TAIL})"),
    ChoiceSetting(
        name="arm", choices=ARMS,
        help="server-wide arm; overrides the policy (default: the policy's, else `ridgefill`); `exact` runs every "
             "request exactly whatever it asks for (a kill switch)",
    ),
    ChoiceSetting(
        name="cache_mode", choices=CACHE_MODES,
        help="`auto` (default): `namespace` for a plan that chooses no exact rows or chooses them again over a "
             "reused cache, `no_insert` for a probe selection or the value rescale (a later question would inherit "
             "rows chosen for the first), with kv+context maps and on hybrid models; "
             "`no_insert`: filled "
             "KV never enters the radix cache, RidgeFill requests still reuse exact cached prefixes; `namespace`: "
             "RidgeFill requests share their KV among themselves, keyed by maps, policy and every request key that "
             "changes the fill, and a later request (a new question on a cached document, a conversation's next "
             "turn) prefills only its new tokens, as on stock SGLang, but no longer reuses prefixes that exact "
             "requests cached",
    ),
    ChoiceSetting(name="map_dtype", choices=MAP_DTYPES, default="auto",
                  help="dtype the maps are kept in (default `auto`: the model's)"),
    ChoiceSetting(name="map_residence", choices=MAP_RESIDENCES, default="device",
                  help="`device` (default): the maps stay in the GPU's memory; `host`: in pinned host memory, each "
                       "upper layer's map copied to the device on a side stream ahead of its use (saves their "
                       "size in device memory, costs one copy per layer and fill)"),
    IntSetting(name="map_slots", minimum=2, default=2, metavar="N",
               help="with `--ridgefill-map-residence host`: how many upper layers' maps each split keeps on the "
                    "device at once (default 2); more slots copy further ahead, the next chunk's first layers "
                    "while its lower layers run, so a copy slower than one layer's fill can still hide "
                    "(`sgl-ridgefill gpu-check`'s estimate says how many)"),
    IntSetting(name="split_state_cache_mib", minimum=0, default=1024, metavar="MIB",
               help="host memory (MiB) that keeps the split states of filled prefix rows for later questions on the "
                    "same document under a plan that chooses its rows again, so the cached rows such a question "
                    "makes exact skip layers 0..S-1 (default 1024; a document takes its new prefix rows x hidden x "
                    "the model dtype's bytes, 2 in bfloat16, on every tensor-parallel rank, pinned on a GPU; 0: off, "
                    "every upgraded row runs its lower layers again)"),
    IntSetting(name="slice_rows", minimum=0, metavar="ROWS",
               help="while other requests decode, the prefill of a request with exact rows (a selecting policy, or "
                    "maps with a sink rule) runs in forwards of at most about ROWS rows with a decode step between "
                    "them: chunks of ROWS tokens, and its last upper-layer pass (the exact rows and the tail) in "
                    "slices of ROWS rows, at most 8, instead of one forward that every decoding request waits for "
                    "(default: 3/32 of SGLang's chunked-prefill size, 384 rows at the CPU launcher's 4,096; 0: SGLang's chunks "
                    "and one forward). "
                    "Needs one device, a dense model and page size 1"),
    IntSetting(name="upgrade_rows", minimum=0, metavar="ROWS",
               help="the exact upgrade: after its first token, a request of a policy that chooses its exact rows again "
                    "over a reused cache (the shipped rows policies) rewrites about ROWS of its filled rows exactly in "
                    "each of its decode steps that runs it alone (nobody else in the batch or waiting), so later "
                    "questions on its document or its conversation's next turn reuse exact rows and prefill only "
                    "their new tokens (default: an eighth of SGLang's chunked-prefill size, 1,024 rows when it does not chunk; 0: off). Needs one device, a dense model "
                    "and page size 1"),
    SwitchSetting(
        name="diagnostics",
        help=f"lets clients use the diagnostic request keys and values ({diagnostic_summary()}) and select any "
             "shipped policy by name (default: off)",
    ),
    NamesSetting(
        name="request_policies", metavar="NAMES",
        help="comma-separated policy names clients may select with the `policy` request key (default: only the "
             f"server's own `--ridgefill-policy`); `{ALL_POLICIES}`: every shipped policy that compiles for the "
             "served model",
    ),
    IntSetting(name="max_tail", minimum=1, metavar="T",
               help="the largest `tail` a request may ask for (default: no limit)"),
)
SETTINGS_BY_NAME: dict[str, Setting] = {s.name: s for s in SETTINGS}
assert len(SETTINGS_BY_NAME) == len(SETTINGS), "duplicate setting"


def environment_for(values: Mapping[str, Any]) -> dict[str, str]:
    """The ``RIDGEFILL_*`` variables for ``values`` (setting name -> value; ``None`` values are left out)."""
    unknown = sorted(set(values) - set(SETTINGS_BY_NAME))
    if unknown:
        raise ValueError(f"unknown RidgeFill setting(s) {', '.join(unknown)}; known: {', '.join(SETTINGS_BY_NAME)}")
    return {SETTINGS_BY_NAME[n].env: SETTINGS_BY_NAME[n].text(v) for n, v in values.items() if v is not None}


def cli_flags(values: Mapping[str, Any]) -> list[str]:
    """``values`` (setting name -> value) as ``launch_server`` flags; a switch is its flag alone when true."""
    environment_for(values)  # the same checks
    out: list[str] = []
    for name, value in values.items():
        setting = SETTINGS_BY_NAME[name]
        if isinstance(setting, SwitchSetting):
            out += [setting.flag] if value else []
        elif value is not None:
            out += [setting.flag, setting.text(value)]
    return out


def engine_keywords(values: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` (setting name -> value) as ``ridgefill_engine`` keywords."""
    environment_for(values)
    no_keyword = [n for n in values if SETTINGS_BY_NAME[n].keyword is None]
    if no_keyword:
        raise ValueError(f"ridgefill_engine has no keyword for {', '.join(no_keyword)} (it turns RidgeFill on itself)")
    return {SETTINGS_BY_NAME[n].keyword: v for n, v in values.items()}


def keyword_settings() -> dict[str, Setting]:
    """``ridgefill_engine`` keyword -> setting."""
    return {s.keyword: s for s in SETTINGS if s.keyword is not None}


def settings_markdown() -> str:
    """The README's table of server settings."""
    lines = ["| flag | environment variable | `ridgefill_engine` keyword | meaning |", "|---|---|---|---|"]
    for s in SETTINGS:
        keyword = f"`{s.keyword}`" if s.keyword else "— (always on)"
        lines.append(f"| `{s.usage()}` | `{s.env}` | {keyword} | {s.help} |")
    return "\n".join(lines) + "\n"


def _main(argv: Iterable[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--markdown", action="store_true", help="print the README's table")
    args = parser.parse_args(argv)
    if args.markdown:
        print(settings_markdown(), end="")
        return
    for s in SETTINGS:
        print(f"{s.usage():<44} {s.env:<30} {s.keyword or '-':<30} {s.help}")


if __name__ == "__main__":
    _main()
