"""Device ``xla`` (xlanb) for PyTorch's device-generic tests.

PyTorch's ``common_device_type`` runs this file with ``runpy.run_path`` and its own
globals (so ``DeviceTypeTestBase`` is already defined here; do not import
common_device_type) and takes ``TEST_CLASS``. Run a PyTorch test file with::

    TORCH_TEST_DEVICES=tests/pytorch_suite/xla_device.py PYTORCH_TESTING_DEVICE_ONLY_FOR=xla \\
        XLANB_SUITE_MODE=eager python -m pytest ../shared/pytorch-tests/test_view_ops.py

or all four files in every mode, with the report, ``python -m tools.pytorch_suite``.

``XLANB_SUITE_MODE`` picks the execution mode: ``eager``, ``lazy-sync`` (lazy, with a sync
after every op, so each op is its own graph) or ``opbyop``.

What this base changes, and why (nothing else: torch's default precision, every test):

- ``xla`` is a native device type. It is torch's PrivateUse1 backend, which torch counts
  as native (``NATIVE_DEVICES``), but the test file imports torch's test utilities
  before xlanb renames the backend, so their tuple holds the old name;
- the dtypes xlanb cannot hold (``UNSUPPORTED_DTYPES``: none of torch's test dtypes today)
  are not instantiated;
- a test that fails on CPU torch 2.13 itself (``cpu-baseline-failures.txt`` beside the
  test files: API drift since the files' PyTorch 2.1) is skipped with that reason;
- the xfail list (``xfails.py``) marks known failures, each with its cause;
- xlanb's own warning for an op that falls back to CPU torch is off: tests that count
  torch's warnings must not see xlanb's.
"""
import os
import sys
import unittest

import torch

_MODE = os.environ.get("XLANB_SUITE_MODE", "eager")
if _MODE not in ("eager", "lazy-sync", "opbyop"):
    raise ValueError(f"XLANB_SUITE_MODE must be eager, lazy-sync or opbyop; got {_MODE!r}")
os.environ["XLANB_MODE"] = "lazy" if _MODE == "lazy-sync" else _MODE
# XLANB_SUITE_IGNORE_XFAILS=1 runs listed tests as ordinary ones: to see which now pass
_IGNORE_XFAILS = os.environ.get("XLANB_SUITE_IGNORE_XFAILS") == "1"

import xlanb  # noqa: E402

# xlanb's own diagnostic (an op without a lowering ran on CPU torch) is not torch's:
# tests that count torch's warnings must not see it
xlanb.config.warn_fallbacks = False

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from xfails import xfail_cause  # noqa: E402

# Dtypes xlanb cannot hold on any platform; the one place this base says so.
UNSUPPORTED_DTYPES: dict = {}  # (complex32 left it: xlanb holds it as complex64)

# xla is the PrivateUse1 backend, native to torch (see the docstring).
for _name in ("torch.testing._internal.common_utils", "torch.testing._internal.common_device_type"):
    _mod = sys.modules.get(_name)
    if _mod is not None and "xla" not in getattr(_mod, "NATIVE_DEVICES", ("xla",)):
        _mod.NATIVE_DEVICES = tuple(_mod.NATIVE_DEVICES) + ("xla",)


def _baseline(generic_cls) -> set:
    """Names (``Class::test``, CPU spelling) of the tests that fail on CPU torch itself."""
    import inspect
    path = os.path.join(os.path.dirname(inspect.getfile(generic_cls)), "cpu-baseline-failures.txt")
    if not os.path.exists(path):
        return set()
    with open(path) as f:
        return {line.strip().split("::", 1)[1] for line in f if "::" in line}


def _cpu_name(cls_name: str, test_name: str) -> str:
    """``TestViewOpsXLA``, ``test_x_xla_float32`` -> ``TestViewOpsCPU::test_x_cpu_float32``."""
    if test_name.endswith("_xla"):
        test_name = test_name[:-4] + "_cpu"
    else:
        i = test_name.rfind("_xla_")
        if i >= 0:
            test_name = test_name[:i] + "_cpu_" + test_name[i + 5:]
    return cls_name.removesuffix("XLA") + "CPU::" + test_name


class _SyncEachOp(torch.utils._python_dispatch.TorchDispatchMode):
    """lazy-sync: every op is followed by a sync, so each op compiles as its own graph."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        xlanb.sync()
        return out


class XLATestBase(DeviceTypeTestBase):  # noqa: F821  (in the globals runpy passes)
    device_type = "xla"

    @classmethod
    def get_primary_device(cls):
        return str(xlanb.device(0))

    @classmethod
    def get_all_devices(cls):
        return [str(xlanb.device(i)) for i in range(xlanb.device_count())]

    @classmethod
    def _get_dtypes(cls, test):
        dtypes = super()._get_dtypes(test)
        if dtypes is None:
            return None
        return [d for d in dtypes if d not in UNSUPPORTED_DTYPES]

    @classmethod
    def instantiate_test(cls, name, test, *, generic_cls=None):
        before = set(vars(cls))
        super().instantiate_test(name, test, generic_cls=generic_cls)
        baseline = _baseline(generic_cls) if generic_cls is not None else set()
        for attr in set(vars(cls)) - before:
            if not attr.startswith("test"):
                continue
            if _cpu_name(cls.__name__, attr) in baseline:
                setattr(cls, attr, unittest.skip("fails on CPU torch 2.13 too (API drift "
                                                 "since these files' PyTorch 2.1)")(getattr(cls, attr)))
                continue
            cause = None if _IGNORE_XFAILS else xfail_cause(cls.__name__, attr, _MODE)
            if cause:
                setattr(cls, attr, unittest.expectedFailure(getattr(cls, attr)))

    def setUp(self):
        super().setUp()
        if _MODE == "lazy-sync":
            mode = _SyncEachOp()
            mode.__enter__()
            self.addCleanup(mode.__exit__, None, None, None)

    def _should_stop_test_suite(self):
        # a failing test is a finding, not a broken device: run the rest
        return False


TEST_CLASS = XLATestBase
