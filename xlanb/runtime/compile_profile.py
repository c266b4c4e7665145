"""What each compile's own compiler says about where its time went (issue 48).

``recording()`` wraps the one ``lowered.compile()`` call (``jit.compile_lowered``) and
keeps, per executable, a ``RawCompile``: xlanb's lowering seconds, the compile's wall
seconds, and the compiler's own measurements of its phases:

- XLA:CPU (and any backend compiled in jaxlib) times its phases with TraceMe spans
  (``PjRtCpuClient::Compile``, the HLO pass pipelines, ``CpuCompiler::RunBackend``,
  one ``FusionCompiler::Compile`` per fusion, ``Codegen``...). An in-memory
  ``ProfilerSession`` started around the compile collects them: 0.06 ms to start and
  1-50 ms to stop (a small graph's 800 events, the BERT step's 10,000), against
  compiles of 0.1-15 s. Only graph compiles are traced; single ops are timed only.
- libtpu's spans do not reach JAX's profiler (its profiler extension has another size:
  starting JAX's profiler with libtpu's plugin loaded crashes the process, see
  ``libtpu.py``). libtpu logs its own stage durations instead (``HLO_PASSES``,
  ``BACKEND_PASSES``, ``CODE_GENERATION``, ``END_TO_END``) to its INFO log file
  (``/tmp/tpu_logs`` unless ``TPU_LOG_DIR`` says otherwise); what it wrote while the
  compile ran is kept (``libtpu.prepare`` asks it to write at once, ``--logbufsecs=0``).

Only one profiler session may run in a process. A compile that starts while another is
traced, or while JAX's own profiler runs (``xlanb.profile(device=True)``, the user's
``jax.profiler.trace``), is timed only; so is every compile with
``XLANB_COMPILE_PROFILE=0`` and every CPU compile once libtpu's plugin is loaded. The
attribution to phases, lines and scopes is ``graph/compile_time.py``'s job.
"""
from __future__ import annotations

import contextlib
import glob
import os
import re
import threading
import time
import weakref
from dataclasses import dataclass, field

from ..base.config import config
from . import libtpu

# the compiles whose phases are traced: graphs, for xlanb's devices or a target. Not a
# single op's (one op at one line: its time says all), nor a tier-up's (in the
# background, and its graph's profile is the compile someone waited for)
TRACED_METRICS = frozenset(("CompileTime", "EagerRunCompileTime", "TargetCompileTime"))

# the spans kept from a trace (the rest, MLIR's and XLA's single passes, are not needed)
_KEPT = frozenset(("backend_compile_and_load", "PjRtCpuClient::Compile",
                   "CpuCompiler::RunBackend", "ThunkEmitter::EmitEntryComputation",
                   "ThunkEmitter::ConsumeKernels", "Codegen", "FusionCompiler::Compile"))


class Span(tuple):
    """``(thread line, name, start ns, duration ns, args)``: one compiler span."""
    __slots__ = ()
    line = property(lambda s: s[0])
    name = property(lambda s: s[1])
    start = property(lambda s: s[2])
    dur = property(lambda s: s[3])
    args = property(lambda s: s[4])

    @property
    def end(self) -> int:
        return self[2] + self[3]


@dataclass
class RawCompile:
    """One compile, as measured while it ran (see the module's docstring)."""
    platform: str
    module: str             # the HLO module's name ("" if JAX did not say)
    lower_s: float          # xlanb's trace and lowering, before the compile
    compile_s: float        # ``lowered.compile()``'s wall time
    spans: list = field(default_factory=list)   # XLA's spans (``Span``), where traced
    tpu_log: str = ""       # what libtpu logged meanwhile
    tpu_log_at: tuple = ()  # (its log file, the offset after the compile): read on later
    started: float = 0.0    # time.time() at the compile's start and end (libtpu's log
    ended: float = 0.0      # has wall-clock timestamps)
    note: str = ""          # why the phases were not measured, where they were not
    trace_s: float = 0.0    # what measuring cost: starting, stopping and reading the trace
    perf_started: float = 0.0  # time.perf_counter() at the compile's start: the clock of
    # xlanb.profile's traces, and (within the profiler's start-up, ~0.1 ms) the zero of
    # the spans' times, which count from the profiler session's start


