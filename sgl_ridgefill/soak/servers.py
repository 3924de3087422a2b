"""The two servers a soak compares: a RidgeFill server and a stock one on the same model, and what the soak
reads from them (health, the live-request gauge, the scheduler log).

Both run through the same CPU launcher, so both use the ``ridgefill_cpu`` attention backend; the stock
server only lacks ``--prefill-backend ridgefill`` (and the ``--ridgefill-*`` settings), which is what
"byte-identical with RidgeFill off" compares against. The RidgeFill server runs a small prefill chunk (a
prompt spans several), the diagnostics (every arm and control), every shipped policy by name, and its own
policy (attention-selected rows, a cache namespace) selectable by name, while its flags keep ``no_insert`` as
the default cache mode.
"""

from __future__ import annotations

import contextlib
import json
import pathlib
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from ..cpu.environment import cpu_environment
from ..cpu.launch_server_process import ServerProcess
from ..metrics import LIVE_REQUESTS
from ..settings import cli_flags
from .workload import NAMESPACE_POLICY

LIVE_GAUGE = LIVE_REQUESTS


@dataclass(frozen=True)
class ServedModel:
    """A model folder, its maps folder and what the workload needs to know about both."""

    model: pathlib.Path
    maps: pathlib.Path
    split: int  # the split layer the server runs (the maps' default unless one was asked for)
    tail: int
    vocab_size: int
    tiny: bool = False


def make_tiny_model(workdir: pathlib.Path, split: int = 2, tail: int = 20) -> ServedModel:
    """A random-weight 4-layer Llama (float32, trained tiny tokenizer) and maps at ``split``, in ``workdir``
    (reused when already there)."""
    from ..tools.synthetic import TINY_VOCAB_SIZE, make_tiny_checkpoint, make_tiny_maps

    model, maps = workdir / "tiny-llama", workdir / f"tiny-llama-maps-s{split}"
    if not (model / "config.json").is_file():
        make_tiny_checkpoint(model, family="llama", num_layers=4)
    if not (maps / "manifest.json").is_file():
        make_tiny_maps(model, maps, split=split, force=True)
    return ServedModel(model, maps, split, tail, TINY_VOCAB_SIZE, tiny=True)


def served_model(model: pathlib.Path, maps: pathlib.Path, split: int | None, tail: int) -> ServedModel:
    config = json.loads((model / "config.json").read_text())
    vocab = config.get("vocab_size") or (config.get("text_config") or {}).get("vocab_size")
    if not isinstance(vocab, int):
        raise ValueError(f"{model}/config.json has no vocab_size")
    if split is None:
        split = json.loads((maps / "manifest.json").read_text()).get("default_split")
        if not isinstance(split, int):
            raise ValueError(f"{maps}/manifest.json has no default split; pass --split")
    return ServedModel(model, maps, split, tail, vocab)


def write_soak_policy(path: pathlib.Path, split: int, tail: int) -> pathlib.Path:
    """The RidgeFill server's own policy, also selected by name (``soak-namespace``): rows selected by the
    attention of the last 8 prompt tokens and of the 8 before the tail (both windows a radix hit can cut into:
    the query rows must still be found when the cache holds part of the prompt), and a cache namespace, so that requests naming it share filled KV among
    themselves. The server's ``--ridgefill-cache-mode no_insert`` keeps the default requests out of it."""
    layer = split - 1  # an attention layer below the split (the tiny model and Qwen2.5 attend in every layer)
    window = f"q=8, share=5%, layers=[{layer}]"
    text = (
        f'policy "{NAMESPACE_POLICY}" {{\n  arm ridgefill\n  split {split}\n  tail {tail}\n'
        f'  select attention_topk({window}) | attention_topk({window}, query="before_tail")\n'
        f"  cache namespace\n}}\n"
    )
    path.write_text(text, encoding="utf-8")
    return path


POOL_TOKENS = 16384  # --max-total-tokens of both servers unless the soak asks for a smaller pool


SPLIT_STATE_CACHE_MIB = 4  # the RidgeFill server's --ridgefill-split-state-cache-mib


def common_flags(served: ServedModel, chunk: int, context_length: int, pool: int = POOL_TOKENS) -> list[str]:
    dtype = "float32" if served.tiny else "bfloat16"
    return ["--model-path", str(served.model), "--dtype", dtype, "--context-length", str(context_length),
            "--max-total-tokens", str(pool), "--mem-fraction-static", "0.5", "--chunked-prefill-size", str(chunk),
            "--enable-metrics"]


