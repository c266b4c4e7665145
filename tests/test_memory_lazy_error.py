"""A lazy DeviceMemoryError names what makes its projected peak, by line (issue 37,
item 5): the outputs the pending graph makes as well as its temporaries and the live
tensors. Before, a 1.2 GiB ``repeat`` output in the pending graph went unnamed: the
message listed only the live tensors (eager and opbyop named the op already)."""
from __future__ import annotations

import inspect
import os

import pytest
import torch

import xlanb


def _line_of(marker: str) -> int:
    src, first = inspect.getsourcelines(test_lazy_memory_error_names_the_pending_outputs_by_line)
    return first + next(i for i, s in enumerate(src) if marker in s)


def test_lazy_memory_error_names_the_pending_outputs_by_line():
    xlanb.set_mode("lazy")
    a = torch.randn(256, 256, device="xla")  # 256 KiB live
    xlanb.sync()
    with xlanb.memory_limit("32MiB"):
        b = a * 2
        big = b.repeat(16, 16)  # 64 MiB output  <- the big one
        s = big.sum()
        with pytest.raises(xlanb.DeviceMemoryError) as e:
            xlanb.sync()
    here = f"{os.path.basename(__file__)}:{_line_of('<- the big one')}"
    outputs = [c for c in e.value.contributors if c.kind == "pending output"]
    assert outputs and outputs[0].bytes == 64 << 20, e.value.contributors
    assert "aten::repeat" in outputs[0].what and here in outputs[0].what, outputs
    msg = str(e.value)
    assert f"pending output: aten::repeat at {here}" in msg, msg
    assert "f32[4096,4096]" in msg, msg
    # nothing ran: the pending work is intact, and runs once the limit allows it
    assert xlanb.pending_count(big) > 0
    assert s.item() == pytest.approx((a.cpu() * 2).sum().item() * 256, rel=1e-3)
