"""``sgl-ridgefill gpu-check --tier host``: the host census of one request per shipped policy, on a CPU.

A tiny random-weight Llama (``--layers`` layers, maps at two splits) is served by SGLang on this CPU with its
Triton attention backend under the Triton interpreter, so RidgeFill's GPU code path runs: the steps, the
group and run metadata, the staging, the selection. Each request runs under the census
(``census.py``: ``RIDGEFILL_CENSUS``), which reports per request the planner calls, metadata initialisations
(RidgeFill's and SGLang's), host syncs with their sites, host and device mask bytes, bytes copied host to
device, virtual requests, groups and steps.

Besides one request per shipped policy (its split and tail scaled to the tiny model), the census runs pairs
that differ in one thing only, and checks that the counts that must not grow with it do not:

- ``layers``: the same request with 2 and with ``layers - 2`` upper layers;
- ``steps``: one upper step against several (a tail longer than the chunk budget);
- ``runs``: few against many scattered exact rows.

The engine runs in a child process (SGLang on a CPU needs the environment of ``cpu/environment.py`` before it
is imported); ``python -m sgl_ridgefill.gpu_check.host_census DRIVER.json`` is that child.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import subprocess
import sys
import tempfile

import torch

# The tiny model and its requests: small enough for the Triton interpreter, long enough for several steps.
HIDDEN = 32
LAYERS = 26  # the deepest shipped policy splits at 24
PAIR_SPLITS = (2,)  # the pairs run at 2 and at LAYERS - 2 upper layers
PROMPT = 192
TAIL = 48
CHUNK = 64  # SGLang's chunked-prefill budget: also the most rows of one upper step
SYNC_BUDGET = 10  # host syncs per request, every policy (docs/GPU_ESTIMATES.md)
# SGLang plans every chunk's batch twice inside RidgeFill's forward: the lower pass, and the whole batch after
# RidgeFill's passes; RidgeFill prepares each upper step once.
SGLANG_INITS_PER_CHUNK = 2


@dataclasses.dataclass(frozen=True)
class CensusRequest:
    label: str
    ridgefill: dict  # custom_params["ridgefill"]
    pair: str | None = None  # requests with the same pair name differ in one thing only
    tail: int = TAIL


def requests(layers: int, policies: dict[str, tuple[int, ...]], *, pairs_only: bool = False) -> list[CensusRequest]:
    """Every request of the census: the shipped policies (``name -> splits``, the base split first) at their
    base split with the tail scaled to the tiny prompt, then the pairs."""
    low, high = PAIR_SPLITS[0], layers - PAIR_SPLITS[0]
    out = [] if pairs_only else [
        CensusRequest(f"policy {name}", {"policy": name, "split": splits[0] if splits else low, "tail": TAIL})
        for name, splits in policies.items()
    ]
    rows = {"exact_every": 9}
    out += [
        CensusRequest("layers: 2 upper", {"policy": "plain", "split": high, "tail": TAIL, **rows}, "layers"),
        CensusRequest(f"layers: {layers - low} upper", {"policy": "plain", "split": low, "tail": TAIL, **rows}, "layers"),
        CensusRequest("steps: one", {"policy": "plain", "split": low, "tail": CHUNK // 2, **rows}, "steps", CHUNK // 2),
        CensusRequest("steps: several", {"policy": "plain", "split": low, "tail": 3 * CHUNK // 2 + 5, **rows}, "steps",
                      3 * CHUNK // 2 + 5),
        CensusRequest("runs: few", {"policy": "plain", "split": low, "tail": TAIL, "exact_every": 40}, "runs"),
        CensusRequest("runs: many", {"policy": "plain", "split": low, "tail": TAIL, "exact_every": 2}, "runs"),
    ]
    return out


def counts(record: dict) -> dict:
    """The census line's counts, with RidgeFill's own metadata initialisations told apart from SGLang's."""
    census, meta = record["census"], record.get("ridgefill") or {}
    chunks = -(-int(meta.get("prompt") or PROMPT) // CHUNK)
    return {**{k: v for k, v in census.items() if k != "sync_sites"}, "upper_steps": int(meta.get("upper_steps") or 0),
            "ridgefill_metadata_inits": census["metadata_inits"] - SGLANG_INITS_PER_CHUNK * chunks}


def verdicts(rows: list[dict]) -> list[str]:
    """What the census found against its budgets and its pairs (empty: every check held).

    Every request: at most :data:`SYNC_BUDGET` host syncs, no host mask larger than one ``[seq_len]`` visible
    mask. ``layers`` pair: every count equal. ``steps`` and ``runs`` pairs: equal syncs, one metadata
    initialisation and at most two plans (groups, runs) per upper step."""
    problems = []
    for row in rows:
        c, label = row["counts"], row["label"]
        if c["syncs"] > SYNC_BUDGET:
            problems.append(f"{label}: {c['syncs']} host syncs (budget {SYNC_BUDGET})")
        if c["host_mask_bytes"] > row.get("prompt", PROMPT):
            problems.append(f"{label}: {c['host_mask_bytes']} bytes of host masks")
        if row.get("pair") in ("steps", "runs", "layers"):
            if c["ridgefill_metadata_inits"] != c["upper_steps"]:
                problems.append(f"{label}: {c['ridgefill_metadata_inits']} metadata initialisations for "
                                f"{c['upper_steps']} upper steps")
            if c["planner_calls"] > 2 * c["upper_steps"]:
                problems.append(f"{label}: {c['planner_calls']} plans for {c['upper_steps']} upper steps")
    pairs: dict[str, list[dict]] = {}
    for row in rows:
        if row.get("pair"):
            pairs.setdefault(row["pair"], []).append(row)
    for name, (a, b) in pairs.items():
        keys = a["counts"] if name == "layers" else ("syncs",)
        for key in keys:
            if a["counts"][key] != b["counts"][key]:
                problems.append(f"{name}: {key} is {a['counts'][key]} for {a['label']!r} but {b['counts'][key]} "
                                f"for {b['label']!r}")
    return problems


# ------------------------------------------------------------------------------------------------ runner


def run_census(out: str | pathlib.Path, *, layers: int = LAYERS, pairs_only: bool = False, say=print) -> dict:
    """Build the tiny model, serve it under the census, write ``host-census.json`` into ``out``.

    ``pairs_only``: only the pairs (a shallower model serves them; the test suite runs this)."""
    from ..tools.synthetic import make_tiny_checkpoint

    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        model = make_tiny_checkpoint(tmp / "model", family="llama", num_layers=layers, hidden_size=HIDDEN)
        policies = {} if pairs_only else _dense_policies(layers)
        # Every split a policy names has maps, or the server would not take the policy.
        splits = sorted({PAIR_SPLITS[0], layers - PAIR_SPLITS[0], *(s for named in policies.values() for s in named)})
        maps = _maps(model, tmp / "maps", splits)
        reqs = requests(layers, policies, pairs_only=pairs_only)
        census_file = tmp / "census.jsonl"
        spec = {"model": str(model), "maps": str(maps), "census": str(census_file),
                "requests": [dataclasses.asdict(r) for r in reqs]}
        (tmp / "driver.json").write_text(json.dumps(spec))
        results = _run_driver(tmp / "driver.json", tmp / "results.json")
        lines = [json.loads(line) for line in census_file.read_text().splitlines() if line.strip()]
    by_rid = {line["rid"]: line for line in lines}
    rows = []
    for req, result in zip(reqs, results):
        line = by_rid.get(result.get("rid"))
        if line is None:
            rows.append({"label": req.label, "error": result.get("error") or "no census line", "ridgefill": result})
            continue
        rows.append({"label": req.label, "pair": req.pair, "request": req.ridgefill, "prompt": PROMPT,
                     "upper_layers": layers - req.ridgefill["split"], "ridgefill": line["ridgefill"],
                     "census": line["census"], "counts": counts(line)})
    report = {"model": f"random Llama, {layers} layers, hidden {HIDDEN}", "backend": "triton (TRITON_INTERPRET=1)",
              "prompt": PROMPT, "chunk": CHUNK, "rows": rows,
              "verdicts": verdicts([r for r in rows if "census" in r])}
    (out / "host-census.json").write_text(json.dumps(report, indent=1) + "\n")
    say(table(report))
    return report


def table(report: dict) -> str:
    from .report import table as format_table

    cells = []
    for row in report["rows"]:
        if "census" not in row:
            cells.append({"request": row["label"], "error": row["error"]})
            continue
        c, m = row["census"], row["ridgefill"]
        cells.append({"request": row["label"], "upper": row["upper_layers"], "exact": m.get("exact"),
                      "steps": m.get("upper_steps"), "virtual": m.get("virtual_requests"), "groups": m.get("groups"),
                      "planner": c["planner_calls"], "metadata": c["metadata_inits"], "syncs": c["syncs"],
                      "h2d_kib": round(c["h2d_bytes"] / 1024, 1), "host_mask": c["host_mask_bytes"],
                      "device_mask": c["device_mask_bytes"]})
    lines = [format_table("host_census", cells), ""]
    lines += [f"problem: {p}" for p in report["verdicts"]] or ["every request within its budget; every pair equal"]
    return "\n".join(lines)


def _dense_policies(layers: int) -> dict[str, tuple[int, ...]]:
    """Shipped policy -> the splits it names (the base split first, then those by prompt length; none when it
    takes the maps' default), for the policies a dense model of ``layers`` layers can serve (the terminal-state
    correction is for hybrid models)."""
    from ..policy import list_builtin_policies, load_policy, resolve_policy_path
    from ..policy.ast import CorrectStmt, SplitStmt

    out = {}
    for name in list_builtin_policies():
        statements = load_policy(resolve_policy_path(name)).statements
        if any(isinstance(s, CorrectStmt) and s.call.name == "terminal_state" for s in statements):
            continue
        written = [s for s in statements if isinstance(s, SplitStmt)]
        splits = tuple(int(s.value.value) for s in sorted(written, key=lambda s: s.from_tokens is not None))
        if all(split < layers for split in splits):
            out[name] = splits
    return out


def _maps(model_dir: pathlib.Path, out: pathlib.Path, splits: list[int]) -> pathlib.Path:
    from transformers import AutoModelForCausalLM

    from ..tools.synthetic import near_identity_maps
    from ..maps import SplitMaps, hf_fingerprint_layers, model_fingerprint, write_maps_folder

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    layers, d = model.config.num_hidden_layers, model.config.hidden_size
    fingerprint = model_fingerprint(model.config.to_dict(), model.model.embed_tokens.weight, model.model.norm.weight,
                                    hf_fingerprint_layers(model))
    maps = []
    for split in splits:
        a, b = near_identity_maps(layers - split, d, noise=0.05, bias_noise=0.02, seed=split)
        maps.append(SplitMaps(split, a, b, {"lambda": None}))
    # Token frequencies, as calibration records them, for the lexical selectors of the probe policy.
    counts = torch.randint(1, 1000, (model.config.vocab_size,), generator=torch.Generator().manual_seed(0))
    return write_maps_folder(out, maps, model=fingerprint, default_split=splits[0], token_counts=counts.double())


def _run_driver(spec: pathlib.Path, out: pathlib.Path) -> list[dict]:
    from ..cpu.environment import cpu_environment

    env = {k: v for k, v in cpu_environment().items() if not k.startswith("RIDGEFILL_")}
    env.update(TRITON_INTERPRET="1", OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-m", __name__, str(spec), str(out)], env=env, capture_output=True,
                          text=True, timeout=1800)
    if proc.returncode != 0 or not out.exists():
        raise RuntimeError(f"the census engine failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")
    return json.loads(out.read_text())


def _drive(spec_path: str, out_path: str) -> None:
    """The child: one engine, the requests one at a time, each response's rid and RidgeFill report."""
    spec = json.loads(pathlib.Path(spec_path).read_text())
    os.environ["RIDGEFILL_CENSUS"] = spec["census"]
    from ..engine import ridgefill_engine

    engine = ridgefill_engine(
        model_path=spec["model"], ridgefill_maps=spec["maps"], ridgefill_diagnostics=True,
        ridgefill_request_policies="all", device="cpu", attention_backend="triton", dtype="float32",
        cuda_graph_backend_decode="disabled", cuda_graph_backend_prefill="disabled", sampling_backend="pytorch",
        max_total_tokens=4096, mem_fraction_static=0.5, chunked_prefill_size=CHUNK, skip_tokenizer_init=True,
        log_level="warning", disable_radix_cache=True,
    )
    results = []
    try:
        for i, req in enumerate(spec["requests"]):
            ids = [(7 * t + 13 * i + (t * t) % 17) % 900 + 5 for t in range(PROMPT)]
            params = {"max_new_tokens": 1, "temperature": 0.0, "custom_params": {"ridgefill": req["ridgefill"]}}
            try:
                out = engine.generate(input_ids=ids, sampling_params=params)
                meta = out["meta_info"]
                results.append({"rid": meta.get("id"), "ridgefill": meta.get("ridgefill")})
            except Exception as e:  # noqa: BLE001 - reported per request
                results.append({"error": f"{type(e).__name__}: {e}"})
    finally:
        engine.shutdown()
    pathlib.Path(out_path).write_text(json.dumps(results))


if __name__ == "__main__":
    _drive(sys.argv[1], sys.argv[2])