_raw: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_raw_lock = threading.Lock()
_session_lock = threading.Lock()  # one profiler session at a time


def raw_profile(exe) -> RawCompile | None:
    """The ``RawCompile`` of an executable compiled in this process (None: loaded from
    the store, or compiled before this module recorded it)."""
    with _raw_lock:
        return _raw.get(exe)


def module_name(lowered) -> str:
    """The lowered module's name (``jit_xlanb_graph_<hash>``), "" if JAX does not say."""
    try:
        return str(lowered.compiler_ir("stablehlo").operation.attributes["sym_name"]).strip('"')
    except Exception:  # noqa: BLE001 - a lowering that does not say: matched by time instead
        return ""


class _Recording:
    def __init__(self, lowered, platform: str, metric: str, lower_s: float):
        self.raw = RawCompile(platform or "?", "", lower_s, 0.0)
        self.traced = metric in TRACED_METRICS and config.compile_profile
        self._session = None
        self._log = None
        self._lowered = lowered

    def start(self) -> None:
        if not self.traced:
            self.raw.note = ("XLANB_COMPILE_PROFILE=0: timed only" if not config.compile_profile
                             else "a single op: timed only")
            return
        self.raw.module = module_name(self._lowered)
        if self.raw.platform == "tpu":
            self._log = _tpu_log_file()
            if self._log is None:
                self.raw.note = "libtpu wrote no log file here (TPU_LOG_DIR?): timed only"
            else:
                self.raw.tpu_log_at = (self._log, os.path.getsize(self._log))
            return
        if not libtpu.profiler_safe():
            self.raw.note = ("libtpu's plugin is loaded in this process (a TPU target was "
                             "compiled): JAX's profiler would crash it, so XLA's phases are "
                             "not traced")
            return
        if not _session_lock.acquire(blocking=False):
            self.raw.note = "another compile was traced at the same time: timed only"
            return
        try:
            from jax._src.lib import _profiler
            opts = _profiler.ProfileOptions()
            opts.python_tracer_level = 0  # Python calls are not the compiler's phases
            opts.enable_hlo_proto = False
            self._session = _profiler.ProfilerSession(opts)
        except Exception as e:  # noqa: BLE001 - no profiler: timed only
            _session_lock.release()
            self.raw.note = f"JAX's profiler did not start ({type(e).__name__}): timed only"

    def stop(self) -> None:
        if self._session is not None:
            try:
                data = self._session.stop_and_get_profile_data()
            except Exception:  # noqa: BLE001 - ALREADY_EXISTS: JAX's own profiler runs
                self.raw.note = ("JAX's profiler was running (xlanb.profile(device=True) "
                                 "or jax.profiler): XLA's phases not traced")
            else:
                self.raw.spans = _spans(data)
            finally:
                self._session = None
                _session_lock.release()
        if self._log is not None:
            path, offset = self.raw.tpu_log_at
            self.raw.tpu_log, end = _read_from(path, offset)
            self.raw.tpu_log_at = (path, end)


@contextlib.contextmanager
def recording(lowered, platform: str, metric: str, lower_s: float):
    """Around ``lowered.compile()``: yields ``attach(exe)``, which keeps what was
    measured for ``exe``."""
    rec = _Recording(lowered, platform, metric, lower_s)
    exe_box: list = []
    t0 = time.perf_counter()
    rec.start()
    rec.raw.started = time.time()
    t1 = rec.raw.perf_started = time.perf_counter()
    try:
        yield exe_box.append
    finally:
        t2 = time.perf_counter()
        rec.raw.compile_s = t2 - t1
        rec.raw.ended = time.time()
        rec.stop()
        rec.raw.trace_s = (t1 - t0) + (time.perf_counter() - t2)
        if exe_box and exe_box[0] is not None:
            with _raw_lock, contextlib.suppress(TypeError):  # not weak-referenceable
                _raw[exe_box[0]] = rec.raw


