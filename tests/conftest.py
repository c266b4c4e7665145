"""Shared fixtures for the xlanb acceptance tests.

Every test starts with no pending work, cleared metrics and the session's starting mode,
and is left that way: a test that switches modes, or leaves lazy work pending, cannot
change what the next test compiles or counts.

``mode`` parametrizes a test over lazy, eager and opbyop.
"""
from __future__ import annotations

import atexit
import gc
import json
import os
import shutil
import subprocess
import sys
import tempfile

import pytest
import torch

# A fresh executable store for each test session: tests assert what compiles and when
# (background compiles, counters), which executables stored by an earlier run would
# change. The store itself is tested in child processes with directories of their own.
_SESSION_CACHE = tempfile.mkdtemp(prefix="xlanb-test-cache-")
atexit.register(shutil.rmtree, _SESSION_CACHE, ignore_errors=True)
os.environ["XLANB_STORE_DIR"] = _SESSION_CACHE  # for kernels and notebooks we start

# Bytecode for xlanb's own sources, once. Where PYTHONDONTWRITEBYTECODE is set (as on this
# project's machines) Python would otherwise compile them anew in each of the suite's
# child processes, scripts and kernels: 0.3 s of CPU each (bench_startup.py).
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if sys.dont_write_bytecode:
    import compileall
    for _pkg in ("xlanb", "extensions", "kernel", "tools"):
        compileall.compile_dir(os.path.join(_ROOT, _pkg), quiet=2)

import xlanb  # noqa: E402

# pytest has imported xlanb already (for the RecompileWarning filter), so set it here too
xlanb.config.store_dir = _SESSION_CACHE

MODES = tuple(xlanb.MODES)
_START_MODE = xlanb.get_mode()


def _drain_pending() -> None:
    """Run whatever is pending so the next test starts clean.

    If the pending work cannot run (a test failed while a broken graph was alive and its
    traceback keeps the tensors alive), forget that work instead of failing every later
    test on the same graph.
    """
    try:
        xlanb.sync()
        if not xlanb.pending_count():
            return
    except Exception:
        pass
    # A sync leaves a tensor whose index check failed pending (it raises on every read
    # until dropped), and a failed test's traceback may hold one.
    gc.collect()  # drop dead tensors first (slow: only on this path)
    try:
        xlanb.sync()
    except Exception:
        pass
    if xlanb.pending_count():
        from xlanb.pending import live
        from xlanb.base.session import session
        live._live.clear()
        live._waiting_views.clear()
        session.default.deferred = 0


@pytest.fixture(autouse=True)
def _xlanb_clean_state():
    _drain_pending()
    if xlanb.get_mode() != _START_MODE:
        xlanb.set_mode(_START_MODE)
    xlanb.metrics.clear()
    yield
    _drain_pending()
    if xlanb.get_mode() != _START_MODE:
        try:
            xlanb.set_mode(_START_MODE)
        except Exception:
            _drain_pending()
            xlanb.set_mode(_START_MODE)


@pytest.fixture(params=MODES)
def mode(request):
    """Run the test in each execution mode; the autouse fixture restores the mode."""
    xlanb.set_mode(request.param)
    assert xlanb.get_mode() == request.param
    yield request.param


def counter(name: str) -> int:
    """A metrics counter, 0 when it was never bumped."""
    return xlanb.metrics.counter_value(name) or 0


@pytest.fixture
def count():
    return counter


def assert_same(xla_t: torch.Tensor, cpu_t: torch.Tensor, *, exact: bool = False,
                atol: float = 1e-4, rtol: float = 1e-4) -> None:
    """``xla_t`` is on the xla device and equals ``cpu_t`` (CPU torch's answer)."""
    assert xla_t.device.type == "xla", xla_t.device
    got = xla_t.cpu()
    assert got.device.type == "cpu"
    assert got.dtype == cpu_t.dtype, (got.dtype, cpu_t.dtype)
    assert tuple(got.shape) == tuple(cpu_t.shape), (tuple(got.shape), tuple(cpu_t.shape))
    if exact:
        torch.testing.assert_close(got, cpu_t, atol=0, rtol=0, equal_nan=True)
    else:
        torch.testing.assert_close(got, cpu_t, atol=atol, rtol=rtol, equal_nan=True)


@pytest.fixture
def same():
    return assert_same


def tiny_bert_config(**overrides):
    """A 2-layer transformers BERT small enough for a test (random weights, no downloads);
    ``overrides`` replace fields."""
    import transformers
    fields = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                  intermediate_size=37, max_position_embeddings=64, type_vocab_size=2,
                  hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                  attn_implementation="eager")
    fields.update(overrides)
    return transformers.BertConfig(**fields)


_TINY_MLM: list = []


def tiny_bert_mlm():
    """A fresh copy, on the xla device, of one BertForMaskedLM of ``tiny_bert_config()``
    (seed 0): every caller starts from the same weights."""
    import copy
    import transformers
    if not _TINY_MLM:
        torch.manual_seed(0)
        _TINY_MLM.append(transformers.BertForMaskedLM(tiny_bert_config()))
    return copy.deepcopy(_TINY_MLM[0]).to("xla")


def _child_env(extra: dict | None) -> dict:
    from support import child_env  # the one policy (tests/support.py)
    return child_env(extra)


def run_python(code: str, env: dict | None = None, *, timeout: float = 180) -> str:
    """Run ``code`` in a fresh interpreter (with XLANB_* from the parent removed and
    ``env`` added); fail with its stderr if it fails; return its stdout."""
    proc = subprocess.run([sys.executable, "-c", code], env=_child_env(env),
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"child failed ({proc.returncode}):\n{proc.stderr[-4000:]}"
    return proc.stdout


def last_json_line(stdout: str):
    for line in reversed(stdout.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            return json.loads(line)
    raise AssertionError(f"no JSON line in child output:\n{stdout}")


@pytest.fixture
def python_child():
    return run_python


# Tiers are markers on the test modules (``pytestmark``), never lists of file names here:
# - ``slow``: real kernels, notebooks, browsers, several processes, TPU compiles, PyTorch's
#   own files, long soaks. ``-m "not slow"`` leaves them out (the README's fast tier, under
#   10 minutes on 2 cores); CI runs everything.
# - ``versions``: the torch-facing surface (device registration, lowerings, the three
#   modes, torch_xla's imports, a small model), cheap enough that .ci/run runs it on the
#   oldest and the newest supported torch as well (``-m "versions and not slow"``).


def pytest_collection_modifyitems(session, config, items):
    """PyTorch's own files' tests go last: they wait for files that run behind every other
    test (``pytest_collection_finish``). In file order they came before test_real_models
    .. test_widgets_browser, which then waited for the files too, with a core left idle."""
    items.sort(key=lambda item: item.path.name == "test_pytorch_suite.py")  # stable


def pytest_collection_finish(session):
    """PyTorch's own test files, when selected to run, start now, behind the other tests
    (tests/test_pytorch_suite.py): separate processes at the lowest priority, which use
    what the other tests leave of the machine's cores."""
    if session.config.option.collectonly:
        return
    for item in session.items:
        if item.path.name == "test_pytorch_suite.py" and item.name.startswith("test_pytorch_file"):
            item.module.RUNS.start_behind()
            return


@pytest.fixture
def tx():
    """torch_xla resolved to xlanb's modules in this process; undone afterwards
    (tests/test_compat.py, tests/test_compat_debug.py)."""
    from xlanb import compat
    if compat.real_torch_xla() is not None:
        pytest.skip("the real torch_xla is installed here")
    assert compat.install()
    import torch_xla
    yield torch_xla
    compat.uninstall()
