"""What streaming the maps from host memory (``--ridgefill-map-residence host``) would cost on an H200:
per upper layer, the map's copy against the fill it overlaps (estimates; nothing here runs on a GPU).

``runtime/map_stream.py`` keeps two layers' maps on the device: when the fill of a chunk takes layer ``l``'s
map, layer ``l + 1``'s starts copying on a side stream, so each copy hides behind one layer's fill of that
chunk's filled rows (the map product, and the K/V projection for the kinds that predict the layer's input);
the first upper layer's copy hides behind the lower layers. Every chunk's fill copies every upper layer once.
Per model shape, map kind and prompt length (tail 4,096, chunks of :data:`estimates.CHUNK_ROWS` rows):

- ``map_mib``: one upper layer's bf16 map; ``resident_mib``: all of them (what host residence saves on the GPU);
- ``copy_ms``: one layer's copy at :data:`H2D_GBPS`; ``fill_ms``: one layer's fill of a full chunk's filled
  rows at the GEMM rate; ``layer_ms``: one lower layer's whole forward of that chunk (for scale);
- ``exposed_ms``: copy time not hidden behind the fill, summed over every chunk's upper layers: what host
  residence adds to one request's TTFT by this model.
"""

from __future__ import annotations

from typing import Any

from ..bench.bounds import causal_pairs
from ..maps.kinds import MAP_KINDS, map_kind
from . import estimates

# Pinned host-to-device copies over PCIe Gen5 x16 (64 GB/s raw; ~50 sustained is typical): an estimate.
H2D_GBPS = 50.0
TAIL = 4096


def stream_record(shape: str, kind_name: str, length: int, tail: int = TAIL) -> dict[str, Any]:
    dims, split = estimates.SHAPES[shape]
    kind = map_kind(kind_name)
    d, kv = dims.hidden_size, dims.kv_size
    upper = dims.num_layers - split
    map_bytes = 2 * kind.d_out(d, kv) * (kind.d_in(d) + 1)  # A and b in bfloat16
    rate = estimates.GEMM_TFLOPS * 1e12
    prefix = length - tail
    chunks = []  # filled rows of each chunk (the tail's chunks fill nothing)
    for lo in range(0, length, estimates.CHUNK_ROWS):
        filled = max(0, min(lo + estimates.CHUNK_ROWS, prefix) - lo)
        if filled:
            chunks.append(filled)
    copy_ms = map_bytes / (H2D_GBPS * 1e9) * 1e3
    fill_ms = [rows * kind.fill_flops(d, kv) / rate * 1e3 for rows in chunks]
    exposed = sum((upper - 1) * max(0.0, copy_ms - f) for f in fill_ms)  # the first layer's copy hides below
    rows = min(length, estimates.CHUNK_ROWS)
    attention = 4 * dims.head_dim * dims.num_heads * causal_pairs(0, rows)
    layer_ms = (rows * 2 * dims.layer_params / rate + attention / (estimates.ATTENTION_TFLOPS["fa3"] * 1e12)) * 1e3
    return {
        "shape": shape, "kind": kind_name, "length": length, "tail": tail, "split": split, "upper_layers": upper,
        "chunks_filled": len(chunks), "map_mib": round(map_bytes / 2**20, 2),
        "resident_mib": round(upper * map_bytes / 2**20, 1), "copy_ms": round(copy_ms, 3),
        "fill_ms": round(max(fill_ms), 3), "layer_ms": round(layer_ms, 3),
        "hidden": all(copy_ms <= f for f in fill_ms), "exposed_ms": round(exposed, 2),
    }


def records(shapes=tuple(estimates.SHAPES), lengths=estimates.LENGTHS, kinds=tuple(MAP_KINDS)) -> list[dict[str, Any]]:
    return [stream_record(s, k, n) for s in shapes for k in kinds for n in lengths]


COLUMNS = (("shape", "shape", "s"), ("kind", "map kind", "s"), ("length", "N", "d"),
           ("map_mib", "map MiB/layer", ".1f"), ("resident_mib", "resident MiB", ".0f"), ("copy_ms", "copy ms", ".3f"),
           ("fill_ms", "fill ms", ".3f"), ("layer_ms", "lower layer ms", ".3f"), ("exposed_ms", "exposed ms", ".2f"))


def markdown(rows: list[dict[str, Any]]) -> list[str]:
    lines = [
        "", "## Maps streamed from host memory", "",
        f"`--ridgefill-map-residence host`: each upper layer's bf16 map copied to the device once per chunk's fill, "
        f"at {H2D_GBPS:.0f} GB/s (pinned, PCIe Gen5: an estimate), overlapping the previous layer's fill of that "
        f"chunk (tail {TAIL:,}, chunks of {estimates.CHUNK_ROWS:,} rows). `fill ms`: one layer's fill of a full "
        "chunk's filled rows; `lower layer ms`: one lower layer's forward of a chunk, for scale; `exposed ms`: copy "
        "time the fill does not hide, per request (estimates; `sgl_ridgefill/gpu_check/map_stream.py`).", "",
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
