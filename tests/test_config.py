from __future__ import annotations

from types import SimpleNamespace

import pytest

from sgl_ridgefill import envs
from sgl_ridgefill.config import ServerConfig, bind_config, config_for


def test_from_env(monkeypatch):
    monkeypatch.setenv(envs.PREFILL_BACKEND, "ridgefill")
    monkeypatch.setenv(envs.SERVER["maps"], "/m")
    monkeypatch.setenv(envs.SERVER["split"], "12")
    monkeypatch.setenv(envs.SERVER["tail"], "1024")
    cfg = ServerConfig.from_env()
    assert (cfg.enabled, cfg.maps, cfg.split, cfg.tail) == (True, "/m", 12, 1024)


def test_from_env_of_a_mapping_ignores_the_process_environment(monkeypatch):
    monkeypatch.setenv(envs.SERVER["tail"], "5")
    assert ServerConfig.from_env({envs.SERVER["split"]: "3", envs.SERVER["maps"]: ""}) == ServerConfig(split=3)


def test_ridgefill_arm_needs_maps():
    with pytest.raises(ValueError, match="^--prefill-backend ridgefill needs --ridgefill-maps DIR"):
        ServerConfig(prefill_backend="ridgefill")
    assert ServerConfig(prefill_backend="ridgefill", arm="identity").maps is None


@pytest.mark.parametrize(
    "kw, msg",
    [
        (dict(arm="fast"), "--ridgefill-arm 'fast' is not one of ridgefill, identity, nofill, exact"),
        (dict(cache_mode="share"), "--ridgefill-cache-mode 'share' is not one of auto, no_insert, namespace"),
        (dict(split=0), "--ridgefill-split must be >= 1, got 0"),
        (dict(tail=-5), "--ridgefill-tail must be >= 1, got -5"),
        (dict(tail="5"), "--ridgefill-tail must be an integer, got '5'"),
    ],
)
def test_bad_values(kw, msg):
    with pytest.raises(ValueError) as e:
        ServerConfig(**kw)
    assert str(e.value) == msg


def test_non_integer_split(monkeypatch):
    monkeypatch.setenv(envs.SERVER["split"], "twelve")
    with pytest.raises(ValueError) as e:
        ServerConfig.from_env()
    assert str(e.value) == "RIDGEFILL_SPLIT='twelve' (--ridgefill-split) is not an integer"


def test_a_bad_choice_in_the_environment_names_the_flag(monkeypatch):
    monkeypatch.setenv(envs.SERVER["arm"], "fast")
    with pytest.raises(ValueError, match="^--ridgefill-arm 'fast' is not one of"):
        ServerConfig.from_env()


def test_config_for_a_tokenizer_manager(monkeypatch):
    """A bound config wins over the environment; an unbound manager reads the environment once."""
    monkeypatch.delenv(envs.PREFILL_BACKEND, raising=False)
    bound, unbound = SimpleNamespace(), SimpleNamespace()
    bind_config(bound, ServerConfig(prefill_backend="ridgefill", maps="/m"))
    assert config_for(bound).enabled
    assert not config_for(unbound).enabled
    monkeypatch.setenv(envs.PREFILL_BACKEND, "ridgefill")
    monkeypatch.setenv(envs.SERVER["maps"], "/m")
    assert not config_for(unbound).enabled  # kept from its first request
    assert config_for(SimpleNamespace()).enabled
