"""Shapes at the edges: reductions of empty tensors and tensors of more than 64
dimensions behave as on CPU torch in every mode (issue 37, item 11)."""
from __future__ import annotations

import re

import pytest
import torch

EMPTY_REDUCTIONS = {
    "max": lambda t: t.max(),
    "min": lambda t: t.min(),
    "amax": lambda t: t.amax(),
    "argmax": lambda t: t.argmax(),
    "max_dim": lambda t: t.reshape(0, 1).max(0),
    "amax_dim_ok": lambda t: t.reshape(0, 1).amax(1),  # CPU accepts: an empty result
}


def _cpu(fn):
    try:
        return fn(torch.zeros(0)), None
    except Exception as e:  # noqa: BLE001 - CPU torch's error is the expectation
        return None, e


@pytest.mark.parametrize("case", sorted(EMPTY_REDUCTIONS))
def test_empty_reduction_raises_cpu_torch_error_with_op_and_line(mode, case):
    fn = EMPTY_REDUCTIONS[case]
    want, err = _cpu(fn)
    x = torch.zeros(0, device="xla")
    if err is None:
        torch.testing.assert_close(fn(x).cpu(), want)
        return
    with pytest.raises(type(err), match=re.escape(str(err))) as info:
        r = fn(x)
        (r[0] if isinstance(r, tuple) else r).cpu()
    notes = "\n".join(getattr(info.value, "__notes__", ()))
    assert "aten::" in notes and "test_edge_shapes.py" in notes, notes
    assert (torch.ones(2, device="xla") + 1).cpu().tolist() == [2.0, 2.0]  # the session goes on


def test_rank_65_tensors_work_as_on_cpu(mode):
    # numpy (the host transfers) holds 64 dimensions at most; torch and XLA more
    shape = [1] * 63 + [2, 3]
    cpu = torch.arange(6.).reshape(shape)
    x = cpu.to("xla")
    assert x.dim() == 65

    def same(got, want):  # CPU torch's own comparisons stop at 64 dimensions
        assert got.shape == want.shape
        torch.testing.assert_close(got.reshape(-1), want.reshape(-1))
    same((x * 2 + 1).cpu(), cpu * 2 + 1)
    with pytest.raises(RuntimeError, match="up to 64 dims"):  # CPU torch refuses a sum
        cpu.sum(-1)
    with pytest.raises(RuntimeError, match="up to 64 dims") as info:  # and so does xlanb,
        x.sum(-1)
    assert "aten::sum at test_edge_shapes.py" in "\n".join(info.value.__notes__)  # naming both
    same(torch.zeros(shape, device="xla").cpu(), torch.zeros(shape))
    y = torch.ones([1] * 64, device="xla").unsqueeze(0)  # made rank 65 on the device
    same(y.cpu(), torch.ones([1] * 65))
