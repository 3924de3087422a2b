"""Run one SGLang ``Engine`` on CPU in a child process and replay a script of requests against it.

Usage: ``python -m tests.support.engine_driver SPEC.json OUT.json``. SPEC: ``{"env": {...}, "engine":
{...Engine kwargs...}, "steps": [step, ...]}``; a step is one request ``{"input_ids": [...],
"sampling_params": {...}, "return_logprob": true, "top_logprobs_num": 3}`` or a list of such requests sent
together (one batch). OUT: one result per request, in order: ``output_ids``, ``logprobs`` (of the output
tokens), ``top`` (first token's top logprobs as ``[[logprob, id], ...]``), ``cached_tokens``, or ``error``.
The engine runs in its own process so every test module can give it its own environment.
"""

from __future__ import annotations

import json
import sys


def _result(out: dict) -> dict:
    meta = out["meta_info"]
    top = meta.get("output_top_logprobs") or [[]]
    return {
        "output_ids": out["output_ids"],
        "logprobs": [x[0] for x in meta.get("output_token_logprobs") or []],
        "top": [[x[0], x[1]] for x in (top[0] or [])],
        "tops": [[[x[0], x[1]] for x in (t or [])] for t in top],
        "cached_tokens": meta.get("cached_tokens"),
        "finish_reason": meta.get("finish_reason"),
        "input_logprobs": [x[0] for x in meta.get("input_token_logprobs") or []],
        "input_tops": [[[x[0], x[1]] for x in (t or [])] for t in meta.get("input_top_logprobs") or []],
        "ridgefill": meta.get("ridgefill"),
    }


def main(spec_path: str, out_path: str) -> None:
    with open(spec_path) as f:
        spec = json.load(f)
    import sglang as sgl

    llm = sgl.Engine(**spec["engine"])
    results = []
    try:
        for step in spec["steps"]:
            reqs = step if isinstance(step, list) else [step]
            kwargs = dict(
                input_ids=[r["input_ids"] for r in reqs],
                sampling_params=[r.get("sampling_params", {}) for r in reqs],
                return_logprob=reqs[0].get("return_logprob", True),
                top_logprobs_num=reqs[0].get("top_logprobs_num", 3),
            )
            if reqs[0].get("logprob_start_len") is not None:
                kwargs["logprob_start_len"] = [r["logprob_start_len"] for r in reqs]
            try:
                outs = llm.generate(**kwargs)
                results.extend(_result(o) for o in outs)
            except Exception as e:  # noqa: BLE001 - the test asserts on the message
                results.extend({"error": f"{type(e).__name__}: {e}"} for _ in reqs)
    finally:
        llm.shutdown()
    with open(out_path, "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
