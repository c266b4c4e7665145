"""Device ``xla`` (xlanb) for PyTorch's device-generic tests.

PyTorch's ``common_device_type`` runs this file with ``runpy.run_path`` and its own
globals (so ``DeviceTypeTestBase`` is already defined here; do not import
common_device_type) and takes ``TEST_CLASS``. Run a PyTorch test file with::

    TORCH_TEST_DEVICES=tests/pytorch_suite/xla_device.py PYTORCH_TESTING_DEVICE_ONLY_FOR=xla \\
        XLANB_MODE=eager python -m pytest ../shared/pytorch-tests/test_unary_ufuncs.py -k ...

The execution mode comes from ``XLANB_MODE`` (lazy by default), which xlanb reads when
it is imported.
"""
import xlanb


class XLATestBase(DeviceTypeTestBase):  # noqa: F821  (in the globals runpy passes)
    device_type = "xla"

    @classmethod
    def get_primary_device(cls):
        return str(xlanb.device(0))

    @classmethod
    def get_all_devices(cls):
        return [str(xlanb.device(i)) for i in range(xlanb.device_count())]

    def _should_stop_test_suite(self):
        # a failing test is a finding, not a broken device: run the rest
        return False


TEST_CLASS = XLATestBase
