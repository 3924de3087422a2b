from __future__ import annotations

from types import SimpleNamespace

import pytest

from sgl_ridgefill.metrics import record_request
from sgl_ridgefill.runtime.request_stats import RequestStats


def test_request_counters():
    prometheus = pytest.importorskip("prometheus_client")
    st = SimpleNamespace(plan=SimpleNamespace(arm="identity"),
                         stats=RequestStats(filled=100, exact=10, tail=20, saved_fraction=0.4))
    before = prometheus.REGISTRY.get_sample_value("ridgefill_filled_rows_total", {"arm": "identity"}) or 0.0
    record_request(st)
    record_request(st)
    assert prometheus.REGISTRY.get_sample_value("ridgefill_filled_rows_total", {"arm": "identity"}) == before + 200
    assert prometheus.REGISTRY.get_sample_value("ridgefill_requests_total", {"arm": "identity"}) >= 2
    assert prometheus.REGISTRY.get_sample_value("ridgefill_compute_saved_fraction_count", {"arm": "identity"}) >= 2
