"""``sgl-ridgefill soak``: many concurrent clients against a RidgeFill server, checked against stock SGLang.

    sgl-ridgefill soak --tiny --requests 300 --clients 8 --fuzz 500 --out soak.json
    sgl-ridgefill soak --model DIR --maps DIR [--split S] [--tail T] ...
    sgl-ridgefill soak --url URL --stock-url URL --model DIR --maps DIR --tail T --chunk C --context-length N

Without ``--url`` it starts both servers on this CPU (``servers.py``): with ``--tiny`` on a random-weight
Llama and maps it makes in the work folder. The JSON summary goes to stdout (and ``--out``), progress to
stderr; the exit status is 1 when any failure count is non-zero (docs/RELIABILITY.md).
"""

from __future__ import annotations

import contextlib
import json
import pathlib
import shlex
import sys
import tempfile
import time

from ..vocabulary import CACHE_MODES

DEFAULT_CHUNK = 48
DEFAULT_CONTEXT = 512
DEFAULT_TAIL = 20


def add_subparser(subparsers) -> None:
    p = subparsers.add_parser(
        "soak", help="soak and fuzz a RidgeFill server with concurrent clients; exact answers checked against stock",
        description=__doc__.splitlines()[0],
    )
    src = p.add_argument_group("model and servers")
    src.add_argument("--tiny", action="store_true", help="serve a random-weight 4-layer Llama and maps made here")
    src.add_argument("--model", type=pathlib.Path, help="HF model folder (needed unless --tiny)")
    src.add_argument("--maps", type=pathlib.Path, help="maps folder for --model")
    src.add_argument("--split", type=int, default=None, help="split layer (default: 2 with --tiny, else the maps' default)")
    src.add_argument("--tail", type=int, default=DEFAULT_TAIL, help=f"tail T in tokens (default {DEFAULT_TAIL})")
    src.add_argument("--chunk", type=int, default=DEFAULT_CHUNK,
                     help=f"--chunked-prefill-size of both servers (default {DEFAULT_CHUNK}: prompts span several)")
    src.add_argument("--context-length", type=int, default=DEFAULT_CONTEXT,
                     help=f"--context-length of both servers (default {DEFAULT_CONTEXT}; longer prompts must be refused)")
    src.add_argument("--max-total-tokens", type=int, default=None, metavar="N",
                     help="both servers' KV pool in tokens (default 16384; a small pool, e.g. 2048 with 16 clients, "
                     "makes SGLang evict cached prefixes; its admission keeps room to decode, so retraction needs "
                     "--retract-every)")
    src.add_argument("--cache-mode", choices=CACHE_MODES, default="no_insert",
                     help="the RidgeFill server's --ridgefill-cache-mode (default no_insert; the soak's own policy "
                     "and its namespace calls use namespace either way)")
    src.add_argument("--retract-every", type=int, default=None, metavar="N",
                     help="the RidgeFill server retracts running decode requests every N-th forward (SGLang's own "
                     "SGLANG_TEST_RETRACT knob; it always keeps one running), so retraction happens whatever the pool")
    src.add_argument("--ridgefill-flags", type=shlex.split, default=[], metavar="FLAGS",
                     help="more flags for the RidgeFill server it starts, one string (e.g. '--ridgefill-slice-rows 0')")
    src.add_argument("--url", default=None, help="a running RidgeFill server (started with the flags the soak uses)")
    src.add_argument("--stock-url", default=None, help="a running stock server on the same model (needed with --url)")
    work = p.add_argument_group("workload")
    work.add_argument("--requests", type=int, default=300, help="requests of the soak (default 300)")
    work.add_argument("--clients", type=int, default=8, help="concurrent client threads (default 8)")
    work.add_argument("--seed", type=int, default=0, help="seed of the workload and the fuzzer (default 0)")
    work.add_argument("--fuzz", type=int, default=0, metavar="N",
                      help="also fuzz N request bodies and N policy texts (default 0: no fuzzing)")
    work.add_argument("--max-minutes", type=float, default=60.0, help="deadline of the whole run (default 60)")
    p.add_argument("--workdir", type=pathlib.Path, default=None, help="models, policy and server logs (default: a temp dir)")
    p.add_argument("--out", type=pathlib.Path, default=None, help="also write the JSON summary here")
    p.set_defaults(func=_main)


