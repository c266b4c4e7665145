"""One home for session state: ``xlanb.reset()`` forgets every cache and record, as a new
process would, and loses no tensor's value."""
from __future__ import annotations

import torch

import xlanb
from xlanb.base.session import session


def test_reset_forgets_compiles_and_keeps_values(count):
    a = torch.arange(12.0).reshape(3, 4)
    x = a.to("xla")
    y = (x * 2).sin()          # pending
    xlanb.sync()
    z = y + 1                  # pending again: reset must sync it, not drop it
    assert xlanb.graphs() and session.infos and session.plans
    xlanb.reset()
    assert list(xlanb.graphs()) == []
    assert not session.infos and not session.plans and not session.live
    assert not session.graph_cache and not session.sig_keys
    assert xlanb.metrics.counter_value("UncachedCompile") is None  # metrics cleared too
    torch.testing.assert_close(z.cpu(), (a * 2).sin() + 1)
    # the same program compiles again, as in a new process (from the store on disk, if on)
    w = (x * 2).sin()
    xlanb.sync()
    assert count("UncachedCompile") == 1
    torch.testing.assert_close(w.cpu(), (a * 2).sin())


def test_reset_returns_to_the_starting_mode():
    start = xlanb.get_mode()
    other = "opbyop" if start != "opbyop" else "lazy"
    xlanb.set_mode(other)
    t = torch.ones(3, device="xla") * 4
    xlanb.reset()
    assert xlanb.get_mode() == start
    assert t.cpu().tolist() == [4.0, 4.0, 4.0]


def test_session_containers_are_the_ones_modules_use():
    """Modules keep references to the session's containers (the hot path reads module
    globals); ``clear`` empties them in place, so those references stay the session's."""
    from xlanb import dispatch, live
    from xlanb.execute import graphs
    before = (dispatch._infos, live._live, graphs._graph_cache)
    xlanb.reset()
    assert (dispatch._infos, live._live, graphs._graph_cache) == before
    assert dispatch._infos is session.infos and live._live is session.live
    assert graphs._graph_cache is session.graph_cache
