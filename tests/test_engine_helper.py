from __future__ import annotations

from types import SimpleNamespace

import pytest

from sgl_ridgefill.engine import ridgefill_engine, ridgefill_environment
from sgl_ridgefill.settings import SETTINGS


def test_environment_for_options():
    env = ridgefill_environment(ridgefill_maps="/m", ridgefill_split=12, ridgefill_tail=None,
                                ridgefill_diagnostics=True, ridgefill_request_policies=["a", "b"])
    assert env == {"RIDGEFILL_PREFILL_BACKEND": "ridgefill", "RIDGEFILL_MAPS": "/m", "RIDGEFILL_SPLIT": "12",
                   "RIDGEFILL_DIAGNOSTICS": "1", "RIDGEFILL_REQUEST_POLICIES": "a,b"}
    assert ridgefill_environment(ridgefill_diagnostics=False)["RIDGEFILL_DIAGNOSTICS"] == "0"


def test_unknown_option():
    with pytest.raises(ValueError) as e:
        ridgefill_environment(ridgefill_spilt=3)
    # every server setting but the backend itself is a keyword, listed sorted after the unknown one
    known = sorted(f"ridgefill_{s.name}" for s in SETTINGS if s.name != "prefill_backend")
    assert {"ridgefill_split", "ridgefill_maps", "ridgefill_map_residence"} <= set(known)
    assert str(e.value) == f"unknown RidgeFill option(s) ridgefill_spilt; known: {', '.join(known)}"


def test_bad_option_is_refused_before_any_process_starts(monkeypatch):
    monkeypatch.delenv("RIDGEFILL_PREFILL_BACKEND", raising=False)
    with pytest.raises(ValueError, match="--ridgefill-arm 'fast' is not one of"):
        ridgefill_engine(model_path="/nonexistent", ridgefill_arm="fast", ridgefill_maps="/m")
    import os

    assert "RIDGEFILL_PREFILL_BACKEND" not in os.environ  # restored after the failure


class _StubEngine:
    """Stands in for ``sglang.Engine``: records the environment it was constructed under."""

    seen: dict[str, str] = {}

    def __init__(self, **kwargs):
        import os
        import types

        type(self).seen = dict(os.environ)
        self.kwargs = kwargs
        self.tokenizer_manager = types.SimpleNamespace()


def test_environment_is_restored_after_the_engine_starts(monkeypatch):
    """C15: the scheduler inherits the RIDGEFILL_* variables while the engine starts; the caller's process
    keeps its own environment, so a later ``sglang.Engine`` is stock."""
    import os

    import sglang

    monkeypatch.delenv("RIDGEFILL_PREFILL_BACKEND", raising=False)
    monkeypatch.setenv("RIDGEFILL_TAIL", "77")  # the caller's own value comes back
    monkeypatch.setattr(sglang, "Engine", _StubEngine)
    before = dict(os.environ)
    engine = ridgefill_engine(model_path="/m", ridgefill_arm="identity", ridgefill_tail=5)
    assert dict(os.environ) == before
    assert engine.kwargs == {"model_path": "/m"}
    seen = _StubEngine.seen
    assert (seen["RIDGEFILL_PREFILL_BACKEND"], seen["RIDGEFILL_ARM"]) == ("ridgefill", "identity")
    assert _StubEngine.seen["RIDGEFILL_TAIL"] == "5"
    # The tokenizer manager runs in this process and checks requests after the environment is restored.
    from sgl_ridgefill.config import config_for

    config = config_for(engine.tokenizer_manager)
    assert (config.enabled, config.arm, config.tail) == (True, "identity", 5)


def test_environment_is_restored_when_the_engine_fails(monkeypatch):
    import os

    import sglang

    class Failing:
        def __init__(self, **kwargs):
            assert os.environ["RIDGEFILL_PREFILL_BACKEND"] == "ridgefill"
            raise RuntimeError("scheduler died")

    monkeypatch.delenv("RIDGEFILL_PREFILL_BACKEND", raising=False)
    monkeypatch.setattr(sglang, "Engine", Failing)
    before = dict(os.environ)
    with pytest.raises(RuntimeError, match="scheduler died"):
        ridgefill_engine(model_path="/m", ridgefill_arm="nofill")
    assert dict(os.environ) == before


def _request(ridgefill):
    return SimpleNamespace(sampling_params={"custom_params": {"ridgefill": ridgefill}}, extra_key=None,
                           input_embeds=None, image_data=None)


def test_tokenizer_check_reads_the_bound_settings_not_the_environment(monkeypatch):
    """After ``ridgefill_engine`` returns, the environment says stock; the engine's tokenizer manager must
    still accept RidgeFill requests, and a stock manager must still refuse them."""
    from sgl_ridgefill.config import ServerConfig, bind_config
    from sgl_ridgefill.patches import after_validate_one_request
    from sgl_ridgefill.request_schema import RequestParamError

    monkeypatch.delenv("RIDGEFILL_PREFILL_BACKEND", raising=False)
    rf, stock = SimpleNamespace(), SimpleNamespace()
    bind_config(rf, ServerConfig(prefill_backend="ridgefill", arm="identity"))
    assert after_validate_one_request(None, rf, _request({"tail": 4}), [1, 2]) is None
    with pytest.raises(RequestParamError, match="runs with --prefill-backend default"):
        after_validate_one_request(None, stock, _request({"tail": 4}), [1, 2])
    assert after_validate_one_request(None, stock, _request(False), [1, 2]) is None
