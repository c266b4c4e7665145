"""``torch_xla.debug.metrics`` (``met``) on xlanb's metrics, with torch_xla's signatures,
names and tuple formats.

- ``metric_data(name)`` is torch_xla's tuple ``(total_samples, accumulator, samples)``:
  times in nanoseconds (xlanb keeps seconds), ``samples`` as ``(time_s, value_ns)`` pairs;
  None for a metric with no samples.
- torch_xla's ``EagerOpCompileTime`` is xlanb's ``OpCompileTime`` (compiling one op's
  executable); ``metric_data`` adds ``EagerRunCompileTime`` to it (xlanb's eager mode
  compiles runs of new ops as one graph); ``CompileTime``, ``ExecuteTime``, ``TransferToDeviceTime`` and
  ``TransferFromDeviceTime`` are the same in both. xlanb does not time each eager op's
  execution, so ``EagerOpExecuteTime`` has no samples (None); ``OpCacheHit`` counts those
  runs. ``MarkStep`` counts torch_xla.sync / xm.mark_step calls.
"""
from __future__ import annotations

import xlanb

from .missing import module_getattr

NAME = "torch_xla.debug.metrics"

# torch_xla's metric name -> xlanb's, where they differ.
RENAMED = {"EagerOpCompileTime": "OpCompileTime"}
_TO_TORCH_XLA = {v: k for k, v in RENAMED.items()}

# torch_xla's defaults for short_metrics_report.
SHORT_COUNTERS = ("CachedCompile", "MarkStep", "DynamoSyncInputExecuteTime")
SHORT_METRICS = ("CompileTime", "ExecuteTime", "ExecuteReplicatedTime",
                 "TransferToDeviceTime", "TransferFromDeviceTime")

__all__ = ["counter_names", "counter_value", "clear_counters", "metric_names", "metric_data",
           "clear_metrics", "clear_all", "metrics_report", "short_metrics_report",
           "executed_fallback_ops"]

__getattr__ = module_getattr(NAME, {
    "save_metrics": "xlanb keeps metrics in memory: print met.metrics_report() instead",
})


def counter_names() -> list[str]:
    """Every counter with a value."""
    return xlanb.metrics.counter_names()


def counter_value(name: str) -> int | None:
    """The counter's value; None if it never counted."""
    return xlanb.metrics.counter_value(name)


def clear_counters() -> None:
    xlanb.metrics.clear_counters()


def metric_names() -> list[str]:
    """Every metric with samples, under torch_xla's names (``EagerOpCompileTime`` once
    eager mode compiled anything: a single op or a run of ops)."""
    names = [_TO_TORCH_XLA.get(n, n) for n in xlanb.metrics.metric_names()]
    if "EagerRunCompileTime" in names and "EagerOpCompileTime" not in names:
        names.append("EagerOpCompileTime")
    return sorted(names)


def metric_data(name: str):
    """torch_xla's ``(total_samples, accumulator, samples)`` for metric ``name``: times in
    nanoseconds, samples as ``(time_s, value_ns)``; None if the metric has no samples."""
    parts = [xlanb.metrics.metric_data(RENAMED.get(name, name))]
    if name == "EagerOpCompileTime":  # xlanb's eager mode compiles runs of ops, too
        parts.append(xlanb.metrics.metric_data("EagerRunCompileTime"))
    parts = [d for d in parts if d is not None]
    if not parts:
        return None
    samples = tuple(sorted((t, v * 1e9) for d in parts for t, v in zip(d.times, d.samples)))
    return (sum(d.count for d in parts), sum(d.total for d in parts) * 1e9, samples)


def clear_metrics() -> None:
    xlanb.metrics.clear_metrics()


def clear_all() -> None:
    xlanb.metrics.clear_all()


def _blocks() -> list[tuple[str, str, str]]:
    """xlanb's report as ``(kind, torch_xla name, text)`` blocks. Where eager mode compiled
    only runs of ops (no single op), their block is torch_xla's ``EagerOpCompileTime``."""
    out = []
    renamed = dict(_TO_TORCH_XLA)
    if xlanb.metrics.metric_data("OpCompileTime") is None:
        renamed["EagerRunCompileTime"] = "EagerOpCompileTime"
    for line in xlanb.metrics.report().splitlines():
        if line.startswith(("Metric: ", "Counter: ")):
            kind, _, name = line.partition(": ")
            name = renamed.get(name, name) if kind == "Metric" else name
            out.append([kind, name, [f"{kind}: {name}"]])
        elif out:
            out[-1][2].append(line)
    return [(k, n, "\n".join(ls) + "\n") for k, n, ls in out]


def metrics_report() -> str:
    """Every metric, then every counter, in torch_xla's report format."""
    return "".join(text for _, _, text in _blocks())


def short_metrics_report(counter_names: list | None = None,
                         metric_names: list | None = None) -> str:
    """The report, for the given counters and metrics only (torch_xla's defaults when a
    list is empty or None)."""
    counters = set(counter_names or SHORT_COUNTERS)
    metrics = set(metric_names or SHORT_METRICS)
    return "".join(text for kind, name, text in _blocks()
                   if name in (metrics if kind == "Metric" else counters))


def executed_fallback_ops() -> list[str]:
    """The ops that ran on CPU torch (no lowering), e.g. ``aten::nonzero``."""
    return [n for n in xlanb.metrics.counter_names() if n.startswith("aten::")]
