"""Counters and timing metrics: the observer layer of xlanb.

Every layer reports here; nothing reads these numbers to make decisions.  The
module depends only on the standard library, so any part of xlanb (and its
tests) can import it without import cycles.

The API is shaped after ``torch_xla.debug.metrics``::

    from xlanb import metrics

    metrics.counter("UncachedCompile")            # +1
    with metrics.timer("CompileTime"):            # records elapsed seconds
        ...
    metrics.counter_value("UncachedCompile")      # -> 1 (None if never counted)
    metrics.metric_data("CompileTime")[0]         # total samples, as in torch_xla
    print(metrics.report())                       # torch_xla-style text report
    print(metrics.short_report())                 # one line per name

    before = metrics.snapshot()
    ...                                           # run a notebook cell
    metrics.diff(before)                          # what that cell did

Vocabulary
----------
Use these names so reports, docs and tests agree.  Times are always seconds.

Counters (``counter``):

``UncachedCompile``
    A whole graph new to this process (in-memory cache miss): compiled, or loaded from
    the on-disk store (then also a ``PersistentCacheHit``).
``CachedCompile``
    A whole graph was found in the in-memory compile cache.
``OpCompile``
    A single-op executable new to this process (eager dispatch cache miss): compiled, or
    loaded from the on-disk store (then also a ``PersistentCacheHit``).
``OpCacheHit``
    A single-op executable was reused from the eager dispatch cache.
``aten::<op>``
    ``<op>`` (e.g. ``aten::nonzero``) had no lowering and fell back to CPU.
``PersistentCacheHit`` / ``PersistentCacheMiss``
    JAX's on-disk compilation cache was hit / missed.
``PersistentCacheRejected``
    An executable-store entry was not this user's or not signed with their key: it was
    deleted without being loaded (also counted as a miss).
``CreateXlaTensor`` / ``DestroyXlaTensor``
    A tensor on the ``xla`` device was created / freed; the difference is the
    number of live device tensors (useful for spotting leaks).

Metrics (``record`` / ``timer``), each sample in seconds:

``CompileTime``             compiling a whole graph.
``ExecuteTime``             running a compiled graph (dispatch to completion as
                            far as the caller measures it).
``OpCompileTime``           compiling a single-op executable.
``LowerTime`` / ``OpLowerTime``  the part of a CompileTime / OpCompileTime sample
                            spent tracing and lowering to StableHLO (JAX), before
                            XLA compiles or the persistent cache loads it.
``OpBackgroundCompileTime`` the part of an OpCompileTime sample that ran on a
                            background compile thread (eager mode).
``OpCompileWaitTime``       the main thread waiting for a background compile.
``TransferToDeviceTime``    host -> device copies.
``TransferFromDeviceTime``  device -> host copies.

Differences from torch_xla
--------------------------
* ``metric_data(name)`` returns a :class:`MetricData`; it indexes and unpacks
  like torch_xla's ``(total_samples, accumulator, samples)`` tuple, but the
  accumulator is in **seconds** (torch_xla uses nanoseconds for timings) and
  ``samples`` holds plain float values, not ``(timestamp_ns, value)`` pairs.
* Only the last :data:`SAMPLE_CAPACITY` samples of a metric are kept; count,
  total, min, max, mean and standard deviation cover every sample since the
  last :func:`clear`, percentiles and rate cover the kept samples.

Thread safety
-------------
``counter`` is a plain dict update (``d[k] = d.get(k, 0) + delta``), kept that
cheap because it runs once per op.  Under the GIL the dict itself is never
corrupted; two threads bumping the *same* counter at the same instant (the main
thread and one of JAX's compile threads reporting through a monitoring
listener) can in principle lose one increment.  That is acceptable for numbers
that are only observed.  ``record`` updates several fields per sample, so it
takes a lock; readers take the same lock and see each metric consistently.
"""
from __future__ import annotations

import functools
import math
import threading
from collections import deque
from dataclasses import dataclass
from time import perf_counter
from typing import Iterable, Iterator

from .formats import format_duration

__all__ = [
    "SAMPLE_CAPACITY",
    "MetricData",
    "counter",
    "counter_value",
    "counter_names",
    "record",
    "metric_names",
    "metric_data",
    "timer",
    "clear",
    "report",
    "short_report",
    "snapshot",
    "diff",
    "format_time",
    "DESCRIPTIONS",
    "describe",
    # torch_xla-style aliases
    "metrics_report",
    "short_metrics_report",
    "clear_all",
    "clear_counters",
    "clear_metrics",
]

