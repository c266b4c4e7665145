"""Ops with no lowering run on CPU torch: right answer, counted as ``aten::<op>``, warned
about once. What cannot work at all (sparse layouts) is a clear error naming the op."""
from __future__ import annotations

import warnings

import pytest
import torch
from torch._decomp import core_aten_decompositions, decomposition_table

import xlanb
from xlanb.lowering import registry

aten = torch.ops.aten

# Ops with no JAX lowering and no torch decomposition today (value-dependent output
# shapes, or rare special functions). The tests use the first that still has none, so
# that a lowering added later does not break them.
CANDIDATES = [
    # (op, inputs on a device, the call)
    (aten.bincount.default,
     lambda dev: (torch.tensor([1, 1, 3, 0, 7, 3, 3]).to(dev),),
     lambda x: torch.bincount(x, minlength=4)),
    (aten.histc.default,
     lambda dev: (torch.linspace(-3, 3, 25).to(dev) * 0.9,),
     lambda x: torch.histc(x, bins=6, min=-2, max=2)),
    (aten.polygamma.default,
     lambda dev: (torch.linspace(0.5, 3, 7).to(dev),),
     lambda x: torch.polygamma(2, x)),
    (aten.searchsorted.Tensor,
     lambda dev: (torch.tensor([1.0, 3.0, 5.0, 7.0]).to(dev), torch.tensor([0.0, 3.0, 6.0, 9.0]).to(dev)),
     lambda s, v: torch.searchsorted(s, v)),
]


def _unlowered():
    table = dict(decomposition_table)
    table.update(core_aten_decompositions())
    found = [(op, (lambda dev, mk=mk, fn=fn: fn(*mk(dev))), mk, fn)
             for op, mk, fn in CANDIDATES if registry.lookup(op) is None and op not in table]
    if not found:
        pytest.skip("every candidate op has a lowering now: add a new candidate")
    return found


def _name(op) -> str:
    return f"aten::{op.overloadpacket.__name__}"


def _fallback_warnings(record):
    return [w for w in record if "no lowering" in str(w.message) or "CPU" in str(w.message)]


def test_fallback_works_counts_and_warns_once():
    # Runs first in this file: the first call of the op in this process.
    op, call, _, _ = _unlowered()[0]
    name = _name(op)
    want = call("cpu")
    with pytest.warns(UserWarning, match=name):
        got = call("xla")
    assert got.device.type == "xla"
    assert got.dtype == want.dtype
    torch.testing.assert_close(got.cpu(), want)
    assert xlanb.metrics.counter_value(name) == 1

    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        got2 = call("xla")
        torch.testing.assert_close(got2.cpu(), want)
    assert not _fallback_warnings(record), [str(w.message) for w in record]
    assert xlanb.metrics.counter_value(name) == 2  # counted on every call


@pytest.mark.parametrize("idx", range(len(CANDIDATES)))
def test_fallback_in_every_mode_feeds_device_ops(mode, idx):
    unlowered = _unlowered()
    if idx >= len(unlowered):
        pytest.skip("fewer unlowered candidates now")
    op, call, _, _ = unlowered[idx]
    name = _name(op)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = call("xla")
    want = call("cpu")
    # the result is an ordinary device tensor: pending work can use it
    got2 = (got * 2 + 1).sum()
    want2 = (want * 2 + 1).sum()
    assert got.device.type == "xla"
    torch.testing.assert_close(got.cpu(), want)
    torch.testing.assert_close(got2.cpu(), want2)
    assert xlanb.metrics.counter_value(name) == 1


def test_fallback_input_from_pending_lazy_work():
    # A fallback op whose inputs are still pending IR: they are computed, then fetched.
    xlanb.set_mode("lazy")
    op, _, make_inputs, fn = _unlowered()[0]
    pending = [t * 1 for t in make_inputs("xla")]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = fn(*pending)
    torch.testing.assert_close(got.cpu(), fn(*make_inputs("cpu")))
    assert xlanb.metrics.counter_value(_name(op)) == 1


def _to_sparse():
    torch.eye(3).to("xla").to_sparse()


def _sparse_coo_on_xla():
    torch.sparse_coo_tensor(torch.tensor([[0, 1], [1, 0]]), torch.tensor([1.0, 2.0]), (2, 2),
                            device="xla")


def _sparse_cpu_to_xla():
    torch.sparse_coo_tensor(torch.tensor([[0, 1], [1, 0]]), torch.tensor([1.0, 2.0]),
                            (2, 2)).to("xla")


SPARSE = [(_to_sparse, "to_sparse"), (_sparse_coo_on_xla, "sparse_coo"),
          (_sparse_cpu_to_xla, "aten::")]


@pytest.mark.parametrize("make,op_hint", SPARSE, ids=[f.__name__ for f, _ in SPARSE])
def test_sparse_is_clear_error_naming_op(make, op_hint):
    with pytest.raises((RuntimeError, NotImplementedError, TypeError)) as err:
        make()
    msg = str(err.value)
    assert "sparse" in msg.lower(), msg
    assert op_hint in msg, msg
    assert xlanb.get_mode() in xlanb.MODES  # nothing else broke: the device still works
    assert (torch.ones(2, device="xla") + 1).tolist() == [2.0, 2.0]


@pytest.mark.parametrize("make", [f for f, _ in SPARSE], ids=[f.__name__ for f, _ in SPARSE])
def test_sparse_error_names_dtype(make):
    with pytest.raises((RuntimeError, NotImplementedError, TypeError)) as err:
        make()
    assert "float32" in str(err.value), str(err.value)
