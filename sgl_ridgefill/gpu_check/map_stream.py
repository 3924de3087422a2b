"""What streaming the maps from host memory (``--ridgefill-map-residence host``) would cost on an H200:
per upper layer, the map's copy against the compute it overlaps (estimates; nothing here runs on a GPU).

``runtime/map_stream.py`` keeps a ring of ``--ridgefill-map-slots`` layers' maps on the device; copies run
on a side stream in layer order, each into the slot the fill of the layer ``slots`` before it has released,
so the next chunk's first layers copy while its lower layers run. :func:`exposed_ms` simulates that ring per
chunk (copies back to back at :data:`H2D_GBPS`, each fill waiting for its copy), and :func:`slots_to_hide`
finds the fewest slots whose copies the compute hides. Every chunk's fill copies every upper layer once. Per
model shape, map kind and prompt length (tail 4,096, chunks of :data:`h200.CHUNK_ROWS` rows):

- ``map_mib``: one upper layer's bf16 map; ``resident_mib``: all of them (what host residence saves on the GPU);
- ``copy_ms``: one layer's copy; ``fill_ms``: one layer's fill of a full chunk's filled rows at the GEMM rate
  (the map product, and the K/V projection for the kinds that predict the layer's input); ``layer_ms``: one
  lower layer's whole forward of that chunk;
- ``exposed_ms``: copy time the compute does not hide with the default two slots, summed over the chunks:
  what host residence adds to one request's TTFT by this model; ``slots_to_hide`` and ``slots_mib``: the
  fewest slots that hide it (``--ridgefill-map-slots``) and the device memory they hold.
"""

from __future__ import annotations

from typing import Any

from ..tools.flops import causal_pairs
from ..maps.kinds import MAP_KINDS, map_kind
from . import h200
from .h200 import H2D_GBPS

# Pinned host-to-device copies over PCIe Gen5 x16 (64 GB/s raw; ~50 sustained is typical): an estimate.
TAIL = 4096


def stream_record(shape: str, kind_name: str, length: int, tail: int = TAIL) -> dict[str, Any]:
    dims, split = h200.SHAPES[shape]
    kind = map_kind(kind_name)
    d, kv = dims.hidden_size, dims.kv_size
    upper = dims.num_layers - split
    map_bytes = 2 * kind.d_out(d, kv) * (kind.d_in(d) + 1)  # A and b in bfloat16
    rate = h200.GEMM_TFLOPS * 1e12
    prefix = length - tail
    chunks = []  # filled rows of each chunk (the tail's chunks fill nothing)
    for lo in range(0, length, h200.CHUNK_ROWS):
        filled = max(0, min(lo + h200.CHUNK_ROWS, prefix) - lo)
        if filled:
            chunks.append(filled)
    copy_ms = map_bytes / (H2D_GBPS * 1e9) * 1e3
    fill_ms = [rows * kind.fill_flops(d, kv) / rate * 1e3 for rows in chunks]
    # each filled chunk's lower layers: what the ring's first copies run behind
    lower_ms = [split * _layer_ms(dims, i * h200.CHUNK_ROWS, min(h200.CHUNK_ROWS, length - i * h200.CHUNK_ROWS))
                for i in range(len(chunks))]
    layer_ms = _layer_ms(dims, 0, min(length, h200.CHUNK_ROWS))
    exposed = exposed_ms(copy_ms, fill_ms, lower_ms, upper, slots=2)
    hide = slots_to_hide(copy_ms, fill_ms, lower_ms, upper)
    return {
        "shape": shape, "kind": kind_name, "length": length, "tail": tail, "split": split, "upper_layers": upper,
        "chunks_filled": len(chunks), "map_mib": round(map_bytes / 2**20, 2),
        "resident_mib": round(upper * map_bytes / 2**20, 1), "copy_ms": round(copy_ms, 3),
        "fill_ms": round(max(fill_ms), 3), "layer_ms": round(layer_ms, 3),
        "hidden": exposed <= 0.005, "exposed_ms": round(exposed, 2), "slots_to_hide": hide,
        "slots_mib": round(hide * map_bytes / 2**20, 1),
    }


def _layer_ms(dims, lo: int, rows: int) -> float:
    """One layer's whole forward of the chunk of ``rows`` rows starting at row ``lo`` (its GEMMs at the GEMM rate,
    its causal attention over every row before it at fa3's rate), in ms."""
    attention = 4 * dims.head_dim * dims.num_heads * causal_pairs(lo, rows)
    return (rows * 2 * dims.layer_params / (h200.GEMM_TFLOPS * 1e12)
            + attention / (h200.ATTENTION_TFLOPS["fa3"] * 1e12)) * 1e3


def exposed_ms(copy_ms: float, fill_ms: list[float], lower_ms: list[float], layers: int, *, slots: int) -> float:
    """The ring's copy time not hidden, summed over chunks: per chunk, its lower layers run for ``lower_ms``
    while the copies of its first ``slots`` upper layers proceed (their slots were freed by the previous
    chunk's fill; the first chunk starts from the ring filled when the previous request ended, taken as
    empty here: a pessimistic start); then layer ``m``'s fill (``fill_ms`` each) starts once its copy has
    landed and layer ``m - 1``'s fill is done, and copy ``m`` starts once copy ``m - 1`` is done and the fill
    of layer ``m - slots`` has released its slot. Exposed: the upper phase's length past ``layers`` fills."""
    total = 0.0
    slots = min(slots, layers)
    for fill, lower in zip(fill_ms, lower_ms):
        copy_end: list[float] = []
        fill_end: list[float] = []
        for m in range(layers):
            start = max(copy_end[-1] if copy_end else 0.0, fill_end[m - slots] if m >= slots else 0.0)
            copy_end.append(start + copy_ms)
            fill_end.append(max(fill_end[-1] if fill_end else lower, copy_end[m]) + fill)
        total += fill_end[-1] - (lower + layers * fill)
    return total