#: What each counter and metric xlanb records means, in a reader's words: the one
#: source for every table that shows them (``%xla_metrics``, the dashboard). A name
#: missing here is a name nobody can read; tests check that every recorded name has one.
DESCRIPTIONS = {
    # whole graphs
    "UncachedCompile": "whole graphs new to this process: compiled, or loaded from the "
                       "on-disk store (PersistentCacheHit)",
    "CachedCompile": "whole graphs found in the compile cache",
    "CompileTime": "time compiling whole graphs",
    "LowerTime": "of which tracing and lowering them (JAX)",
    "GraphReload": "graph executables loaded again after being dropped (XLANB_MAX_GRAPHS)",
    "GraphExecutableEvicted": "graph executables dropped to bound the loaded ones",
    "CompiledReplay": "xlanb.compile steps replayed without running Python",
    "MarkStep": "xm.mark_step() calls (torch_xla compat)",
    "ScanLayersUnrolled": "repeated layers that could not run as one loop (scan) and were "
                          "unrolled instead",
    # eager runs (mode_policy.Eager): new ops compiled together
    "EagerRunCompile": "eager runs of ops compiled as one graph (some ops had no "
                       "executable of their own), or loaded from the on-disk store",
    "EagerRunCacheHit": "eager runs found in the compile cache (the same ops again)",
    "EagerRunOpByOp": "eager runs of many ops and few new signatures (a Python loop over "
                      "one op) run op by op through quickly compiled single ops",
    "EagerRunCompileTime": "time compiling eager runs (lowering included)",
    "EagerRunInPieces": "eager runs of independent pieces that each ran before, run as "
                        "those pieces from the cache",
    # graphs whose shapes change, cut where they changed (graph/segments.py)
    "SegmentedGraph": "graphs (lazy or eager runs) whose shapes changed, run as segments",
    "SegmentCompile": "segments compiled (their shapes were new)",
    "SegmentCacheHit": "segments found in the compile cache",
    "SegmentPlanHit": "segmented graphs of a key that ran as segments before, run as the "
                      "same segments without planning them again",
    "SegmentOnHost": "small changed segments (and small eager index checks) computed by CPU "
                     "torch instead of compiled",
    "SegmentOnHostTime": "time computing them there, transfers included",
    "SegmentHostRefused": "small changed segments CPU torch could not run as their "
                          "signatures say (they compile instead)",
    "QuickCompile": "graphs (lazy graphs, eager runs) compiled with the quick tier "
                    "(XLA:CPU's LLVM at -O0) until they tier up",
    "GraphTierUp": "quick graphs replaced by their optimized compile (background): a lazy "
                   "graph's at its third run, an eager run's once it has run as long as "
                   "its quick compile took",
    "GraphTierUpCompileTime": "time compiling the optimized graphs that replace quick ones "
                              "(background)",
    # single ops
    "OpCompile": "single-op executables new to this process: compiled, or loaded from "
                 "the on-disk store (PersistentCacheHit)",
    "OpCacheHit": "single-op executables reused",
    "OpCompileTime": "time compiling single-op executables",
    "OpLowerTime": "of which tracing and lowering them (JAX)",
    "OpQuickCompile": "single-op executables compiled quickly first (LLVM's optimizations "
                      "off), to run at once",
    "OpTierUp": "quick single-op executables replaced by their optimized compile (at "
                "their third use)",
    "X64Lost": "host arrays that reached the device with a narrower dtype (JAX's 64-bit "
               "setting lost inside xlanb's x64 block) and were copied again",
    "YnnDotsOnly": "executables compiled with XLA:CPU's YNNPACK kept to dots: a reduce "
                   "that can fuse with a broadcast (YNNPACK's gives changing sums)",
    "OpTierUpCompileTime": "time compiling the optimized executables that replace quick ones "
                           "(background)",
    "OpBackgroundCompileTime": "of the single-op compile time, what ran on a background "
                               "compile thread",
    "OpCompileWaitTime": "time waiting for a single-op executable still compiling in the "
                         "background",
    "OpExecutableEvicted": "single-op executables dropped to bound the loaded ones",
    # looks at pending values
    "PeekCompile": "quick graphs compiled for a first look at a pending value",
    "PeekCompileTime": "time compiling them",
    "PeekCompileFallback": "first looks that fell back to running op by op",
    # running and copying
    "ExecuteTime": "time running graphs and ops",
    "TransferToDeviceTime": "host -> device copies",
    "TransferFromDeviceTime": "device -> host copies",
    "CollectiveOps": "collectives run (all-reduce, all-gather, ...) on a mesh",
    "CollectiveBytes": "bytes per device the collectives moved",
    # the executable store
    "PersistentCacheHit": "of those (UncachedCompile, OpCompile), loaded from the on-disk "
                          "store instead of compiled",
    "PersistentCacheMiss": "executables not in the on-disk store (compiled)",
    "PersistentCacheWrite": "executables written to the on-disk store",
    "PersistentCacheRejected": "store entries not this user's or not signed: deleted unread",
    "PersistentCacheEvicted": "store entries deleted to keep it under its cap",
    # TPU targets
    "TargetCompile": "graphs compiled for a TPU target (not run)",
    "TargetCompileRefused": "graphs the TPU compiler refused (too large, unsupported)",
    "TargetCompileTime": "time the TPU compiler took",
    # tensors
    "CreateXlaTensor": "tensors created on the xla device",
    "DestroyXlaTensor": "tensors on the xla device freed",
}


