"""``sgl-ridgefill eval``: the measurement suite against a RidgeFill server (README, "Measuring quality").

    sgl-ridgefill eval --model qwen2.5-coder-0.5b --maps DIR --split 12 --lengths 4096 --out runs/qwen-s12

Without ``--url`` it starts a stock server and a RidgeFill server on this machine (CPU), checks that the
fill-disabled RidgeFill server answers byte for byte like stock, stops the stock one and runs every arm.
A RidgeFill arm that comes back bit-identical to exact stops the run (the server did not fill).
With ``--url`` (a RidgeFill server started with ``--ridgefill-policy OUT/eval-rows.rfpolicy``, which this
command writes, ``--ridgefill-diagnostics`` for the control arms, and ``--chunked-prefill-size`` at least the
longest length) it needs ``--stock-url`` too.
With ``--engine`` it runs offline instead: a stock ``sglang.Engine`` in this process answers the check
prompts and shuts down, then a RidgeFill engine (``sgl_ridgefill.engine.ridgefill_engine``) runs the rest
(on a GPU when this machine has one, else on CPU).
Results append to ``OUT/results.jsonl``; rerunning the same command resumes. ``OUT/REPORT.md`` and the
plots are rewritten at the end (``--report-only`` rewrites them from the results alone).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pathlib
import shlex
import sys
import time
from typing import Any

from ..settings import cli_flags, engine_keywords
from ..tools import args as argtypes
from . import arms as A
from . import sizing
from ..cpu.dtype import CHOICES as DTYPE_CHOICES, DTYPES


def add_subparser(subparsers) -> None:
    p = subparsers.add_parser(
        "eval", help="measure RidgeFill's quality: needles in the filled region, key-token loss, splice tests",
        description=__doc__.splitlines()[0],
    )
    p.add_argument("--model", required=True, help="HF folder or a fetchable model name (sgl-ridgefill model list)")
    p.add_argument("--maps", type=pathlib.Path, required=True, help="maps folder (sgl-ridgefill calibrate)")
    p.add_argument("--split", type=int, default=None, help="split layer (default: the maps' default split)")
    p.add_argument("--tail", type=int, default=1024, help="tail T in tokens (default 1024)")
    p.add_argument("--lengths", type=argtypes.token_counts, default=None, help="prompt lengths in tokens (default 4096)")
    p.add_argument("--out", type=pathlib.Path, required=True, help="results folder (resumable)")
    p.add_argument("--preset", choices=tuple(sizing.PRESETS), default=None,
                   help="needle-grid settings by name; flags given explicitly win. " + sizing.preset_help())
    p.add_argument("--tasks", default=None,
                   help=f"needle tasks, comma-separated, or 'all' (default {sizing.DEFAULTS['tasks']})")
    p.add_argument("--haystacks", default=None,
                   help="noise, text (the builtin corpus' prose), code (its code: the Python standard library) or a folder, "
                        "comma-separated (default noise,text)")
    p.add_argument("--depths", type=int, default=None,
                   help="needle depths spread over the filled prefix, plus 4 around and in the tail (default 5)")
    p.add_argument("--seeds", type=int, default=None, help="samples per task, haystack and depth (default 1)")
    p.add_argument("--docs", type=int, default=4, help="long documents per length for the loss metrics (default 4; 0: none)")
    p.add_argument("--needle-arms", default="all",
                   help=f"arms for the needle tasks (default all: {','.join(A.NEEDLE_ARMS)}); also "
                        f"{' and '.join(A.LATER_ARMS)}: the question asked second or third on a cached document "
                        "(niah_multikey samples)")
    p.add_argument("--loss-arms", default="all",
                   help=f"arms for the loss metrics (default all: {','.join(A.LOSS_ARMS)}); also splice:KIND@FIRST-LAST")
    p.add_argument("--splice-layers", default="auto",
                   help="upper-layer ranges FIRST-LAST,... of the per-layer splices splice:keys@FIRST-LAST, run beside "
                        "splice:keys (default auto: the filled upper layers in two halves, 13-17,18-23 at split 12 of "
                        "24; none: no per-layer splice)")
    p.add_argument("--rows-select", default=None, metavar="SELECTION",
                   help="what the \"+ rows\" arms compute exactly: the body of a .rfpolicy select statement, clauses "
                        "included, e.g. 'attention_topk(q=64, share=10%%, layers=[3, 7, 11]) budget 10%% reserve "
                        "lexical_net(min_shared=3) up to 2%%' (default: 10%% of the prefix by attention from the "
                        "last 64 tokens in layers 3, 7, 11, 15 below the split)")
    p.add_argument("--exact-from", type=pathlib.Path, action="append", default=[], metavar="DIR",
                   help="reuse the exact arm's records of another run folder on the same prompts, model and dtype "
                        "(the exact arm does not depend on the maps or the split); repeatable")
    p.add_argument("--upgrade-rows", type=int, default=0, metavar="ROWS",
                   help="the RidgeFill server's --ridgefill-upgrade-rows: rows a request rewrites exactly in each decode "
                        "step that runs it alone, for measuring later questions over an upgraded document (default 0: "
                        "off, since an answer's later tokens would read the rewritten rows and the arm would not "
                        "measure its fill; a --url server must run with it off too, or the run stops)")
    p.add_argument("--url", default=None, help="a running RidgeFill server (default: start one here)")
    p.add_argument("--stock-url", default=None, help="a running stock SGLang server on the same model (needed with --url)")
    p.add_argument("--dtype", choices=DTYPE_CHOICES, default="auto",
                   help="model dtype of the local servers or engines (default auto: bfloat16 where this CPU has native "
                   "bfloat16 matmuls, float32 elsewhere; on a GPU, bfloat16)")
    p.add_argument("--engine", action="store_true",
                   help="offline: run sglang.Engine in this process (stock first, for the check, then RidgeFill) instead of servers")
    p.add_argument("--n-resamples", type=int, default=5000, help="bootstrap resamples (default 5000)")
    p.add_argument("--report-only", action="store_true", help="only rewrite the report from OUT/results.jsonl")
    p.set_defaults(func=_main)


def _serving_settings(model_dir: pathlib.Path, max_len: int, dtype: str, *, cpu: bool = True) -> dict[str, object]:
    """SGLang settings shared by the local servers (as flags) and the offline engines (as keywords): every
    prompt prefilled in one chunk (tail prompt logprobs under RidgeFill need it). On the CPU the memory
    fraction is the CPU launcher's, large enough for the weights of the second server started beside the
    first (``--max-total-tokens`` caps the pool whatever the fraction); an engine on a GPU lets SGLang size
    its memory from the model."""
    settings: dict[str, object] = {"model_path": str(model_dir), "dtype": dtype, "chunked_prefill_size": max_len,
                                   "max_total_tokens": max_len + 2048}
    if cpu:
        from ..cpu.launch_server_process import MEM_FRACTION_STATIC

        settings["mem_fraction_static"] = MEM_FRACTION_STATIC
    return settings


def _ridgefill_settings(args, split: int, policy_file: pathlib.Path) -> dict[str, object]:
    """The RidgeFill settings (``sgl_ridgefill.settings`` names) shared by the local server (as flags) and the
    offline engine (as ``ridgefill_*`` keywords). The arms name shipped policies and use the control arms,
    ``control`` and ``splice``, which a server accepts only with diagnostics on."""
    return {"maps": str(args.maps), "split": split, "tail": args.tail, "policy": str(policy_file), "diagnostics": True,
            "upgrade_rows": args.upgrade_rows}


def _server_flags(model_dir: pathlib.Path, max_len: int, dtype: str) -> list[str]:
    flags = []
    for key, value in _serving_settings(model_dir, max_len, dtype).items():
        flags += ["--" + key.replace("_", "-"), str(value)]
    return flags


@contextlib.contextmanager
def _servers(args, model_dir: pathlib.Path, split: int, policy_file: pathlib.Path, max_len: int, check_prompts):
    """Yield ``(client, stock)``: a client of the RidgeFill server, and the stock server's fingerprints of
    ``check_prompts`` (None when ``check_prompts`` is None: the check already passed). A local stock server
    stops as soon as it has answered; the RidgeFill one on exit."""
    from ..tools.client import BenchClient
    from .runner import fingerprints

    if args.url:
        if check_prompts is not None and not args.stock_url:
            raise SystemExit("sgl-ridgefill eval: --url needs --stock-url (the stock check comes first)")
        client = BenchClient(args.url)
        _check_server(client, max_len)
        yield client, None if check_prompts is None else fingerprints(BenchClient(args.stock_url), check_prompts)
        return
    from ..cpu.environment import cpu_environment
    from ..cpu.launch_server_process import running_server

    base = _server_flags(model_dir, max_len, args.resolved_dtype)
    env = {k: v for k, v in cpu_environment().items() if not k.startswith("RIDGEFILL_")}
    rf_flags = base + cli_flags({"prefill_backend": "ridgefill", **_ridgefill_settings(args, split, policy_file)})
    with contextlib.ExitStack() as stack:
        print("starting the RidgeFill server (log: OUT/ridgefill-server.log) ...", flush=True)
        rf = stack.enter_context(running_server(rf_flags, log_path=args.out / "ridgefill-server.log", env=env))
        stock = None
        if check_prompts is not None:
            print("starting the stock server (log: OUT/stock-server.log) ...", flush=True)
            with running_server(base, log_path=args.out / "stock-server.log", env=env) as stock_url:
                stock = fingerprints(BenchClient(stock_url), check_prompts)
        yield BenchClient(rf), stock


@contextlib.contextmanager
def _engines(args, model_dir: pathlib.Path, split: int, policy_file: pathlib.Path, max_len: int, check_prompts):
    """``_servers`` with offline engines in this process: the stock engine answers ``check_prompts`` and shuts
    down, then the RidgeFill engine starts."""
    import torch

    cpu = not torch.cuda.is_available()
    if cpu:
        from ..cpu.environment import apply_cpu_environment

        apply_cpu_environment()
    from .engine_client import engine_kwargs, running_engine
    from .runner import fingerprints

    kwargs = engine_kwargs(_serving_settings(model_dir, max_len, args.resolved_dtype, cpu=cpu), cpu=cpu)
    stock = None
    if check_prompts is not None:
        print("starting the stock engine ...", flush=True)
        with running_engine(kwargs, None, "stock engine") as engine:
            stock = fingerprints(engine, check_prompts)
    print("starting the RidgeFill engine ...", flush=True)
    options = engine_keywords(_ridgefill_settings(args, split, policy_file))
    with running_engine(kwargs, options, "RidgeFill engine") as engine:
        yield engine, stock


def _dtype(args, recorded: str | None = None, paired: str | None = None) -> str:
    """The model dtype of the servers or engines this command starts, printed with the reason first:
    ``--dtype``; else ``recorded``, the dtype of the run being resumed (a run is measured in one dtype,
    whichever machine resumes it), or for a new run ``paired``, that of the exact arm it reuses
    (``--exact-from``); else bfloat16 for offline engines on a GPU and this CPU's pick for the rest. A
    server given with ``--url`` runs whatever it was started with."""
    from ..cpu.dtype import choose_dtype

    if args.url:
        return args.dtype
    if recorded in DTYPES:
        choice = choose_dtype(args.dtype, recorded=recorded)
    elif recorded is None and paired in DTYPES:
        choice = choose_dtype(args.dtype, recorded=paired,
                              recorded_by="the exact arm it reuses (--exact-from) was measured in it")
    elif args.engine and args.dtype == "auto" and _cuda():
        print("dtype: bfloat16 (offline engines on the GPU)", flush=True)
        return "bfloat16"
    else:
        choice = choose_dtype(args.dtype)
    print(choice.line(), flush=True)
    return choice.dtype


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _cpu(args) -> dict[str, str]:
    """The CPU the servers or engines of this run use (model and PyTorch's capability); nothing for a server given
    with ``--url``, which may run elsewhere."""
    if args.url:
        return {}
    from ..tools.machine import machine_record

    from ..cpu.matmul import through_float32

    machine = machine_record(dtype=args.resolved_dtype, server_env=None, server_local=True)
    through = args.resolved_dtype == "bfloat16" and through_float32()
    return {"cpu": machine["cpu_model"], "cpu_capability": machine["capability"],
            **({"bf16_matmuls": "through float32"} if through else {})}


def _maps_fingerprint(maps: pathlib.Path, split: int) -> dict[str, Any]:
    """The maps this run fills with, as the plan records them: the split's file hash (16 hex digits, from the
    manifest) and its mean held-out R²; ``{}`` when the manifest does not say."""
    manifest = json.loads((maps / "manifest.json").read_text())
    entry = (manifest.get("splits") or {}).get(str(split)) or {}
    sha = (manifest.get("files") or {}).get(entry.get("file", ""))
    if not sha:
        return {}
    r2 = (entry.get("heldout") or {}).get("mean_r2")
    return {"sha256": sha[:16], "heldout_r2": None if r2 is None else round(float(r2), 4)}


def _backend_name(args) -> str:
    if args.engine:
        return "offline sglang.Engine (this process)"
    return args.url or "local (sgl_ridgefill.cpu.launch_server)"


def _check_server(client, max_len: int) -> None:
    """A server given with --url must prefill the longest prompt in one chunk (prompt logprobs of the tail)."""
    try:
        info = client.get_json("/get_server_info")
    except Exception:  # noqa: BLE001 - older servers: the runner's bit-identity check still catches it
        return
    chunk = info.get("chunked_prefill_size")
    if isinstance(chunk, int) and 0 < chunk < max_len:
        raise SystemExit(f"sgl-ridgefill eval: the server's --chunked-prefill-size is {chunk}, below the longest "
                         f"length {max_len}; restart it with --chunked-prefill-size {max_len}")


def _check_lengths(lengths: tuple[int, ...], tail: int, config: dict, tasks: tuple[str, ...]) -> None:
    """Every prompt must leave a tail to fill before it and room for its answer in the model's context."""
    from .needles import MAX_NEW_TOKENS

    short = [n for n in lengths if n <= tail]
    if short:
        raise SystemExit(f"sgl-ridgefill eval: --lengths {','.join(map(str, short))}: not longer than the tail "
                         f"({tail}); nothing would be filled")
    context = config.get("max_position_embeddings")
    answer = max(MAX_NEW_TOKENS[t] for t in tasks)
    if isinstance(context, int) and max(lengths) + answer > context:
        raise SystemExit(f"sgl-ridgefill eval: --lengths {max(lengths)}: the model's context is {context} tokens and "
                         f"the needle answers need up to {answer} more; use lengths up to {context - answer}")


