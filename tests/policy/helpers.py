"""Models and maps folders matching the seeds' deployments, for compiling shipped policies in tests."""

from __future__ import annotations

from sgl_ridgefill.policy import MapsInfo, ModelInfo, PolicyError, compile_policy, parse_policy

# name prefix -> (model, maps folder) as the seeds describe them (layers, hybrid attention every 4th).
DEPLOYMENTS = {
    "llama-3.1-8b": (ModelInfo.dense(32), MapsInfo((12, 16), 12, 32)),
    "qwen3.5-9b": (ModelInfo.hybrid(32, attention_every=4), MapsInfo((12,), 12, 32)),
    "qwen3-8b": (ModelInfo.dense(36, has_qk_norm=True), MapsInfo((13, 18), 13, 36)),
    "qwen3.8-27b": (ModelInfo.hybrid(64, attention_every=4), MapsInfo((16, 24, 32), 16, 64)),
    "qwen3.8-flash-next": (ModelInfo.hybrid(48, attention_every=4), MapsInfo((24,), 24, 48)),
    "qwen2.5-0.5b": (ModelInfo.dense(24), MapsInfo((6, 12, 14), 12, 24)),
    "qwen2.5-1.5b": (ModelInfo.dense(28), MapsInfo((14,), 14, 28)),
    "plain": (ModelInfo.dense(30), MapsInfo((8, 15), 15, 30)),  # any model: the maps' default split
}


def deployment_for(policy_name: str):
    key = max((k for k in DEPLOYMENTS if policy_name.startswith(k)), key=len)
    return DEPLOYMENTS[key]


def parse(text: str):
    return parse_policy(text, "p.rfpolicy")


def error(text: str, **targets) -> str:
    """The full PolicyError message for ``text`` (parse and compile)."""
    try:
        compile_policy(parse(text), **targets)
    except PolicyError as err:
        return str(err)
    raise AssertionError("no PolicyError raised")