def describe(name: str) -> str:
    """What counter or metric ``name`` counts, in a reader's words ("" if unknown)."""
    if name.startswith("aten::"):
        return "ran on CPU torch: no lowering"
    return DESCRIPTIONS.get(name, "")


#: Recent samples kept per metric (for percentiles and rate).
SAMPLE_CAPACITY = 1024

#: Percentiles shown by :func:`report`.
REPORT_PERCENTILES = (25, 50, 80, 90, 95, 99)

_counters: dict[str, int] = {}
_metrics: dict[str, "_Metric"] = {}
_lock = threading.Lock()
_epoch = perf_counter()  # start of the current measurement period (import or clear)


# --------------------------------------------------------------------------- counters


def counter(name: str, delta: int = 1, _d: dict = _counters, _get=_counters.get) -> None:
    """Add ``delta`` (default 1) to counter ``name``.  Hot path: one dict update."""
    _d[name] = _get(name, 0) + delta


def counters_table() -> dict[str, int]:
    """The counters' dict itself, for a hot path that updates one in place (cleared in
    place, never replaced)."""
    return _counters


def counter_value(name: str) -> int | None:
    """Current value of counter ``name``, or ``None`` if it was never incremented."""
    return _counters.get(name)


def counter_names() -> list[str]:
    """Names of all counters, sorted."""
    return sorted(_counters)


# --------------------------------------------------------------------------- metrics


class _Metric:
    __slots__ = ("count", "total", "min", "max", "mean", "m2", "ring")

    def __init__(self) -> None:
        self.count = 0
        self.total = 0.0
        self.min = math.inf
        self.max = -math.inf
        self.mean = 0.0  # Welford running mean / sum of squared deviations
        self.m2 = 0.0
        self.ring: deque[tuple[float, float]] = deque(maxlen=SAMPLE_CAPACITY)

    def add(self, t: float, v: float) -> None:
        self.count += 1
        self.total += v
        if v < self.min:
            self.min = v
        if v > self.max:
            self.max = v
        d = v - self.mean
        self.mean += d / self.count
        self.m2 += d * (v - self.mean)
        self.ring.append((t, v))


def record(name: str, seconds: float) -> None:
    """Add one sample (a duration in seconds) to metric ``name``."""
    v = float(seconds)
    t = perf_counter()
    with _lock:
        m = _metrics.get(name)
        if m is None:
            m = _metrics[name] = _Metric()
        m.add(t, v)
    if _listeners:  # a profiler: each sample as a timed event (only while one runs)
        for fn in tuple(_listeners):
            fn(name, t, v)


# Called with (name, end perf_counter seconds, duration seconds) for every sample, on
# the thread that recorded it. ``xlanb.profile`` adds one while it records.
_listeners: list = []


def add_listener(fn) -> None:
    _listeners.append(fn)


def remove_listener(fn) -> None:
    if fn in _listeners:
        _listeners.remove(fn)


def metric_names() -> list[str]:
    """Names of all metrics, sorted."""
    with _lock:
        return sorted(_metrics)


