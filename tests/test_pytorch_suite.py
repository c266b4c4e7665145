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

import concurrent.futures
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from tools import pytorch_suite  # noqa: E402

HAVE_FILES = os.path.isdir(pytorch_suite.tests_dir())


@pytest.fixture(scope="module")
def file_runs(tmp_path_factory):
    """Every file starts at the first test, two at a time: each runs in its own process
    and spends much of its time in Python on one core, so a 2-core CI machine runs the
    four in about half the time. Each test then waits for its own file."""
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=min(2, os.cpu_count() or 1))
    results = str(tmp_path_factory.mktemp("pytorch-suite"))
    runs = {name: pool.submit(pytorch_suite.run_file, name, "eager", results, 1700)
            for name in pytorch_suite.FILES}
    yield runs
    pool.shutdown(wait=True, cancel_futures=True)


@pytest.mark.skipif(not HAVE_FILES, reason=f"PyTorch's test files are not at "
                    f"{pytorch_suite.tests_dir()} (XLANB_PYTORCH_TESTS)")
@pytest.mark.timeout(3400)
@pytest.mark.parametrize("name", pytorch_suite.FILES)
def test_pytorch_file_in_eager_mode(name, file_runs):
    xml = file_runs[name].result()
    counts, failures = pytorch_suite.outcomes(xml)
    ran = sum(counts.get(k, 0) for k in ("passed", "failed", "error", "xfailed", "xpassed"))
    assert ran > 20, counts  # the plug-in instantiated the file's tests for xla
    unexpected = [f"{test} [{kind}]: {msg[:300]}" for test, kind, msg in failures]
    assert not unexpected, f"{name}: {counts}\n" + "\n".join(unexpected[:40])
