from __future__ import annotations

import pytest

from sgl_ridgefill.engine import ridgefill_engine, ridgefill_environment


def test_environment_for_options():
    env = ridgefill_environment(ridgefill_maps="/m", ridgefill_split=12, ridgefill_tail=None)
    assert env == {"RIDGEFILL_PREFILL_BACKEND": "ridgefill", "RIDGEFILL_MAPS": "/m", "RIDGEFILL_SPLIT": "12"}


def test_unknown_option():
    with pytest.raises(ValueError, match="unknown RidgeFill option\\(s\\) ridgefill_spilt"):
        ridgefill_environment(ridgefill_spilt=3)


def test_bad_option_is_refused_before_any_process_starts(monkeypatch):
    monkeypatch.delenv("RIDGEFILL_PREFILL_BACKEND", raising=False)
    with pytest.raises(ValueError, match="--ridgefill-arm 'fast' is not one of"):
        ridgefill_engine(model_path="/nonexistent", ridgefill_arm="fast", ridgefill_maps="/m")
    import os

    assert "RIDGEFILL_PREFILL_BACKEND" not in os.environ  # restored after the failure