@dataclass(frozen=True)
class MetricData:
    """A consistent copy of one metric.

    Indexes and unpacks like torch_xla's ``(total_samples, accumulator,
    samples)``: ``data[0]`` is ``count``, ``data[1]`` is ``total`` (seconds),
    ``data[2]`` is ``samples``; ``count, total, samples = data`` works.
    """

    count: int
    total: float
    samples: tuple[float, ...]  # the most recent samples, oldest first
    min: float = math.nan
    max: float = math.nan
    stddev: float = math.nan  # population standard deviation over all samples
    rate: float | None = None  # samples per second; None if it cannot be measured
    times: tuple[float, ...] = ()  # when each kept sample was taken (perf_counter seconds)

    @property
    def mean(self) -> float:
        return self.total / self.count if self.count else math.nan

    def percentile(self, p: float) -> float:
        """Nearest-rank percentile ``p`` (0..100) of the kept samples."""
        if not self.samples:
            return math.nan
        if not 0 <= p <= 100:
            raise ValueError(f"percentile must be within [0, 100], got {p}")
        s = sorted(self.samples)
        k = math.ceil(p / 100 * len(s)) - 1
        return s[min(max(k, 0), len(s) - 1)]

    def percentiles(self, ps: Iterable[float] = REPORT_PERCENTILES) -> dict[float, float]:
        """``{p: percentile(p)}`` for each ``p`` in ``ps``."""
        return {p: self.percentile(p) for p in ps}

    # torch_xla tuple compatibility
    def _as_tuple(self) -> tuple:
        return (self.count, self.total, self.samples)

    def __getitem__(self, index):
        return self._as_tuple()[index]

    def __len__(self) -> int:
        return 3

    def __iter__(self) -> Iterator:
        return iter(self._as_tuple())


def _data(m: _Metric, epoch: float) -> MetricData:
    ring = tuple(m.ring)
    rate = None
    if ring:
        span = ring[-1][0] - ring[0][0]
        if len(ring) < 2 or span <= 0:
            span = ring[-1][0] - epoch
        if span > 0:
            # Like torch_xla: kept samples / time between the first and last of
            # them (for a single sample: since the last clear or import).
            rate = len(ring) / span
    return MetricData(
        count=m.count,
        total=m.total,
        samples=tuple(v for _, v in ring),
        min=m.min,
        max=m.max,
        stddev=math.sqrt(m.m2 / m.count),
        rate=rate,
        times=tuple(t for t, _ in ring),
    )


def metric_data(name: str) -> MetricData | None:
    """A copy of metric ``name``, or ``None`` if it has no samples."""
    with _lock:
        m = _metrics.get(name)
        return None if m is None else _data(m, _epoch)


class _Timer:
    __slots__ = ("name", "start", "elapsed")

    def __init__(self, name: str) -> None:
        self.name = name
        self.start = 0.0
        self.elapsed: float | None = None

    def __enter__(self) -> "_Timer":
        self.start = perf_counter()
        return self

    def __exit__(self, *exc) -> bool:
        self.elapsed = perf_counter() - self.start
        record(self.name, self.elapsed)
        return False

    def __call__(self, fn):
        """Use as a decorator: every call of ``fn`` is timed."""
        name = self.name

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with _Timer(name):
                return fn(*args, **kwargs)

        return wrapper


def timer(name: str) -> _Timer:
    """Context manager (or decorator) recording elapsed ``perf_counter`` seconds
    into metric ``name``.  The time is recorded even if the block raises; the
    ``as`` target's ``.elapsed`` holds it afterwards."""
    return _Timer(name)


# --------------------------------------------------------------------------- reset


def clear(counters: bool = True, metrics: bool = True) -> None:
    """Forget counters and/or metrics (and restart the rate clock)."""
    global _epoch
    if counters:
        _counters.clear()  # in place: ``counter`` holds a reference
    if metrics:
        with _lock:
            _metrics.clear()
            _epoch = perf_counter()


def clear_all() -> None:
    clear()


def clear_counters() -> None:
    clear(counters=True, metrics=False)


def clear_metrics() -> None:
    clear(counters=False, metrics=True)


# --------------------------------------------------------------------------- reports


_UNITS = (("d", 86_400 * 10**9), ("h", 3_600 * 10**9), ("m", 60 * 10**9), ("s", 10**9), ("ms", 10**6))


def format_time(seconds: float) -> str:
    """Format a duration like torch_xla: ``08m58s782ms309.432us``.

    Leading zero units are dropped, every unit after the first shown one is
    zero-padded, and microseconds (three decimals) always appear:
    ``0.0000015`` -> ``001.500us``, ``1.2345678`` -> ``01s234ms567.800us``.
    """
    if math.isnan(seconds) or math.isinf(seconds):
        return str(seconds)
    sign = "-" if seconds < 0 else ""
    ns = round(abs(seconds) * 1e9)
    parts = []
    for suffix, scale in _UNITS:
        q, ns = divmod(ns, scale)
        if q or parts:
            parts.append(f"{q:0{3 if suffix == 'ms' else 2}d}{suffix}")
    parts.append(f"{ns / 1000:07.3f}us")
    return sign + "".join(parts)