def ridgefill_flags(served: ServedModel, policy_file: pathlib.Path, chunk: int, context_length: int,
                    pool: int = POOL_TOKENS, cache_mode: str = "no_insert", extra: Sequence[str] = ()) -> list[str]:
    """The RidgeFill server's flags: the stock server's, RidgeFill's settings, then ``extra``."""
    settings = {
        "prefill_backend": "ridgefill", "maps": str(served.maps), "split": served.split, "tail": served.tail,
        "cache_mode": cache_mode,  # the server's flag beats its policy's cache mode; a named policy beats both
        "policy": str(policy_file), "diagnostics": True, "request_policies": ("all",),
        # A store that fills within the first requests and then evicts: the RSS check then sees leaks, not a
        # bounded cache growing towards its default 1 GiB.
        "split_state_cache_mib": SPLIT_STATE_CACHE_MIB,
    }
    return common_flags(served, chunk, context_length, pool) + cli_flags(settings) + list(extra)


@contextlib.contextmanager
def local_servers(served: ServedModel, workdir: pathlib.Path, chunk: int, context_length: int,
                  timeout: float = 900, pool: int = POOL_TOKENS, cache_mode: str = "no_insert",
                  retract_every: int | None = None, extra: Sequence[str] = ()) -> Iterator[tuple[ServerProcess, ServerProcess]]:
    """Start the RidgeFill and the stock server side by side (logs in ``workdir``); yield both, stop both.
    ``pool``: both servers' KV pool in tokens (small: cached prefixes are evicted); ``cache_mode``: the RidgeFill
    server's ``--ridgefill-cache-mode``; ``retract_every``: the RidgeFill server retracts running decode
    requests every that many forwards (SGLang's ``SGLANG_TEST_RETRACT``, which keeps at least one running, so
    a request alone is never retracted and the one-at-a-time replays stay comparable bit for bit); ``extra``:
    more flags for the RidgeFill server."""
    policy = write_soak_policy(workdir / f"{NAMESPACE_POLICY}.rfpolicy", served.split, served.tail)
    env = {k: v for k, v in cpu_environment().items() if not k.startswith("RIDGEFILL_")}
    rf_env = dict(env)
    if retract_every is not None:
        rf_env.update(SGLANG_TEST_RETRACT="1", SGLANG_TEST_RETRACT_INTERVAL=str(retract_every))
    rf = ServerProcess(ridgefill_flags(served, policy, chunk, context_length, pool, cache_mode, extra),
                       log_path=workdir / "ridgefill-server.log", env=rf_env)
    stock = ServerProcess(common_flags(served, chunk, context_length, pool), log_path=workdir / "stock-server.log",
                          env=env)
    try:
        rf.start()
        stock.start()
        rf.wait_ready(timeout)
        stock.wait_ready(timeout)
        yield rf, stock
    finally:
        rf.stop()
        stock.stop()


# ----------------------------------------------------------------------------- reading a server
def healthy(url: str, timeout: float = 30.0) -> bool:
    import requests

    try:
        return requests.get(url.rstrip("/") + "/health", timeout=timeout).status_code == 200
    except requests.RequestException:
        return False


def metric_value(text: str, name: str) -> float | None:
    """The sum of the samples of ``name`` (any labels) in Prometheus text, None when absent."""
    pattern = re.compile(rf"^{re.escape(name)}(?:{{[^}}]*}})?\s+(\S+)$", re.MULTILINE)
    values = [float(v) for v in pattern.findall(text)]
    return sum(values) if values else None


def read_metrics(url: str) -> str | None:
    import requests

    try:
        resp = requests.get(url.rstrip("/") + "/metrics", timeout=30)
    except requests.RequestException:
        return None
    return resp.text if resp.status_code == 200 else None


def log_excerpts(log_path: pathlib.Path | None, marker: str = "Traceback", limit: int = 3,
                 lines: int = 25) -> tuple[int, list[str]]:
    """How often ``marker`` occurs in a server log, and the first ``limit`` excerpts from there on."""
    if log_path is None or not log_path.is_file():
        return 0, []
    text = log_path.read_text(errors="replace").splitlines()
    hits = [i for i, line in enumerate(text) if marker in line]
    return len(hits), ["\n".join(text[i : i + lines])[-4000:] for i in hits[:limit]]
