"""PyTorch's own device-generic tests on ``xla`` (issue 23), in eager mode: every test
instantiated for xla passes, is skipped by the test's own decorators or as failing on CPU
torch itself, or is on the reasoned xfail list (``tests/pytorch_suite/xfails.py``). A
listed test that passes fails here (an unexpected success), so the list stays true.

The files are PyTorch's, in ``../shared/pytorch-tests``; nothing is copied. Without
them the test skips. Here each test's dtype variants run in one dtype of each kind
(``pytorch_suite.SUITE_SELECTION``: float32, float16, int64, bool, complex64, and every
test without a dtype); ``python -m tools.pytorch_suite`` runs every dtype. The other modes (lazy with a sync after each op, opbyop) run with
``--runslow``-free ``python -m tools.pytorch_suite``, and ``docs/pytorch-suite.md`` has
every mode's table.
"""
from __future__ import annotations

import atexit
import concurrent.futures
import os
import shutil
import sys
import tempfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from tools import pytorch_suite  # noqa: E402

pytestmark = pytest.mark.slow  # -m "not slow" leaves it out (tests/conftest.py)

HAVE_FILES = os.path.isdir(pytorch_suite.tests_dir())


class _Runs:
    """The four files' runs. Each file runs in its own process and spends most of its
    time in Python on one core, so the suite starts them behind its other tests
    (``start_behind``, from conftest once these tests are selected): one at a time, at the
    lowest priority, on what the other tests leave of a 2-core machine. When the first
    test here asks for its file, the rest start at once, two at a time."""

    def __init__(self):
        self.results = None
        self.behind = None    # the low-priority pool, one file at a time
        self.futures = {}
        self.released = False  # the files not yet started were moved to run now
        # The environment as the session began. A file starts behind other tests, and
        # one of them may have set a variable for a while (test_notebooks sets
        # PYTHONWARNINGS=ignore, which hid the warnings test_indexing counts).
        self.env = dict(os.environ)

    def start_behind(self) -> None:
        if self.behind is not None or not HAVE_FILES:
            return
        self.results = tempfile.mkdtemp(prefix="xlanb-pytorch-suite-")
        atexit.register(shutil.rmtree, self.results, ignore_errors=True)
        self.behind = concurrent.futures.ThreadPoolExecutor(max_workers=1)
        atexit.register(self.behind.shutdown, wait=False, cancel_futures=True)
        # the longest first: it has the most time behind the other tests
        for name in sorted(pytorch_suite.FILES, key=lambda n: -_LONGEST_FIRST.get(n, 0)):
            self.futures[name] = self.behind.submit(pytorch_suite.run_file, name, "eager",
                                                    self.results, 5000, 19, self.env,
                                                    pytorch_suite.SUITE_SELECTION)

    def result(self, name: str) -> str:
        self.start_behind()
        if not self.released:
            # The other tests are over: what has not started runs now, two at a time, beside
            # the file still running behind (a third process for a while; waiting for it
            # to end first left a core idle for minutes).
            self.released = True
            now = concurrent.futures.ThreadPoolExecutor(max_workers=min(2, os.cpu_count() or 1))
            for n, f in list(self.futures.items()):
                if f.cancel():
                    self.futures[n] = now.submit(pytorch_suite.run_file, n, "eager",
                                                 self.results, 1700, 0, self.env,
                                                 pytorch_suite.SUITE_SELECTION)
            now.shutdown(wait=False)
        return self.futures[name].result()


# CPU minutes of each file in eager mode (docs/pytorch-suite.md): the order they start in
_LONGEST_FIRST = {"test_view_ops": 5.5, "test_indexing": 4.8, "test_type_promotion": 2.5,
                  "test_shape_ops": 2.1}
RUNS = _Runs()


@pytest.mark.skipif(not HAVE_FILES, reason=f"PyTorch's test files are not at "
                    f"{pytorch_suite.tests_dir()} (XLANB_PYTORCH_TESTS)")
@pytest.mark.timeout(3400)
@pytest.mark.parametrize("name", pytorch_suite.FILES)
def test_pytorch_file_in_eager_mode(name):
    xml = RUNS.result(name)
    counts, failures = pytorch_suite.outcomes(xml)
    ran = sum(counts.get(k, 0) for k in ("passed", "failed", "error", "xfailed", "xpassed"))
    assert ran > 20, counts  # the plug-in instantiated the file's tests for xla
    unexpected = [f"{test} [{kind}]: {msg[:300]}" for test, kind, msg in failures]
    assert not unexpected, f"{name}: {counts}\n" + "\n".join(unexpected[:40])
