"""The servers the soak starts (no engine): their flags, and what refuses to configure a server it did not start."""

from __future__ import annotations

import pathlib

import pytest

from sgl_ridgefill.cli import build_parser
from sgl_ridgefill.soak.servers import SPLIT_STATE_CACHE_MIB, ServedModel, common_flags, ridgefill_flags


def test_ridgefill_flags_come_last_on_the_ridgefill_server_only():
    served = ServedModel(model=pathlib.Path("/m"), maps=pathlib.Path("/maps"), split=2, tail=20, tiny=True,
                         vocab_size=1000)
    flags = ridgefill_flags(served, pathlib.Path("/p.rfpolicy"), 48, 512, extra=["--ridgefill-slice-rows", "0"])
    assert flags[-2:] == ["--ridgefill-slice-rows", "0"] and flags[: len(common_flags(served, 48, 512))] == common_flags(
        served, 48, 512)
    assert "--ridgefill-slice-rows" not in common_flags(served, 48, 512)


def test_the_split_state_store_is_small_enough_to_fill_and_evict():
    """The store is a cache bounded at 1 GiB by default: filling it during a run would read as RSS growth."""
    served = ServedModel(model=pathlib.Path("/m"), maps=pathlib.Path("/maps"), split=2, tail=20, tiny=True,
                         vocab_size=1000)
    flags = ridgefill_flags(served, pathlib.Path("/p.rfpolicy"), 48, 512)
    assert flags[flags.index("--ridgefill-split-state-cache-mib") + 1] == str(SPLIT_STATE_CACHE_MIB)


def test_ridgefill_flags_are_refused_with_a_running_server():
    args = build_parser().parse_args(["soak", "--model", "/m", "--maps", "/maps", "--url", "http://h:1",
                                      "--stock-url", "http://h:2", "--ridgefill-flags", "--ridgefill-slice-rows 0"])
    with pytest.raises(SystemExit, match="and --ridgefill-flags configure the servers it starts"):
        args.func(args)


def test_the_counters_the_soak_reads_back_are_found_under_the_names_prometheus_exports():
    """A counter's samples carry ``_total`` in Prometheus text: the soak reads the upgrade counters by those names."""
    from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

    from sgl_ridgefill.metrics import EXACT_UPGRADE_ROWS, EXACT_UPGRADES_DONE, LIVE_REQUESTS
    from sgl_ridgefill.soak.servers import LIVE_GAUGE, metric_value

    registry = CollectorRegistry()
    Counter(EXACT_UPGRADE_ROWS, "rows", ["arm"], registry=registry).labels("ridgefill").inc(5)
    Counter(EXACT_UPGRADES_DONE, "done", ["arm"], registry=registry).labels("ridgefill").inc()
    Gauge(LIVE_REQUESTS, "live", registry=registry).set(2)
    text = generate_latest(registry).decode()
    assert metric_value(text, EXACT_UPGRADE_ROWS + "_total") == 5
    assert metric_value(text, EXACT_UPGRADES_DONE + "_total") == 1
    assert metric_value(text, LIVE_GAUGE) == 2
