"""PyTorch's own device-generic tests on ``xla`` (issue 23), in eager mode: every test
instantiated for xla passes, is skipped by the test's own decorators or as failing on CPU
torch itself, or is on the reasoned xfail list (``tests/pytorch_suite/xfails.py``). A
listed test that passes fails here (an unexpected success), so the list stays true.

The files are PyTorch's, in ``../shared/pytorch-tests``; nothing is copied. Without
them the test skips. The other modes (lazy with a sync after each op, opbyop) run with
``--runslow``-free ``python -m tools.pytorch_suite``, and ``docs/pytorch-suite.md`` has
every mode's table.
"""
from __future__ import annotations

import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from tools import pytorch_suite  # noqa: E402

HAVE_FILES = os.path.isdir(pytorch_suite.tests_dir())


@pytest.mark.skipif(not HAVE_FILES, reason=f"PyTorch's test files are not at "
                    f"{pytorch_suite.tests_dir()} (XLANB_PYTORCH_TESTS)")
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("name", pytorch_suite.FILES)
def test_pytorch_file_in_eager_mode(name, tmp_path):
    xml = pytorch_suite.run_file(name, "eager", str(tmp_path), timeout=1700)
    counts, failures = pytorch_suite.outcomes(xml)
    ran = sum(counts.get(k, 0) for k in ("passed", "failed", "error", "xfailed", "xpassed"))
    assert ran > 20, counts  # the plug-in instantiated the file's tests for xla
    unexpected = [f"{test} [{kind}]: {msg[:300]}" for test, kind, msg in failures]
    assert not unexpected, f"{name}: {counts}\n" + "\n".join(unexpected[:40])
