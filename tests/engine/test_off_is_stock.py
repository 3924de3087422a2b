"""With RidgeFill off, or with S = L, outputs are byte-identical to stock SGLang (token ids and logprobs).

Stock means SGLang without this plugin (``SGLANG_PLUGINS`` leaves it out). The plugin's always-on parts
(flags, request checks, the ``ridgefill_cpu`` backend) must not change a single bit; with the backend the
comparison is against the same backend with RidgeFill off, since both arms of every comparison run on one
backend. ``ridgefill_cpu`` against ``torch_native`` is close but not bitwise (different SDPA blocking).
"""

from __future__ import annotations

import pytest

from tests.engine.conftest import NUM_LAYERS, SPLIT
from tests.support.engines import cpu_engine_kwargs, prompt, request, run_engine

pytestmark = pytest.mark.engine
PROMPTS = [prompt(20 + s, n) for s, n in enumerate((150, 97, 15))]


def _steps(ridgefill):
    return [request(p, ridgefill, max_new_tokens=4, top=5) for p in PROMPTS]


def _strip(results):
    return [(r["output_ids"], r["logprobs"], r["tops"]) for r in results]


# Qwen3 (K norm) is slow: about 80 s more; Llama runs in the README's test command.
@pytest.fixture(scope="module", params=["llama", pytest.param("qwen3", marks=pytest.mark.slow)])
def family(request):
    return request.param


@pytest.fixture(scope="module")
def runs(family, tiny_models):
    model = tiny_models(family)
    rf_env = {"RIDGEFILL_PREFILL_BACKEND": "ridgefill", "RIDGEFILL_MAPS": str(model.maps_dir),
              "RIDGEFILL_SPLIT": str(SPLIT), "RIDGEFILL_TAIL": "20"}
    out = {}
    if family == "llama":
        native = cpu_engine_kwargs(model.path, attention_backend="torch_native", disable_radix_cache=True)
        out["stock_torch_native"] = run_engine(native, _steps(None), plugins="smg-servicer")
        out["plugin_off_torch_native"] = run_engine(native, _steps(None))
        # An unsupported configuration (a backend that cannot run exact rows) runs every request exactly.
        out["on_unsupported_backend"] = run_engine(native, _steps({}), rf_env)
    # No radix cache: a prompt seen before would extend from cached rows, which rounds differently.
    rf_backend = cpu_engine_kwargs(model.path, disable_radix_cache=True)
    out["plugin_off"] = run_engine(rf_backend, _steps(None))
    on = run_engine(rf_backend, _steps({"enabled": False}) + _steps({"split": NUM_LAYERS}) + _steps({}), rf_env)
    n = len(PROMPTS)
    out["on_disabled"], out["on_split_eq_layers"], out["on_ridgefill"] = on[:n], on[n : 2 * n], on[2 * n :]
    return out


def test_plugin_installed_but_off_is_stock(runs, family):
    if family != "llama":
        pytest.skip("stock torch_native comparison runs on the Llama checkpoint")
    assert _strip(runs["plugin_off_torch_native"]) == _strip(runs["stock_torch_native"])


def test_unsupported_configuration_runs_exact(runs, family):
    if family != "llama":
        pytest.skip("torch_native runs on the Llama checkpoint")
    assert _strip(runs["on_unsupported_backend"]) == _strip(runs["stock_torch_native"])


def test_disabled_requests_are_identical(runs):
    assert _strip(runs["on_disabled"]) == _strip(runs["plugin_off"])


def test_split_equal_to_layers_is_identical(runs):
    assert _strip(runs["on_split_eq_layers"]) == _strip(runs["plugin_off"])


def test_ridgefill_actually_changes_long_prompts(runs):
    """The comparisons above would pass trivially if the server ignored RidgeFill."""
    assert runs["on_ridgefill"][0]["logprobs"] != runs["plugin_off"][0]["logprobs"]
    assert _strip(runs["on_ridgefill"])[2] == _strip(runs["plugin_off"])[2]  # 15 tokens: shorter than the tail, so exact


def test_ridgefill_cpu_backend_is_close_to_torch_native(runs, family):
    if family != "llama":
        pytest.skip("torch_native runs on the Llama checkpoint")
    for a, b in zip(runs["plugin_off"], runs["plugin_off_torch_native"]):
        assert a["output_ids"] == b["output_ids"]
        assert max(abs(x - y) for x, y in zip(a["logprobs"], b["logprobs"])) < 1e-4