def _check_args(args) -> None:
    if args.url and not args.stock_url:
        raise SystemExit("sgl-ridgefill soak: --url needs --stock-url (exact answers are checked against stock)")
    if not args.tiny and (args.model is None or args.maps is None):
        raise SystemExit("sgl-ridgefill soak: pass --tiny, or --model DIR and --maps DIR")
    if args.tiny and args.url:
        raise SystemExit("sgl-ridgefill soak: --tiny starts its own servers; leave out --url")
    for name in ("requests", "clients", "tail", "chunk", "context_length"):
        if getattr(args, name) < 1:
            raise SystemExit(f"sgl-ridgefill soak: --{name.replace('_', '-')} must be at least 1")
    if args.max_total_tokens is not None and args.max_total_tokens < args.context_length:
        raise SystemExit(f"sgl-ridgefill soak: --max-total-tokens {args.max_total_tokens} is below --context-length "
                         f"{args.context_length}: the longest prompt would never fit")
    if args.url and (args.max_total_tokens is not None or args.cache_mode != "no_insert" or args.retract_every
                     or args.ridgefill_flags):
        raise SystemExit("sgl-ridgefill soak: --max-total-tokens, --cache-mode, --retract-every and --ridgefill-flags "
                         "configure the servers it starts; with --url, start yours with them")
    if args.retract_every is not None and args.retract_every < 1:
        raise SystemExit("sgl-ridgefill soak: --retract-every must be at least 1")
    if args.fuzz < 0:
        raise SystemExit("sgl-ridgefill soak: --fuzz must be at least 0")


def environment(served, args) -> dict:
    import torch

    from ..cpu.environment import cpu_environment

    return {
        "model": "tiny random-weight Llama (4 layers, hidden 128, float32)" if served.tiny else str(served.model),
        "model_path": str(served.model), "maps": str(served.maps), "split": served.split, "tail": served.tail,
        "chunked_prefill_size": args.chunk, "context_length": args.context_length,
        "max_total_tokens": args.max_total_tokens, "cache_mode": args.cache_mode, "retract_every": args.retract_every,
        "ridgefill_flags": list(args.ridgefill_flags),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "server_threads": int(cpu_environment().get("OMP_NUM_THREADS", "0")),
        "client_threads": args.clients, "torch": torch.__version__,
    }


def _main(args) -> int:
    from .run import SoakConfig, Target, run_soak, say
    from .servers import POOL_TOKENS, healthy, local_servers, make_tiny_model, served_model
    from .workload import Shape

    _check_args(args)
    started = time.monotonic()
    with contextlib.ExitStack() as stack:
        workdir = args.workdir or pathlib.Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="rf-soak-")))
        workdir.mkdir(parents=True, exist_ok=True)
        if args.tiny:
            say(f"making a tiny model and maps in {workdir}")
            served = make_tiny_model(workdir, split=args.split or 2, tail=args.tail)
        else:
            served = served_model(args.model, args.maps, args.split, args.tail)
        low = 2 if served.tiny else 100  # clear of the special tokens at the start of a real vocabulary
        shape = Shape(tail=args.tail, chunk=args.chunk, context_length=args.context_length, token_low=low,
                      token_high=min(served.vocab_size, 30_000))
        if args.url:
            rf, stock = Target(args.url.rstrip("/")), Target(args.stock_url.rstrip("/"))
            for name, target in (("--url", rf), ("--stock-url", stock)):
                if not healthy(target.url):
                    raise SystemExit(f"sgl-ridgefill soak: {name} {target.url} does not answer /health with 200")
        else:
            say(f"starting the RidgeFill and the stock server (logs in {workdir})")
            pool = args.max_total_tokens or POOL_TOKENS
            rf_proc, stock_proc = stack.enter_context(local_servers(served, workdir, args.chunk, args.context_length,
                                                                    pool=pool, cache_mode=args.cache_mode,
                                                                    retract_every=args.retract_every,
                                                                    extra=args.ridgefill_flags))
            rf = Target(rf_proc.url, rf_proc, rf_proc.log_path)
            stock = Target(stock_proc.url, stock_proc, stock_proc.log_path)
        cfg = SoakConfig(requests=args.requests, clients=args.clients, seed=args.seed, fuzz=args.fuzz, shape=shape,
                         max_minutes=args.max_minutes, maps_dir=served.maps, environment=environment(served, args),
                         pool_tokens=None if args.url else args.max_total_tokens or POOL_TOKENS)
        setup_s = time.monotonic() - started
        summary = run_soak(cfg, rf, stock)
    # setup: the tiny model and the servers' start; wall: the whole command
    summary["run"].update(setup_s=round(setup_s, 1), command_wall_s=round(time.monotonic() - started, 1))
    text = json.dumps(summary, indent=2, default=repr)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    print(text)
    verdict = "passed" if summary["ok"] else f"FAILED: {summary['failures']}"
    print(f"[soak] {verdict}", file=sys.stderr)
    return 0 if summary["ok"] else 1
