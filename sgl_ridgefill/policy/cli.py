"""``sgl-ridgefill policy check | fmt | explain``: the policy tools on the command line.

``add_subparser`` plugs the ``policy`` command into the main CLI (``sgl_ridgefill.cli.main``). Errors print
the policy message, no traceback, and exit 1.
"""

from __future__ import annotations

import os
import sys

from .builtin import builtin_policy_names, resolve_policy_path
from .compiler import compile_policy, describe_splits
from .errors import PolicyError
from .explain import explain_policy, render_explanation
from .formatter import format_policy
from .manifest import MapsFacts, read_maps_facts
from .parser import load_policy, parse_policy


def _resolve_file(file: str) -> str:
    """A path, or the name of a shipped policy when no such file exists."""
    if os.path.exists(file) or file not in builtin_policy_names():
        return file
    return str(resolve_policy_path(file))


def _maps(args) -> MapsFacts | None:
    return read_maps_facts(args.maps) if getattr(args, "maps", None) else None


def _check(args) -> int:
    facts = _maps(args)
    # Without --maps a policy that takes its split from the maps folder still checks; the server,
    # which always compiles against its maps folder (or refuses), decides the split.
    maps = facts.maps_info() if facts else None
    policy = compile_policy(load_policy(_resolve_file(args.file)), maps=maps, defer_split=maps is None)
    base = policy.split if policy.split is not None else "from the maps folder (not checked without --maps)"
    split = f"split {describe_splits(base, policy.splits_by_length)}"
    parts = [f"arm {policy.arm}", split, f"tail {policy.tail}", f"cache {policy.cache_mode}"]
    if policy.has_selection():
        parts.append(f"{len(policy.selection.selectors())} selector(s)")
    if policy.value_rescale_c is not None:
        parts.append(f"value_rescale c={policy.value_rescale_c}")
    if policy.terminal_state is not None:
        parts.append("terminal_state")
    print(f'ok: policy "{policy.name}": {", ".join(parts)}')
    for warning in policy.warnings:
        print(f"warning: {warning}")
    return 0


def _fmt(args) -> int:
    path = _resolve_file(args.file)
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError):
        load_policy(path)  # raises the policy error for an unreadable file
        raise
    canonical = format_policy(parse_policy(text, path))
    if args.check:
        if canonical != text:
            print(f"{path}: not in canonical form (run `sgl-ridgefill policy fmt --write {path}`)", file=sys.stderr)
            return 1
        return 0
    if args.write:
        if canonical != text:
            with open(path, "w", encoding="utf-8") as f:
                f.write(canonical)
            print(f"formatted {path}")
        return 0
    sys.stdout.write(canonical)
    return 0


def _explain(args) -> int:
    facts = _maps(args)
    layers = args.layers if args.layers is not None else (facts.num_layers if facts else None)
    if layers is None:
        raise PolicyError("explain needs the model's layer count: pass --maps DIR or --layers L")
    if args.tokens < 1:
        raise PolicyError(f"--tokens must be at least 1, got {args.tokens}")
    policy = compile_policy(load_policy(_resolve_file(args.file)), maps=facts.maps_info() if facts else None)
    sys.stdout.write(render_explanation(policy, explain_policy(policy, tokens=args.tokens, num_layers=layers, maps=facts)))
    return 0


def _guarded(command):
    def run(args) -> int:
        try:
            return command(args)
        except PolicyError as err:
            print(str(err), file=sys.stderr)
            return 1

    return run


def add_subparser(subparsers) -> None:
    """Add the ``policy`` command (``check``, ``fmt``, ``explain``) to an argparse sub-parser set."""
    policy = subparsers.add_parser("policy", help="check, format and explain .rfpolicy files")
    commands = policy.add_subparsers(dest="policy_command", metavar="{check,fmt,explain}")
    commands.required = True

    check = commands.add_parser("check", help="parse and compile a policy; print what it resolves to")
    check.add_argument("file", help="a .rfpolicy file, or the name of a shipped policy")
    check.add_argument("--maps", metavar="DIR", help="check split and layers against this maps folder")
    check.set_defaults(func=_guarded(_check))

    fmt = commands.add_parser("fmt", help="print the policy in canonical form")
    fmt.add_argument("file", help="a .rfpolicy file")
    mode = fmt.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help="rewrite the file in place")
    mode.add_argument("--check", action="store_true", help="exit 1 if the file is not in canonical form")
    fmt.set_defaults(func=_guarded(_fmt))

    explain = commands.add_parser("explain", help="compute fraction, speed bound, exact rows and map memory")
    explain.add_argument("file", help="a .rfpolicy file, or the name of a shipped policy")
    explain.add_argument("--tokens", type=int, required=True, metavar="N", help="prompt length in tokens")
    explain.add_argument("--maps", metavar="DIR", help="maps folder (reads DIR/manifest.json)")
    explain.add_argument("--layers", type=int, metavar="L", help="model layers, when no maps folder is given")
    explain.set_defaults(func=_guarded(_explain))
