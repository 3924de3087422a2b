"""The check's outputs: one JSON file, rewritten after every step, and a readable table per step."""

from __future__ import annotations

import json
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

JSON_NAME = "gpu-check.json"

# Per step: (key, header, format) of the table's columns; a row without the key shows "-".
COLUMNS: dict[str, list[tuple[str, str, str]]] = {
    "maps": [("d", "d", "d"), ("rows", "rows", "d"), ("backend", "backend", "s"), ("ms", "ms", ".3f"),
             ("tflops", "TFLOP/s", ".1f"), ("peak_fraction", "of peak", ".1%"), ("max_rel_err", "max rel err", ".2e"),
             ("runtime_choice", "runtime picks", "s")],
    "attention_stats": [("model", "model", "s"), ("n_k", "keys", "d"), ("backend", "backend", "s"),
                        ("ms", "ms", ".3f"), ("tflops", "TFLOP/s", ".1f"), ("max_rel_err", "max rel err", ".2e")],
    "fill": [("model", "model", "s"), ("map_backend", "map", "s"), ("map_ns_per_row", "map ns/row", ".1f"),
             ("key_value_ns_per_row", "K/V ns/row", ".1f"), ("fill_ns_per_row", "fill ns/row", ".1f"),
             ("exact_layer_linear_ns_per_row", "layer ns/row", ".1f"), ("fill_over_layer_time", "fill/layer", ".2f"),
             ("fill_over_layer_flops", "FLOP ratio", ".2f")],
    "planner": [("backend", "backend", "s"), ("group_size", "G", "d"), ("rows", "rows", "d"),
                ("steps", "steps", "d"), ("virtual_requests", "requests", "d"), ("host_ms", "host ms", ".2f"),
                ("metadata_mib", "MiB", ".1f")],
    "host_path": [("selection", "rows", "s"), ("backend", "backend", "s"), ("device", "device", "s"),
                  ("exact_rows", "exact", "d"), ("steps", "steps", "d"), ("host_ms", "host ms", ".2f"),
                  ("launches", "ops", "d"), ("h2d_bytes", "H2D bytes", "d"), ("cuda_syncs", "CUDA syncs", "d")],
    "row_attention": [("model", "model", "s"), ("context", "N", "d"), ("case", "case", "s"), ("rows", "rows", "d"),
                      ("virtual_requests", "requests", "d"), ("ms", "ms", ".3f"),
                      ("ratio_to_exact", "x exact", ".3f"), ("max_abs_err", "max err", ".2e")],
}
COLUMNS["maps_int8"] = COLUMNS["maps"]


def output_path(out: str | pathlib.Path) -> pathlib.Path:
    """``--out``: a ``.json`` file, or a folder that gets :data:`JSON_NAME`."""
    out = pathlib.Path(out)
    return out if out.suffix == ".json" else out / JSON_NAME


def write_json(path: pathlib.Path, report: Mapping[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(report, indent=1, default=str) + "\n")
    tmp.replace(path)  # a reader (or a kill) never sees half a file


def table(step: str, rows: Sequence[Mapping[str, Any]]) -> str:
    """Rows as aligned columns (the step's :data:`COLUMNS`, else every key of the first row)."""
    columns = COLUMNS.get(step) or [(k, k, "") for k in (rows[0] if rows else {})]
    columns = [c for c in columns if any(c[0] in row for row in rows)]
    cells = [[header for _, header, _ in columns]]
    for row in rows:
        if not any(key in row for key, _, _ in columns[1:]):
            continue
        cells.append([_cell(row.get(key), fmt) for key, _, fmt in columns])
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(line, widths)).rstrip() for line in cells)


def _cell(value: Any, fmt: str) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    try:
        return format(value, fmt)
    except (TypeError, ValueError):
        return str(value)