def _spans(data) -> list:
    out = []
    for plane in data.planes:
        for i, line in enumerate(plane.lines):
            key = f"{plane.name}/{line.name}#{i}"
            for e in line.events:
                name = e.name
                # the HLO pass pipelines are named "<what> (<module>)"
                if name in _KEPT or name.endswith(")") and "(" in name and " " in name:
                    args = {k: v for k, v in e.stats if not k.startswith("_")}
                    out.append(Span((key, name, int(e.start_ns), int(e.duration_ns), args)))
    return out


def tpu_log_dir() -> str:
    return os.environ.get("TPU_LOG_DIR") or "/tmp/tpu_logs"


def _tpu_log_file() -> str | None:
    """libtpu's INFO log of this process (it names its files with the pid)."""
    found = glob.glob(os.path.join(tpu_log_dir(), f"*.log.INFO.*.{os.getpid()}"))
    return max(found, key=os.path.getmtime) if found else None


def _read_from(path: str, offset: int) -> tuple[str, int]:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read()
    except OSError:
        return "", offset
    return data.decode(errors="replace"), offset + len(data)


# a glog line's time: ``I1127 09:39:32.222587 ...`` (local time, no year)
_GLOG_TIME = re.compile(r"^[IWEF](\d\d)(\d\d) (\d\d):(\d\d):(\d\d(?:\.\d+)?) ")
# how far a line's time may lie outside the compile's window and still be its own
# (glog stamps a line when it is logged, on the clock time.time() reads: the stage
# lines of a compile were stamped 1-3 ms before it returned)
LOG_SLACK_S = 0.005


def log_time(line: str, near: float) -> float | None:
    """A glog line's local time as ``time.time()`` seconds, in the year of ``near``
    (None: not a stamped line)."""
    m = _GLOG_TIME.match(line)
    if m is None:
        return None
    year = time.localtime(near).tm_year
    month, day, hour, minute = (int(m.group(i)) for i in range(1, 5))
    secs = float(m.group(5))
    whole = time.mktime((year, month, day, hour, minute, int(secs), 0, 0, -1))
    return whole + secs - int(secs)


def in_compile(at: float | None, raw: RawCompile) -> bool:
    """Whether a log line stamped ``at`` was logged while ``raw``'s compile ran. libtpu's
    lines reach its file late (buffered), so the file's size at a compile's start does
    not divide one compile's lines from the last's: the stamps do. A line with no stamp
    (a continuation) is kept."""
    if at is None or not raw.started:
        return True
    return raw.started - LOG_SLACK_S <= at <= (raw.ended or at) + LOG_SLACK_S


def tpu_log_since(raw: RawCompile, wait_s: float = 3.0) -> str:
    """What libtpu logged from the compile's start until now (with, where its file lagged,
    some lines before: ``in_compile`` tells them apart). Its stage lines reach the file
    up to a second after the compile returned (libtpu buffers its log): this compile's
    ``END_TO_END`` line is waited for, ``wait_s`` at most, once."""
    if not raw.tpu_log_at:
        return raw.tpu_log
    deadline = time.perf_counter() + wait_s
    while True:
        path, offset = raw.tpu_log_at
        more, end = _read_from(path, offset)
        if more:
            raw.tpu_log += more
            raw.tpu_log_at = (path, end)
        if _ended_in(raw):
            raw.tpu_log_at = ()  # this compile's lines are all in: none to read after
            return raw.tpu_log
        if time.perf_counter() >= deadline:
            return raw.tpu_log
        time.sleep(0.02)


def _ended_in(raw: RawCompile) -> bool:
    return any("END_TO_END" in line and in_compile(log_time(line, raw.started), raw)
               for line in raw.tpu_log.splitlines())
