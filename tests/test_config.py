from __future__ import annotations

import pytest

from sgl_ridgefill import envs
from sgl_ridgefill.config import ServerConfig


def test_from_env(monkeypatch):
    monkeypatch.setenv(envs.PREFILL_BACKEND, "ridgefill")
    monkeypatch.setenv(envs.MAPS, "/m")
    monkeypatch.setenv(envs.SPLIT, "12")
    monkeypatch.setenv(envs.TAIL, "1024")
    cfg = ServerConfig.from_env()
    assert (cfg.enabled, cfg.maps, cfg.split, cfg.tail) == (True, "/m", 12, 1024)


def test_ridgefill_arm_needs_maps():
    with pytest.raises(ValueError, match="needs --ridgefill-maps DIR"):
        ServerConfig(enabled=True)
    assert ServerConfig(enabled=True, arm="identity").maps is None


@pytest.mark.parametrize(
    "kw, msg",
    [
        (dict(arm="fast"), "--ridgefill-arm 'fast' is not one of ridgefill, identity, nofill, exact"),
        (dict(cache_mode="share"), "--ridgefill-cache-mode 'share' is not one of no_insert, namespace"),
        (dict(split=0), "--ridgefill-split must be >= 1, got 0"),
        (dict(tail=-5), "--ridgefill-tail must be >= 1, got -5"),
    ],
)
def test_bad_values(kw, msg):
    with pytest.raises(ValueError) as e:
        ServerConfig(**kw)
    assert str(e.value) == msg


def test_non_integer_split(monkeypatch):
    monkeypatch.setenv(envs.SPLIT, "twelve")
    with pytest.raises(ValueError, match=r"--ridgefill-split='twelve' is not an integer"):
        ServerConfig.from_env()