_SETTINGS = ("model_path", "split", "tail", "maps", "rows_policy", "rows_fraction", "rows_select", "map_kind", "depths",
             "upgrade_rows", "dtype", "maps_dtype")
# Settings a results.jsonl written before they were recorded ran with.
_SETTINGS_BEFORE = {"map_kind": "residual", "rows_select": None}
# ... and those it ran with by another of its settings: the maps of a run recorded before their dtype was
# kept were fitted by the same machine, in the dtype it picked for the run (a model dtype, not the "auto" a run
# against a server given by address records).
_SETTINGS_BEFORE_AS = {"maps_dtype": "dtype"}


def _fill_flops(kind: str, config: dict) -> int:
    """What filling one row of one upper attention layer costs with ``kind`` maps on this model (FLOP)."""
    from ..tools.flops import ModelDims
    from ..maps.kinds import map_kind as kind_named

    dims = ModelDims.from_hf_config(config)
    return kind_named(kind).fill_flops(dims.hidden_size, dims.kv_size)


def changed_settings(meta: dict, settings: dict) -> list[str]:
    """``name: old -> new`` for each resume-relevant setting of ``settings`` that a run's meta record holds
    otherwise (a setting the record lacks counts as its value before it was recorded, if any)."""
    before = {**_SETTINGS_BEFORE, **{k: meta[v] for k, v in _SETTINGS_BEFORE_AS.items() if meta.get(v) in DTYPES}}
    changed = []
    for k in _SETTINGS:
        if k not in settings:
            continue  # not known of this invocation (maps that do not say their dtype): nothing to compare
        if k not in meta and k not in before:
            continue  # not recorded by the run that wrote the file: nothing to compare
        old = meta.get(k, before.get(k))
        if old != settings[k]:
            changed.append(f"{k}: {old!r} -> {settings[k]!r}")
    return changed


