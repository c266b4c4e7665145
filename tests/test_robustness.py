"""Bad input loses nothing: a failed compile or an interrupted sync leaves every tensor
readable, with its pending work intact, and the next sync still works."""
from __future__ import annotations

import sys

import pytest
import torch

import xlanb
from xlanb import metrics

from xlanb.executables import compile as op_compile  # noqa: E402


def _pending_pair(cols=3):
    # A shape per test: a graph compiled by an earlier test would hit the cache instead.
    a = torch.arange(2.0 * cols).reshape(2, cols).to("xla")
    xlanb.sync()
    b = (a * 3 + 1).relu()
    c = b.sum(dim=0)
    return a, b, c


@pytest.mark.parametrize("exc,cols", [(RuntimeError("XLA compile failed"), 5),
                                      (KeyboardInterrupt(), 7)])
def test_failed_compile_keeps_pending_work(monkeypatch, exc, cols):
    a, b, c = _pending_pair(cols)
    expect_b = (torch.arange(2.0 * cols).reshape(2, cols) * 3 + 1).relu()

    def broken(*args, **kwargs):
        raise exc

    monkeypatch.setattr(op_compile, "compile_lowered", broken)  # the one compile call
    with pytest.raises(type(exc)):
        xlanb.sync()
    monkeypatch.undo()
    assert xlanb.pending_count(b, c) == 4  # mul, add, relu, sum: all still pending
    torch.testing.assert_close(xlanb.peek(b), expect_b)
    xlanb.sync()
    assert xlanb.pending_count() == 0
    torch.testing.assert_close(b.cpu(), expect_b)
    torch.testing.assert_close(c.cpu(), expect_b.sum(dim=0))


def test_interrupted_execution_keeps_pending_work(monkeypatch):
    a, b, c = _pending_pair()
    xlanb.hlo(b, c, optimized=True)  # compile first, so the interrupt hits the run
    rec = xlanb.graphs()[-1]

    class Interrupting:
        def __call__(self, *args):
            raise KeyboardInterrupt

    real = rec.executable
    rec.executable = Interrupting()
    try:
        with pytest.raises(KeyboardInterrupt):
            xlanb.sync()
    finally:
        rec.executable = real
    assert xlanb.pending_count(c) > 0
    xlanb.sync()
    torch.testing.assert_close(c.cpu(), (torch.arange(6.0).reshape(2, 3) * 3 + 1).relu().sum(0))


def test_bad_mode_and_bad_device_are_clear_errors():
    with pytest.raises(ValueError, match="lazy, eager, opbyop"):
        xlanb.set_mode("fast")
    with pytest.raises(RuntimeError, match="available: xla:0"):
        torch.zeros(2, device="xla:9")
    assert xlanb.get_mode() in xlanb.MODES
    metrics.clear()


def test_a_call_torch_refuses_raises_cpu_torchs_own_error(mode):
    # torch's meta kernels often raise another type than its CPU kernels do; the user
    # gets CPU torch's, and nothing pending runs for it
    a = torch.ones((2, 3, 4), device="xla")
    b = a * 2
    with pytest.raises(IndexError, match="shape mismatch"):
        a[False, [0, 1], ...]
    with pytest.raises(RuntimeError, match="must match the size"):
        a + torch.ones(5, device="xla")
    if mode != "eager":
        assert xlanb.pending_count() > 0  # b is still pending: nothing was synced
    assert torch.equal(b.cpu(), torch.full((2, 3, 4), 2.0))
