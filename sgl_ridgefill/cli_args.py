"""The server flags RidgeFill adds to ``python -m sglang.launch_server``, one per entry of ``settings.SETTINGS``.

SGLang's ``ServerArgs`` is a sealed struct: it keeps only its own fields. Each flag is therefore an argparse
action that also exports its value to the setting's environment variable, which the scheduler processes
inherit; a flag given on the command line thus overwrites an exported variable. The actions derive from
argparse's store and store_true actions because SGLang's ``--config`` YAML merger accepts only those.
"""

from __future__ import annotations

import argparse
import os

from .settings import SETTINGS, Setting, SwitchSetting


class _ExportAction(argparse._StoreAction):  # noqa: SLF001 (see module docstring)
    setting: Setting

    def __call__(self, parser, namespace, values, option_string=None):
        super().__call__(parser, namespace, values, option_string)
        os.environ[self.setting.env] = self.setting.text(values)


class _ExportSwitch(argparse._StoreTrueAction):  # noqa: SLF001 (see module docstring)
    setting: Setting

    def __call__(self, parser, namespace, values, option_string=None):
        super().__call__(parser, namespace, values, option_string)
        os.environ[self.setting.env] = self.setting.text(True)


def _action(setting: Setting) -> type[argparse.Action]:
    base = _ExportSwitch if isinstance(setting, SwitchSetting) else _ExportAction
    return type(f"_Export_{setting.env}", (base,), {"setting": setting})


def add_ridgefill_arguments(parser: argparse.ArgumentParser) -> bool:
    """Add the flags to ``parser`` unless it has them; returns whether they were added."""
    existing = {opt for action in parser._actions for opt in action.option_strings}  # noqa: SLF001
    if any(setting.flag in existing for setting in SETTINGS):
        return False
    group = parser.add_argument_group("RidgeFill (sgl-ridgefill)")
    for setting in SETTINGS:
        group.add_argument(setting.flag, action=_action(setting), **setting.argparse_kwargs())
    return True
