"""The response to memory-mapping pressure is proportionate (issue 37, item 10). Between
75% and 90% of vm.max_map_count, each new eager signature used to run a full
gc.collect() and drop half the loaded executables (1.0 s per signature against 0.12 s),
because the count stayed above the mark (mappings that are not executables') and the
check ran again at every call."""
from __future__ import annotations

import pytest

from xlanb.executables import resident
from xlanb.runtime import maps


@pytest.fixture
def pressure(monkeypatch):
    """A mapping count fixed at a share of a limit of 100,000, and a record of what
    ``reserve`` does about it; the loaded set stands at 2,000 executables."""
    state = {"used": 0, "gc": 0, "shrinks": [], "graph_shrinks": []}
    monkeypatch.setattr(maps, "limit", lambda: 100_000)
    monkeypatch.setattr(maps, "count", lambda: state["used"])
    monkeypatch.setattr(resident.gc, "collect", lambda *a: state.__setitem__("gc", state["gc"] + 1))
    monkeypatch.setattr(resident, "shrink", lambda target: state["shrinks"].append(target))
    monkeypatch.setattr(resident, "shrink_graphs",
                        lambda target: state["graph_shrinks"].append(target))
    monkeypatch.setattr(resident, "resident", dict.fromkeys(range(2000)))
    monkeypatch.setattr(resident._Check, "calls", 0)
    monkeypatch.setattr(resident._Check, "next_at", 0)
    return state


def test_between_the_marks_no_gc_and_small_drops_and_few_checks(pressure):
    pressure["used"] = 80_000  # 80%: above the shrink mark, below the refusal
    for _ in range(500):  # 500 new signatures
        resident.reserve()
    assert pressure["gc"] == 0
    assert pressure["graph_shrinks"] == []
    assert 1 <= len(pressure["shrinks"]) <= 4, pressure["shrinks"]
    assert all(t >= 2000 * 7 // 8 for t in pressure["shrinks"]), pressure["shrinks"]


def test_below_the_mark_nothing_is_dropped(pressure):
    pressure["used"] = 50_000
    for _ in range(500):
        resident.reserve()
    assert pressure == {"used": 50_000, "gc": 0, "shrinks": [], "graph_shrinks": []}


def test_past_the_refusal_mark_the_last_resort_runs_then_refuses(pressure):
    pressure["used"] = 95_000
    with pytest.raises(resident.ExecutableLimitError, match="95,000 memory mappings"):
        resident.reserve()
    assert pressure["gc"] == 1 and pressure["graph_shrinks"], pressure
