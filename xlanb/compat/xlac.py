"""``torch_xla._XLAC``: the debug calls users make by hand; the rest is torch_xla's C++."""
from __future__ import annotations

import xlanb

from .missing import module_getattr

NAME = "torch_xla._XLAC"

__all__ = ["_get_xla_tensors_text", "_get_xla_tensors_hlo"]

__getattr__ = module_getattr(NAME, {
    "_get_xla_tensors_dot": "xlanb.pending_ir(*tensors, fmt='dot')",
    "_get_xla_tensor_debug_info": "repr(tensor) (it never syncs) or xlanb.pending_ir(tensor)",
    "_xla_sync_multi": "torch_xla.sync() / xlanb.sync()",
    "_xla_step_marker": "torch_xla.sync() / xlanb.sync()",
    "_get_xla_tensors_hlo_proto": "xlanb.hlo(*tensors, dialect='hlo')",
    "_xla_metrics_report": "torch_xla.debug.metrics.metrics_report() / xlanb.metrics.report()",
    "_xla_counter_value": "torch_xla.debug.metrics.counter_value(name)",
    "_xla_metric_data": "torch_xla.debug.metrics.metric_data(name)",
})


def _get_xla_tensors_text(tensors) -> str:
    """The pending IR that computes ``tensors``, as text (nothing runs)."""
    return xlanb.pending_ir(*tensors, fmt="text")


def _get_xla_tensors_hlo(tensors) -> str:
    """The HLO module the next sync of ``tensors`` would compile (nothing runs)."""
    return xlanb.hlo(*tensors, dialect="hlo")
