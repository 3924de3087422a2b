"""The host census on a CPU engine (SGLang's Triton backend under the interpreter): RidgeFill's host syncs,
plans and metadata initialisations of one request do not grow with its upper layers, steps or runs."""

from __future__ import annotations

import pytest

from sgl_ridgefill.gpu_check.host_census import run_census

# Outside CI's time budget (run with -m slow): about 1.5 min; its counts are also asserted by the estimates' meta-
# device tests
pytestmark = [pytest.mark.engine, pytest.mark.slow]


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    return run_census(tmp_path_factory.mktemp("census"), layers=12, pairs_only=True, say=lambda text: None)


def test_every_request_was_counted(report):
    assert [r["label"] for r in report["rows"]] == [
        "layers: 2 upper", "layers: 10 upper", "steps: one", "steps: several", "runs: few", "runs: many",
    ]
    assert all("census" in r for r in report["rows"]), [r.get("error") for r in report["rows"]]


def test_no_count_grows_with_layers_steps_or_runs(report):
    assert report["verdicts"] == []
    by_label = {r["label"]: r for r in report["rows"]}
    few, many = by_label["layers: 2 upper"]["counts"], by_label["layers: 10 upper"]["counts"]
    assert few == many  # every count, sync sites included
    assert by_label["steps: several"]["counts"]["upper_steps"] > by_label["steps: one"]["counts"]["upper_steps"]
    assert by_label["runs: many"]["ridgefill"]["exact"] > 10 * by_label["runs: few"]["ridgefill"]["exact"]


def test_exact_rows_without_statistics_cost_no_host_sync(report):
    """Every pair's rows are given (``exact_every``): nothing to read back for a selection, and the split
    states of the exact rows come back to the device without the host waiting."""
    for row in report["rows"]:
        c = row["census"]
        assert c["syncs"] == 0 and c["sync_sites"] == {}, (row["label"], c["sync_sites"])
        assert c["host_mask_bytes"] == 0 and c["device_mask_bytes"] > 0
