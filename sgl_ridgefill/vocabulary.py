"""The words every layer of sgl-ridgefill shares, declared once: arms, cache modes, the default tail, splices,
the order the disaggregation descriptor writes arms in, and how calibration forms its statistics' products.

Imported by the request schema, the server settings, the policy compiler, the plan and the descriptor; it
imports nothing of the project, so anything may import it.
"""

from __future__ import annotations

ARMS = ("ridgefill", "identity", "nofill", "exact")  # what fills the prefix (the order of help texts and tables)
DEFAULT_ARM = "ridgefill"
CACHE_MODES = ("auto", "no_insert", "namespace")  # how a RidgeFill request's KV may enter the radix cache
DEFAULT_CACHE_MODE = "auto"  # admission resolves it per request to one of the plan cache modes
PLAN_CACHE_MODES = ("no_insert", "namespace")  # what a request's plan runs with (``auto`` resolved)
DEFAULT_TAIL = 1024  # rows at the end of the prompt that run exactly when nothing else says
MAP_RESIDENCES = ("device", "host")  # where the maps live while serving (host: streamed to the device per layer)
SPLICES = ("keys", "values", "both", "key_norm")  # the splice diagnostic's parts of the exact model
# How calibration multiplies each forward piece into its float64 totals; a name starts with its torch dtype.
ACCUMULATIONS = ("float64", "float32-blocks")
# The note of a request whose new rows ran exactly over a cached document an exact upgrade made exact
# (``runtime/upgrade.py``); the soak counts such answers by it.
EXACT_CACHE_NOTE = "the radix cache holds the whole prefix exact"
FLAG_PREFIX = "--ridgefill-"  # a server setting NAME is the flag --ridgefill-NAME (``settings.py``)


def setting_flag(name: str) -> str:
    """The ``launch_server`` flag of the server setting ``name`` (``diagnostics`` -> ``--ridgefill-diagnostics``)."""
    return FLAG_PREFIX + name.replace("_", "-")


# The disaggregation descriptor encodes an arm as its index here: a wire format, never reordered.
ARM_WIRE_ORDER = ("exact", "ridgefill", "identity", "nofill")

assert set(ARM_WIRE_ORDER) == set(ARMS) and len(ARM_WIRE_ORDER) == len(ARMS), "every arm has one wire index"
assert DEFAULT_ARM in ARMS and DEFAULT_CACHE_MODE in CACHE_MODES and set(PLAN_CACHE_MODES) < set(CACHE_MODES)
