"""A request's figures are a typed record: a misspelt name fails where it is written, unset figures stay out
of the response."""

from __future__ import annotations

import pytest

from sgl_ridgefill.runtime.request_stats import RequestStats
from sgl_ridgefill.runtime.plan import RequestPlan
from sgl_ridgefill.runtime.state import RequestState


def test_only_measured_figures_are_reported_in_declaration_order():
    stats = RequestStats()
    assert stats.as_dict() == {}
    stats.update(tail=3, filled=10, exact=0)
    assert list(stats.as_dict().items()) == [("filled", 10), ("exact", 0), ("tail", 3)]
    assert stats.get("cached", 0) == 0 and stats.get("filled") == 10


def test_an_unknown_figure_raises_where_it_is_written():
    stats = RequestStats()
    with pytest.raises(AttributeError, match="RequestStats has no figure 'filed'"):
        stats.update(filed=3)
    with pytest.raises(AttributeError):
        stats.filed = 3  # slots: no attribute of another name
    with pytest.raises(AttributeError):
        stats.add(step=1)


def test_counts_add_up_from_unset():
    stats = RequestStats()
    stats.add(upper_steps=2, groups=0)
    stats.add(upper_steps=3)
    assert (stats.upper_steps, stats.groups, stats.virtual_requests) == (5, 0, None)


def test_the_response_carries_the_record():
    st = RequestState(plan=RequestPlan(arm="ridgefill", split=2, tail=4))
    st.stats.update(prompt=20, cached=0, filled=14, exact=2, tail=4)
    summary = st.summary()
    assert summary["ran"] is True and summary["filled"] == 14 and "watched" not in summary
    st.stats.update(cached=8, cached_exact=5)
    assert st.reused_filled == 3
