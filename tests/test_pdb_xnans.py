"""pdb's ``xnans`` takes an expression (issue 37, item 11): ``xnans maybe`` used to ignore
its argument and list the whole frame; now it checks what the expression names, and a name
that is not there is an error."""
from __future__ import annotations

import io
import sys

import torch

from xlanb.extensions.pdb import XlaPdb


def _debugger():
    d = XlaPdb(stdout=io.StringIO(), readrc=False)
    d.reset()
    return d


def _run(d, line: str) -> str:
    out = d.stdout
    out.seek(0)
    out.truncate()
    d.onecmd(line)
    return out.getvalue()


def test_xnans_checks_what_its_argument_names():
    good = torch.ones(2, device="xla")  # noqa: F841 - looked at below
    bad = torch.tensor([1.0, float("nan"), float("inf")], device="xla")  # noqa: F841
    d = _debugger()
    d.setup(sys._getframe(), None)
    whole = _run(d, "xnans")
    assert "1 of 2 xla tensors hold NaN/Inf" in whole and "bad: (3,)" in whole, whole
    only_good = _run(d, "xnans good")
    assert "1 xla tensors, all finite" in only_good and "bad" not in only_good, only_good
    only_bad = _run(d, "xnans [good, bad]")
    assert "1 of 2 xla tensors hold NaN/Inf" in only_bad and "1 nan, 1 inf" in only_bad, only_bad
    maybe = _run(d, "xnans maybe")
    assert maybe.startswith("*** xnans: 'maybe': NameError"), maybe
    none = _run(d, "xnans 3")
    assert "no xla tensors in '3'" in none, none
