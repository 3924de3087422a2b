"""Start CPU engines for tests (``engine_driver.py`` in a child process) and build request steps."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import tempfile

from sgl_ridgefill.cpu.environment import cpu_environment

REPO = pathlib.Path(__file__).resolve().parents[2]
ENGINE_TIMEOUT_S = 900
# SGLang sizes the KV pool on CPU from the memory that loading the weights left of what was free before it;
# other processes allocating meanwhile (a second engine, a parallel test) read as the weights' share. Half
# tolerates that; --max-total-tokens keeps the pool itself small.
MEM_FRACTION = 0.5


def cpu_engine_kwargs(model_path, **overrides) -> dict:
    kwargs = dict(
        model_path=str(model_path),
        device="cpu",
        attention_backend="ridgefill_cpu",
        cuda_graph_backend_decode="disabled",
        cuda_graph_backend_prefill="disabled",
        sampling_backend="pytorch",
        max_total_tokens=8192,
        mem_fraction_static=MEM_FRACTION,
        chunked_prefill_size=48,
        dtype="float32",
        log_level="warning",
        skip_tokenizer_init=True,
    )
    kwargs.update(overrides)
    return kwargs


def run_engine(engine: dict, steps: list, env: dict | None = None, *, plugins: str | None = None) -> list[dict]:
    """Run ``steps`` against an Engine built from ``engine`` kwargs; ``env`` adds RIDGEFILL_* variables."""
    full_env = cpu_environment()
    for key in list(full_env):
        if key.startswith("RIDGEFILL_"):
            del full_env[key]
    full_env.update(env or {})
    if plugins is not None:
        full_env["SGLANG_PLUGINS"] = plugins
    full_env["PYTHONPATH"] = os.pathsep.join([full_env["PYTHONPATH"], str(REPO)])
    with tempfile.TemporaryDirectory() as tmp:
        spec_path, out_path = pathlib.Path(tmp, "spec.json"), pathlib.Path(tmp, "out.json")
        spec_path.write_text(json.dumps({"engine": engine, "steps": steps}))
        proc = subprocess.run(
            [sys.executable, "-m", "tests.support.engine_driver", str(spec_path), str(out_path)],
            cwd=REPO, env=full_env, capture_output=True, text=True, timeout=ENGINE_TIMEOUT_S,
        )
        if proc.returncode != 0 or not out_path.exists():
            raise RuntimeError(f"engine driver failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-8000:]}")
        return json.loads(out_path.read_text())


def request(ids: list[int], ridgefill=None, *, max_new_tokens: int = 1, top: int = 3) -> dict:
    sp = {"max_new_tokens": max_new_tokens, "temperature": 0.0}
    if ridgefill is not None:
        sp["custom_params"] = {"ridgefill": ridgefill}
    return {"input_ids": ids, "sampling_params": sp, "return_logprob": True, "top_logprobs_num": top}


def prompt(seed: int, n: int, vocab: int = 1000) -> list[int]:
    """A deterministic prompt of ``n`` token ids (ids >= 5 avoid special tokens)."""
    return [(7 * t + 13 * seed + (t * t * (seed + 1)) % 17) % vocab + 5 for t in range(n)]
