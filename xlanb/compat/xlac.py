"""``torch_xla._XLAC``: the debug calls users make by hand; the rest is torch_xla's C++."""
from __future__ import annotations

import os

import torch

import xlanb
from xlanb.runtime.devices import device_index, global_devices

from . import backends as _backends
from .missing import module_getattr

NAME = "torch_xla._XLAC"

__all__ = ["_get_xla_tensors_text", "_get_xla_tensors_hlo", "_get_xla_tensors_dot",
           "_get_xla_sharding_spec", "_xla_memory_info", "_xla_set_mat_mul_precision",
           "_xla_get_mat_mul_precision", "_xla_metrics_report", "_xla_counter_value",
           "_xla_metric_data", "_get_xla_tensor_debug_info", "_xla_get_default_device",
           "_get_num_cached_compilation_graph"]

__getattr__ = module_getattr(NAME, {
    "_xla_sync_multi": "torch_xla.sync() / xlanb.sync()",
    "_xla_step_marker": "torch_xla.sync() / xlanb.sync()",
    "_get_xla_tensors_hlo_proto": "xlanb.hlo(*tensors, dialect='hlo')",
    "profiler": "torch_xla.debug.profiler (start_trace/stop_trace, Trace, StepTrace)",
    "_clear_pending_irs": "xlanb never runs pending work no live tensor needs: drop the "
                          "tensors (del t) to drop their work, or torch_xla.sync() / "
                          "xlanb.sync() to run it; xlanb.pending_summary() shows what is "
                          "pending",
})


def _get_xla_tensors_text(tensors) -> str:
    """The pending IR that computes ``tensors``, as text (nothing runs)."""
    return xlanb.pending_ir(*tensors, fmt="text")


def _get_xla_tensors_hlo(tensors) -> str:
    """The HLO module the next sync of ``tensors`` would compile (nothing runs), under
    the name the sync's compile gives it (``jit_xlanb_graph_<hash>``, as in dumps)."""
    return xlanb.hlo(*tensors, dialect="hlo")


def _xla_get_default_device() -> str:
    """``'xla:0'``: the device ``torch_xla.device()`` gives."""
    return str(xlanb.device(0))


def _get_num_cached_compilation_graph() -> int:
    """How many compiled graphs xlanb holds in memory now (its graph cache: what a sync
    of a known structure reuses); ``xlanb.graphs()`` lists every sync's."""
    from xlanb.execute.graphs import graph_cache
    return len(graph_cache)


def _get_xla_tensors_dot(tensors) -> str:
    """The pending IR that computes ``tensors``, as Graphviz DOT (nothing runs)."""
    return xlanb.pending_ir(*tensors, fmt="dot")


def _get_xla_sharding_spec(tensor) -> str:
    """XLA's sharding text of ``tensor``: ``'{devices=[4,1]0,1,2,3}'``, ``'{replicated}'``,
    or ``''`` when it is not sharded."""
    s = xlanb.spmd.get_sharding(tensor)
    if s is None:
        return ""
    h = s.to_jax()._to_xla_hlo_sharding(tensor.dim())
    if h.is_replicated():
        return "{replicated}"
    dims, ids = h.tile_assignment_dimensions(), h.tile_assignment_devices()
    if not dims or h.subgroup_types():  # manual or mixed subgroups: XLA's own text
        return str(h)
    # torch_xla lists every device (XLA's text may be iota, "<=[4]"); by position in the
    # global device list, as mesh ids are (JAX's ids need not be positions)
    position = {d.id: i for i, d in enumerate(global_devices())}
    text = (f"{{devices=[{','.join(map(str, dims))}]"
            f"{','.join(str(position.get(i, i)) for i in ids)}")
    return text + (" last_tile_dim_replicate}" if h.replicate_on_last_tile_dim() else "}")


def _bytes_limit(index: int, platform: dict) -> int:
    """The device's capacity: the platform allocator's, else xlanb's memory limit, else
    (XLA:CPU, whose allocator reports nothing) the host's physical memory."""
    if platform.get("platform.bytes_limit"):
        return int(platform["platform.bytes_limit"])
    if xlanb.config.memory_limit:
        return int(xlanb.config.memory_limit)
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


def _xla_memory_info(device) -> dict:
    """``{'bytes_used', 'bytes_limit', 'peak_bytes_used'}`` of ``device`` from xlanb's
    memory accounting (every device buffer xlanb holds, its sampled peak); the old
    ``kb_free``/``kb_total`` keys too, which Lightning's XLA accelerator reads."""
    index = device_index(torch.device(device) if isinstance(device, str) else device)
    stats = xlanb.memory_stats(index)
    used = int(stats.get("platform.bytes_in_use") or stats["device_bytes.current"])
    peak = int(stats.get("platform.peak_bytes_in_use") or stats["device_bytes.peak"])
    limit = _bytes_limit(index, stats)
    return {"bytes_used": used, "bytes_limit": limit, "peak_bytes_used": max(peak, used),
            "kb_free": max(0, limit - used) // 1024, "kb_total": limit // 1024}


def _xla_set_mat_mul_precision(precision: str) -> None:
    _backends.set_mat_mul_precision(precision)


def _xla_get_mat_mul_precision() -> str:
    return _backends.get_mat_mul_precision()


def _xla_metrics_report() -> str:
    from . import metrics
    return metrics.metrics_report()


def _xla_counter_value(name: str):
    from . import metrics
    return metrics.counter_value(name)


def _xla_metric_data(name: str):
    from . import metrics
    return metrics.metric_data(name)


def _get_xla_tensor_debug_info(tensor) -> str:
    """What xlanb knows of ``tensor`` without running anything: device, shape, dtype,
    whether it holds device data or pending work (and that work's IR)."""
    pending = xlanb.pending_count(tensor) > 0
    lines = ["XLATensor {", f"Device: {tensor.device}",
             f"XLA Shape: {tuple(tensor.shape)} {tensor.dtype}",
             "IR: " + (xlanb.pending_ir(tensor).strip() if pending else "None"),
             "XLAData: " + ("None" if pending else "device data")]
    sharding = _get_xla_sharding_spec(tensor)
    if sharding:
        lines.append(f"Sharding: {sharding}")
    lines.append("}")
    return "\n".join(lines)