def _all_data() -> tuple[list[tuple[str, MetricData]], list[tuple[str, int]]]:
    with _lock:
        mets = [(n, _data(_metrics[n], _epoch)) for n in sorted(_metrics)]
    cnts = sorted(_counters.items())
    return mets, cnts


def report() -> str:
    """A torch_xla-style text report: metrics, then counters, each sorted by name."""
    mets, cnts = _all_data()
    lines = []
    for name, d in mets:
        lines.append(f"Metric: {name}")
        lines.append(f"  TotalSamples: {d.count}")
        lines.append(f"  Accumulator: {format_time(d.total)}")
        lines.append(f"  Mean: {format_time(d.mean)}")
        lines.append(f"  StdDev: {format_time(d.stddev)}")
        if d.rate is not None:
            lines.append(f"  Rate: {d.rate:.6g} / second")
        pct = "; ".join(f"{p:g}%={format_time(v)}" for p, v in d.percentiles().items())
        lines.append(f"  Percentiles: {pct}")
    for name, value in cnts:
        lines.append(f"Counter: {name}")
        lines.append(f"  Value: {value}")
    return "\n".join(lines) + "\n" if lines else ""


_packed = functools.partial(format_duration, sep="")  # total=1.5s: no space in a value


def short_report(names: str | Iterable[str] | None = None) -> str:
    """One line per metric / counter, for notebooks.

    ``names`` restricts the output to those metric and counter names (a single
    string is one name).  Example::

        CompileTime: n=2 total=1.23s mean=617ms p50=420ms max=815ms
        UncachedCompile: 2
    """
    if isinstance(names, str):
        names = (names,)
    wanted = None if names is None else set(names)
    mets, cnts = _all_data()
    lines = []
    for name, d in mets:
        if wanted is None or name in wanted:
            lines.append(
                f"{name}: n={d.count} total={_packed(d.total)} mean={_packed(d.mean)} "
                f"p50={_packed(d.percentile(50))} max={_packed(d.max)}"
            )
    shown = [(n, v) for n, v in cnts if wanted is None or n in wanted]
    new = {n for n, _ in shown} & {"UncachedCompile", "OpCompile"}
    for name, value in shown:
        # a store hit is also counted as new to the process; said so where both show
        note = (f" (of the {' and '.join(sorted(new))} counts: loaded from the on-disk "
                "store, not compiled)" if name == "PersistentCacheHit" and new else "")
        lines.append(f"{name}: {value}{note}")
    return "\n".join(lines) + "\n" if lines else ""


def metrics_report() -> str:
    """Alias of :func:`report` (torch_xla's name)."""
    return report()


def short_metrics_report(names: str | Iterable[str] | None = None) -> str:
    """Alias of :func:`short_report` (torch_xla's name)."""
    return short_report(names)


# --------------------------------------------------------------------------- snapshots


def snapshot() -> dict:
    """Current counters and metric totals::

        {"counters": {name: value},
         "metrics": {name: {"count": int, "total": seconds}}}
    """
    with _lock:
        mets = {n: {"count": m.count, "total": m.total} for n, m in _metrics.items()}
    return {"counters": dict(_counters), "metrics": mets}


def diff(before: dict, after: dict | None = None) -> dict:
    """What changed between two :func:`snapshot` results (``after`` defaults to
    now), in the same shape; names that did not change are left out.  A name
    missing from a snapshot counts as zero, so a :func:`clear` in between shows
    up as negative deltas."""
    if after is None:
        after = snapshot()
    bc, ac = before.get("counters", {}), after.get("counters", {})
    counters = {}
    for n in sorted(set(bc) | set(ac)):
        d = ac.get(n, 0) - bc.get(n, 0)
        if d:
            counters[n] = d
    bm, am = before.get("metrics", {}), after.get("metrics", {})
    mets = {}
    zero = {"count": 0, "total": 0.0}
    for n in sorted(set(bm) | set(am)):
        b, a = bm.get(n, zero), am.get(n, zero)
        dc, dt = a["count"] - b["count"], a["total"] - b["total"]
        if dc or dt:
            mets[n] = {"count": dc, "total": dt}
    return {"counters": counters, "metrics": mets}
