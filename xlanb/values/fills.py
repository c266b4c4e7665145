"""Fills: pending nodes whose value does not depend on their inputs' values, made device
data without compiling anything."""
from __future__ import annotations

import jax
import numpy as np

from ..base.dtypes import to_jax_dtype
from ..ir.nodes import Node
from ..runtime.devices import jax_device
from ..runtime.mesh import is_sharded, place
from ..runtime.transfer import put
from .memory import device_oom, is_device_oom

# Fills: nodes whose value does not depend on their inputs' values. Zeros, ones and
# fill_/zero_ (what torch.zeros(..., device="xla") records: empty, then zero_) are made
# device data before their first in-place write (see dispatch); empties only when read
# (an empty is usually overwritten whole, and its node costs nothing in a graph).
_FILL_VALUES = {"aten::zeros": 0, "aten::zeros_like": 0, "aten::new_zeros": 0, "aten::zero_": 0,
                "aten::ones": 1, "aten::ones_like": 1, "aten::new_ones": 1}
EMPTIES = ("aten::empty", "aten::empty_like", "aten::new_empty", "aten::empty_strided",
            "aten::new_empty_strided")


def fill_value(node: Node):
    """The value a pending fill node fills with, or None if ``node`` is not a fill."""
    name = node.info.name
    value = _FILL_VALUES.get(name)
    if value is None and name == "aten::fill_" and len(node.inputs) == 1:
        # the value is the lifted scalar, or (not lifted: bool, int) in the signature
        value = node.scalars[0] if node.scalars else node.info.sig[1][1]
        if isinstance(value, np.float32):  # a lifted float passed as float32
            value = float(value)
        if not isinstance(value, (bool, int, float)):
            return None
    return value


# Fills up to this size are made on the host (free on the CPU device, where host and
# device memory are one); bigger ones on the device, so that a factory never needs host
# memory for its value (a 50 GB torch.zeros once failed in numpy before reaching XLA).
_HOST_FILL_BYTES = 1 << 20


def _nbytes(meta) -> int:
    return int(np.prod(meta.shape, dtype=np.int64)) * meta.dtype.itemsize


def settle_fill(node: Node, value=0) -> None:
    """Make the pending fill ``node`` device data: ``value`` everywhere."""
    meta = node.info.out
    dtype = to_jax_dtype(meta.dtype)
    device = jax_device(node.info.device)
    with jax.enable_x64(True):
        if device.platform == "cpu" and _nbytes(meta) <= _HOST_FILL_BYTES \
                and len(meta.shape) <= 64:  # numpy's most dimensions
            # a small host buffer is the CPU device's own: nothing to compile
            arr = put(np.full(meta.shape, value, dtype), device)
        else:  # made on the device: no host copy, no transfer (one fill per shape)
            try:
                arr = jax.numpy.full(meta.shape, value, dtype, device=device)
            except Exception as e:
                if is_device_oom(e):
                    raise device_oom(e, node.info.device,
                                     f"{node.info.name} of shape {tuple(meta.shape)}") from e
                raise
    src = node.inputs[0].data if node.inputs else None
    if src is not None and not isinstance(src, tuple) and is_sharded(src) \
            and tuple(src.shape) == tuple(meta.shape):
        # SPMD: a _like of a sharded tensor (an optimizer's moments) lies as it does, so
        # that updating it needs no gather of the sharded gradient
        arr = place(arr, src.sharding)
    node.materialize(arr)


def settled_if_empty(node: Node) -> bool:
    """Settle ``node`` if it is a pending empty (nothing to compile); whether it was."""
    if node.info.name in EMPTIES and not node.info.multi:
        settle_fill(node)
        return True
    return False