def _resume_hint(meta: dict, settings: dict) -> str:
    """What to do about a run recorded with other settings: another ``--out``, or, where only the dtypes
    differ (a run resumed on another machine), the dtype that continues it."""
    dtype = meta.get("dtype")
    if dtype not in DTYPES:
        return "use another --out"
    if settings.get("maps_dtype", dtype) != dtype:
        return (f"fit its maps in the dtype its records were measured in (sgl-ridgefill calibrate ... --dtype {dtype}) "
                "or use another --out")
    if settings["dtype"] != dtype:
        return f"resume it with --dtype {dtype} (or without --dtype) or use another --out"
    return "use another --out"


def _main(args: argparse.Namespace) -> int:
    from ..tools.client import ServerError
    from ..maps import MapsError
    from .runner import RanExact, UpgradedAnswer

    try:
        return _run(args)
    except (ValueError, FileNotFoundError, ServerError, MapsError, RanExact, UpgradedAnswer) as e:
        raise SystemExit(f"sgl-ridgefill eval: {e}") from None


def _run(args: argparse.Namespace) -> int:
    from transformers import AutoTokenizer

    from ..models import resolve_model
    from .analysis import load_records
    from .documents import calibration_ids, long_documents
    from .needles import TASKS, make_samples
    from .runner import (RECORDS, EvalPlan, ResultStore, needle_jobs, loss_jobs, plan_record, run_loss, run_needle,
                         stock_check)

    if args.engine and (args.url or args.stock_url):
        raise SystemExit("sgl-ridgefill eval: --engine runs its own engines; leave out --url and --stock-url")
    preset = sizing.apply_preset(args)
    args.out.mkdir(parents=True, exist_ok=True)
    results = args.out / RECORDS
    if args.report_only:
        if not results.exists():
            raise SystemExit(f"sgl-ridgefill eval: {results} does not exist; run without --report-only first")
        return _write(args, load_records(results))
    from .shared_exact import source_dtype

    store = ResultStore(results)
    args.resolved_dtype = _dtype(args, None if store.meta is None else store.meta.get("dtype"),
                                 source_dtype(args.exact_from or ()))
    model_dir = resolve_model(args.model)
    config = json.loads((model_dir / "config.json").read_text())
    from ..maps import load_maps

    maps = load_maps(args.maps)
    split = args.split or maps.default_split
    kind = maps.kind.name  # folders written before map kinds hold residual maps
    if split not in maps.splits:
        raise SystemExit(f"sgl-ridgefill eval: --split {split}: the maps folder has splits {list(maps.splits)}")
    tasks = TASKS if args.tasks == "all" else tuple(t.strip() for t in args.tasks.split(","))
    unknown = [t for t in tasks if t not in TASKS]
    if unknown:
        raise SystemExit(f"sgl-ridgefill eval: unknown task(s) {', '.join(unknown)}; known: {', '.join(TASKS)}")
    try:
        needle_arms = A.parse_arms(args.needle_arms, A.NEEDLE_ARMS, also=A.LATER_ARMS)
        ranges = A.parse_splice_layers(args.splice_layers, split, config["num_hidden_layers"])
        loss_arms = A.with_splice_ranges(A.parse_arms(args.loss_arms, A.LOSS_ARMS), ranges)
        if args.rows_select is not None:
            A.check_rows_select(args.rows_select, split)
    except ValueError as e:
        raise SystemExit(f"sgl-ridgefill eval: {e}") from None
    _check_lengths(args.lengths, args.tail, config, tasks)
    from ..cpu.environment import is_hybrid_model

    hybrid = is_hybrid_model(model_dir)
    if hybrid and set(needle_arms) & set(A.LATER_ARMS):
        raise SystemExit("sgl-ridgefill eval: the later-question arms reuse a cached document (namespace cache "
                         "mode), which RidgeFill does not serve on hybrid (Gated DeltaNet) models")
    plan = EvalPlan(split=split, tail=args.tail, lengths=args.lengths, needle_arms=needle_arms, loss_arms=loss_arms,
                    upgrade_rows=args.upgrade_rows,
                    longtail={n: A.longtail_tail(config, n, split, args.tail, kind) for n in args.lengths})
    policy_file = args.out / f"{A.ROWS_POLICY}.rfpolicy"
    policy_file.write_text(A.rows_policy_text(split, args.tail, args.rows_select, "no_insert" if hybrid else "namespace"))

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    exclude = calibration_ids(args.maps)
    if not exclude:
        print("note: the maps manifest lists no calibration documents (older calibrate); none are left out", flush=True)
    haystacks = tuple(h.strip() for h in args.haystacks.split(",") if h.strip())
    print(f"making needle prompts ({', '.join(tasks)}; {', '.join(haystacks)}) and picking documents ...", flush=True)
    samples = make_samples(tokenizer, tasks, args.lengths, args.tail, haystacks=haystacks, seeds=tuple(range(args.seeds)),
                           n_filled=args.depths, exclude_ids=exclude)
    docs = {n: long_documents(tokenizer, n, args.docs, exclude=exclude) for n in args.lengths} if args.docs else {}
    print(sizing.plan_text(samples, needle_arms, docs, loss_arms), flush=True)
    warning = sizing.too_few_filled(preset, samples)
    if warning:
        print(warning, flush=True)

    # A selection of one's own has no fixed share: reports take the rows the server said it computed.
    rows = {"rows_policy": A.ROWS_POLICY, "rows_fraction": None if args.rows_select else A.ROWS_SHARE / 100,
            "rows_select": args.rows_select}
    settings = {"model_path": str(model_dir), "split": split, "tail": args.tail, "maps": str(args.maps),
                **rows, "map_kind": kind, "depths": args.depths, "upgrade_rows": args.upgrade_rows,
                "dtype": args.resolved_dtype}
    if maps.calibration_dtype is not None:
        settings["maps_dtype"] = maps.calibration_dtype  # maps fitted again elsewhere must read the same activations
    if store.meta is not None:
        # The depth grid names samples by index: another --depths would pair old ids with new positions.
        changed = changed_settings(store.meta, settings)
        if changed:
            raise SystemExit(f"sgl-ridgefill eval: {results} holds a run with other settings ({'; '.join(changed)}); "
                             + _resume_hint(store.meta, settings))
        meta = store.meta
    else:
        # Every resume-relevant setting, as a resumed run compares them.
        meta = {"kind": "meta", "model": args.model, **settings, "num_layers": config["num_hidden_layers"],
                "lengths": list(args.lengths), "preset": args.preset, "tasks": list(tasks),
                "haystacks": list(haystacks), "seeds": args.seeds,
                "longtail_tail": {str(k): v for k, v in plan.longtail.items()},
                "started": time.strftime("%Y-%m-%dT%H:%M:%S"), "command": "sgl-ridgefill " + shlex.join(sys.argv[1:]),
                "server": _backend_name(args), "threads": os.cpu_count(), **_cpu(args),
                "fill_flops_per_row": _fill_flops(kind, config)}
        store.add(meta)
    if args.exact_from:
        from .shared_exact import import_exact

        copied = import_exact(store, args.exact_from, meta, samples, docs, plan)
        print(f"--exact-from: reused {copied['needle']} needle and {copied['loss']} loss record(s) of the exact arm",
              flush=True)
    checked = any(r.get("kind") == "check" and r.get("passed") for r in load_records(results))
    max_len = max(args.lengths)
    from tqdm import tqdm

    started = time.perf_counter()
    check_prompts = [s.input_ids for s in samples[:2]] + [d.prompt_ids for d in docs.get(min(args.lengths), [])[:1]]
    if not check_prompts:
        raise SystemExit("sgl-ridgefill eval: nothing to run (no needle samples and --docs 0)")
    backend = _engines if args.engine else _servers
    jobs: list = []
    store.begin_session()
    try:
        with backend(args, model_dir, split, policy_file, max_len, None if checked else check_prompts) as (client, stock):
            if stock is not None:
                check = stock_check(client, stock, check_prompts)
                store.add(check)
                if not check["passed"]:
                    _write(args, load_records(results))
                    print("FAILED: the fill-disabled server is not byte-identical to stock: "
                          + "; ".join(check["mismatches"]), file=sys.stderr)
                    return 3
                print(f"check passed: fill-disabled server byte-identical to stock on {check['prompts']} prompts",
                      flush=True)
            jobs = [("needle", s, a) for s, a in needle_jobs(store, samples, plan)]
            jobs += [("loss", d, a) for d, a in loss_jobs(store, docs, plan)]
            planned = sum(sizing.request_counts(samples, needle_arms, docs, loss_arms))
            store.add(plan_record(requests=planned, pending=len(jobs), cpu=_cpu(args),
                                  maps=_maps_fingerprint(args.maps, split)))
            for kind, item, arm in tqdm(jobs, desc="eval requests", unit="req", dynamic_ncols=True):
                (run_needle if kind == "needle" else run_loss)(client, store, item, arm, plan)
    finally:
        # This invocation's wall time, servers included, when it ends or is interrupted (a killed one counts
        # to its last request through the requests' own records): the report adds up sessions.
        store.add(store.end_session())
    print(f"{len(jobs)} request(s) in {time.perf_counter() - started:.0f} s", flush=True)
    return _write(args, load_records(results))


def _write(args: argparse.Namespace, records: list[dict]) -> int:
    from .analysis import summarize
    from .report import write_report

    summary = summarize(records, n_resamples=args.n_resamples)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
    meta = summary.get("meta") or {}
    kind = f", {meta['map_kind']} maps" if meta.get("map_kind") else ""
    title = (f"{pathlib.Path(str(meta.get('model', 'model'))).name}{kind}, split {meta.get('split')}/"
             f"{meta.get('num_layers', '?')}, tail {meta.get('tail')}")
    path = write_report(summary, args.out, title=title, records=records)
    print(f"report: {path}")
    check = summary.get("check") or {}
    return 0 if check.get("passed") else 3