def slots_to_hide(copy_ms: float, fill_ms: list[float], lower_ms: list[float], layers: int) -> int:
    """The fewest ring slots (2 at least) whose copies the lower layers and the fills hide (exposed under
    5 us per request); ``layers`` (the maps all on the device) when none does."""
    for slots in range(2, layers + 1):
        if exposed_ms(copy_ms, fill_ms, lower_ms, layers, slots=slots) <= 0.005:
            return slots
    return layers


def records(shapes=tuple(h200.SHAPES), lengths=h200.LENGTHS, kinds=tuple(MAP_KINDS)) -> list[dict[str, Any]]:
    return [stream_record(s, k, n) for s in shapes for k in kinds for n in lengths]


COLUMNS = (("shape", "shape", "s"), ("kind", "map kind", "s"), ("length", "N", "d"),
           ("map_mib", "map MiB/layer", ".1f"), ("resident_mib", "resident MiB", ".0f"), ("copy_ms", "copy ms", ".3f"),
           ("fill_ms", "fill ms", ".3f"), ("layer_ms", "lower layer ms", ".3f"), ("exposed_ms", "exposed ms (2 slots)", ".2f"),
           ("slots_to_hide", "slots to hide", "d"), ("slots_mib", "their MiB", ".0f"))


def markdown(rows: list[dict[str, Any]]) -> list[str]:
    lines = [
        "", "## Maps streamed from host memory", "",
        f"`--ridgefill-map-residence host`: each upper layer's bf16 map copied to the device once per chunk's fill, "
        f"at {H2D_GBPS:.0f} GB/s (pinned, PCIe Gen5: an estimate), through a ring of `--ridgefill-map-slots` device "
        f"buffers filled in layer order, the next chunk's first layers during its lower layers (tail {TAIL:,}, "
        f"chunks of {h200.CHUNK_ROWS:,} rows). `fill ms`: one layer's fill of a full chunk's filled rows; "
        "`lower layer ms`: one lower layer's forward of a chunk; `exposed ms (2 slots)`: copy time the compute "
        "does not hide with the default ring, per request; `slots to hide`: the fewest slots that hide it, and the "
        "device memory they hold (against `resident MiB` for the maps all on the device). Estimates: a simulation "
        "of the ring (`sgl_ridgefill/gpu_check/map_stream.py`).", "",
        "| " + " | ".join(h for _, h, _ in COLUMNS) + " |",
        "|" + "---|" * len(COLUMNS),
    ]
    for r in rows:
        lines.append("| " + " | ".join(format(r[k], f) for k, _, f in COLUMNS) + " |")
    return lines


def step(ctx) -> Any:
    """The kernels tier's measurement of the same: a few upper layers' fills of one chunk with the maps resident
    and streamed through the runtime's own :class:`~sgl_ridgefill.runtime.map_stream.StreamedMaps` (pinned host
    memory, a side stream), one layer's copy alone, and whether both give the same K/V."""
    import torch
    import torch.nn.functional as F

    from ..kernels.map_apply import apply_map
    from ..runtime.map_stream import StreamedMaps

    model, rows, layers = ctx.sizes.fill_models[-1], ctx.sizes.fill_rows, 4
    ctx.check_time(f"map_stream {model.name}")
    d, kv = model.hidden, model.kv_size
    a, b = ctx.randn(layers, d, d, seed=21, scale=d**-0.5), ctx.randn(layers, d, seed=22)
    w_kv = ctx.randn(2 * kv, d, seed=23, scale=d**-0.5)
    x = ctx.randn(rows, d, seed=24)
    streamed = StreamedMaps((a.cpu(), b.cpu()), ctx.device)

    def fill_layer(a_j: torch.Tensor, b_j: torch.Tensor) -> torch.Tensor:
        return F.linear(apply_map(x, a_j, b_j, backend="torch"), w_kv)

    def resident() -> list[torch.Tensor]:
        return [fill_layer(a[j], b[j]) for j in range(layers)]

    def stream() -> list[torch.Tensor]:
        out = []
        for j in range(layers):
            out.append(fill_layer(*streamed.take(j)))
            streamed.done()
        return out

    slot = tuple(torch.empty_like(t[0], device=ctx.device) for t in streamed.host)

    def copy_one() -> None:
        for dst, src in zip(slot, streamed.host):
            dst.copy_(src[1], non_blocking=True)

    equal = all(torch.equal(p, q) for p, q in zip(resident(), stream()))
    resident_ms, streamed_ms, copy_ms = ctx.time_ms(resident), ctx.time_ms(stream), ctx.time_ms(copy_one)
    map_bytes = sum(t[0].numel() * t.element_size() for t in streamed.host)
    yield {
        "model": model.name, "rows": rows, "layers": layers, "map_mib": map_bytes / 2**20,
        "copy_ms_per_layer": copy_ms, "h2d_gbps": map_bytes / copy_ms / 1e6,
        "fill_ms_per_layer": resident_ms / layers, "resident_ms": resident_ms, "streamed_ms": streamed_ms,
        "exposed_ms_per_layer": max(0.0, streamed_ms - resident_ms) / layers, "ok": equal,
    }
