"""``sgl-ridgefill soak`` end to end on this CPU: both servers on a tiny random model, a small soak and fuzz.

The full-size run (300 requests, 8 clients, 500 fuzzed bodies and policies) is in docs/RELIABILITY.md;
this one keeps to a few minutes on two cores.
"""

from __future__ import annotations

import json

import pytest

from sgl_ridgefill.cli import main
from sgl_ridgefill.soak.summary import FAILURE_KEYS
from sgl_ridgefill.soak.workload import KINDS

# Outside CI's time budget (run with -m slow): about 2.5 min; tests/soak checks the workload and the verdicts
# without an engine
pytestmark = [pytest.mark.engine, pytest.mark.slow]


def test_soak_and_fuzz_find_nothing(tmp_path):
    out = tmp_path / "soak.json"
    code = main(["soak", "--tiny", "--requests", "60", "--clients", "4", "--fuzz", "100", "--seed", "1",
                 "--workdir", str(tmp_path / "work"), "--out", str(out), "--max-minutes", "20"])
    summary = json.loads(out.read_text())
    assert summary["failures"] == dict.fromkeys(FAILURE_KEYS, 0), summary
    assert code == 0 and summary["ok"]
    assert set(summary["requests"]["by_kind"]) == set(KINDS)  # every kind of request was sent
    assert summary["requests"]["sent"] >= 60 and summary["requests"]["skipped_jobs"] == 0
    ran = summary["responses"]["ridgefill_ran"]
    assert ran["true"] > 0 and ran["false"] > 0
    exact = summary["exact"]
    assert exact["cases"] > 0 and exact["sequential"]["compared"] == exact["cases"] == exact["concurrent"]["compared"]
    assert summary["server"]["live_requests"] == 0 and summary["server"]["healthy_at_end"]
    fuzz = summary["fuzz"]
    assert fuzz["request_bodies"]["sent"] == 100 and fuzz["policy_texts"]["as_request_policy"]["sent"] == 100
    assert fuzz["server_errors"] == 0
