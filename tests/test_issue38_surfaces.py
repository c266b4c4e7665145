"""Issue 38, part B: what the front ends say agrees with what happens (eager mode's
waiting ops, one time format, one location format, one set of column names, metric
descriptions, mesh axis names)."""
from __future__ import annotations

import pytest
import torch

import xlanb
from xlanb.extensions import display as xd


def test_eager_pending_ops_are_said_to_wait_for_background_compiles():
    prev = xlanb.get_mode()
    xlanb.set_mode("eager")
    try:
        head = xd.PendingGraph("...", 27).text().splitlines()[0]
        assert "27 ops waiting for executables still compiling in the background" in head, head
        line = xd.SyncSummary(xd.Activity(), 27, "eager").lines()[0]
        assert "27 ops that waited for background compiles ran" in line, line
        assert "one by one" not in line
    finally:
        xlanb.set_mode(prev)
    # lazy and opbyop keep their words: pending ops there are a recorded graph
    assert "run one by one" in xd.SyncSummary(xd.Activity(), 3, "opbyop").lines()[0]
