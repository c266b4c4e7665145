"""``torch_xla.debug.profiler`` (``xp``) on ``xlanb.profile``.

- ``start_trace(logdir)`` / ``stop_trace()`` record an ``xlanb.profile`` (every aten op
  with its scope and line, xlanb's phases, each sync's graph, and JAX's own device trace
  where the platform's profiler runs safely) and write it where TensorBoard's profile
  plugin and XProf look: ``logdir/plugins/profile/<run>/<host>.trace.json.gz``, a
  Chrome/Perfetto trace (plus JAX's ``<host>.xplane.pb`` when it traced the device).
- ``Trace(name)`` and ``StepTrace(name, step_num=)`` are events of that trace, on the
  thread that ran them (``StepTrace`` syncs on exit, as torch_xla's does); outside a
  trace they cost two clock reads. ``trace_me(name)`` decorates a function with a Trace.
- ``start_server(port)`` and ``trace`` / ``trace_detached`` (the client that asks the
  server for ``duration_ms`` of profile) work within one process: the capture records
  the phases and graphs of the thread that started the server, and the annotations of
  every thread. Per-op rows need ``start_trace`` on the thread that runs the ops: torch
  keeps its dispatch modes per thread. A server in another process cannot be reached.
"""
from __future__ import annotations

import functools
import gzip
import json
import os
import shutil
import socket
import threading
import time
import warnings

import xlanb
from xlanb.runtime import libtpu

from . import xla_model as _xm
from .missing import module_getattr

NAME = "torch_xla.debug.profiler"

__all__ = ["start_server", "trace", "trace_detached", "Trace", "StepTrace", "trace_me",
           "start_trace", "stop_trace", "set_tracer_marked_step", "get_tracer_marked_step"]

__getattr__ = module_getattr(NAME, {
    "ProfilerServer": "the object start_server returns",
})

_lock = threading.Lock()
_capture: "_Capture | None" = None
_servers: dict[int, int] = {}  # port -> the thread that started the server
_tracer_marked_step = False
_LOCAL_HOSTS = ("localhost", "127.0.0.1", "0.0.0.0", "::1", "[::1]", "")


def set_tracer_marked_step(value: bool) -> None:
    global _tracer_marked_step
    _tracer_marked_step = bool(value)


def get_tracer_marked_step() -> bool:
    return _tracer_marked_step


class _Capture:
    """One recording: an ``xlanb.profile`` plus the Trace/StepTrace events."""

    def __init__(self, logdir: str, thread: int | None = None):
        self.logdir = str(logdir)
        # JAX's device profiler, unless it would crash here (runtime/libtpu.py); then the
        # trace holds xlanb's own events only, and says so as xlanb.profile does
        safe = libtpu.profiler_safe()
        if not safe:
            warnings.warn("torch_xla.debug.profiler: JAX's device profiler crashes in a "
                          "process where libtpu was loaded for a TPU target without a TPU; "
                          f"the trace in {self.logdir} holds xlanb's host events only, no "
                          "device trace (trace in a process that has not used "
                          "xlanb.compile_for/xlanb.target)", RuntimeWarning, stacklevel=3)
        self.profile = xlanb.profile(device=safe)
        if thread is not None:
            # a detached capture: syncs and phases of the program's thread count as the
            # profiled thread's (its ops stay unrecorded: dispatch modes are per thread)
            self.profile._tid = thread
        self.events: list[tuple] = []  # (name, start, end, thread, args, category)
        self.events_lock = threading.Lock()

    def start(self) -> None:
        self.profile.__enter__()

    def add(self, name, start, end, args, category) -> None:
        with self.events_lock:
            self.events.append((name, start, end, threading.get_ident(), args, category))

    def stop(self) -> str:
        """Stop and write the trace; returns its path."""
        p = self.profile
        p.__exit__(None, None, None)
        try:
            run = time.strftime("%Y_%m_%d_%H_%M_%S")
            out = os.path.join(self.logdir, "plugins", "profile", run)
            os.makedirs(out, exist_ok=True)
            host = socket.gethostname() or "localhost"
            pid = os.getpid()
            events = p.trace_events()
            for name, start, end, tid, args, cat in self.events:
                if end < p.t0:
                    continue
                events.append({"name": name, "cat": cat, "ph": "X",
                               "ts": round((max(start, p.t0) - p.t0) * 1e6, 3),
                               "dur": round((end - max(start, p.t0)) * 1e6, 3),
                               "pid": pid, "tid": tid, "args": args})
            path = os.path.join(out, f"{host}.trace.json.gz")
            with gzip.open(path, "wt") as f:
                json.dump({"traceEvents": events, "displayTimeUnit": "ms",
                           "otherData": {"tool": "xlanb (torch_xla.debug.profiler)",
                                         "wall_s": p.wall}}, f)
            for d, _, files in os.walk(p._jax_dir or ""):  # JAX's XPlane, for XProf
                for fn in files:
                    if fn.endswith(".xplane.pb"):
                        shutil.copyfile(os.path.join(d, fn),
                                        os.path.join(out, f"{host}.xplane.pb"))
            return path
        finally:
            p.close()


def start_trace(log_dir) -> None:
    """Start recording; ``stop_trace()`` writes the trace under ``log_dir``."""
    global _capture
    with _lock:
        if _capture is not None:
            raise RuntimeError("Profile has already been started. Only one profile may be "
                               "run at a time.")
        cap = _Capture(log_dir)
        cap.start()
        _capture = cap


def stop_trace() -> None:
    """Stop recording and write ``log_dir/plugins/profile/<run>/<host>.trace.json.gz``."""
    global _capture
    with _lock:
        cap = _capture
        if cap is None:
            raise RuntimeError("No profile started")
        _capture = None
    cap.stop()


class _Server:
    """What ``start_server`` returns: this process answers ``trace`` requests for it."""

    def __init__(self, port: int):
        self.port = port

    def __repr__(self) -> str:
        return f"<xlanb profiler server on port {self.port}, in-process>"


def start_server(port: int, only_on_master: bool = True):
    """Take profile requests (``trace`` / ``trace_detached``) for ``port`` in this process.
    No socket is opened: a client in another process (TensorBoard's capture button,
    capture_profile.py) gets an error; use ``start_trace``/``stop_trace`` instead."""
    if only_on_master and not _xm.is_master_ordinal():
        return None
    _servers[int(port)] = threading.get_ident()
    return _Server(int(port))


def trace(service_addr: str, logdir: str, duration_ms: int = 1000,
          num_tracing_attempts: int = 3, host_tracer_level: int = 2,
          device_tracer_level: int = 1, delay_ms: int = 0, timeout_s: int = 120,
          interval_s: int = 5) -> None:
    """Record ``duration_ms`` of this process (after ``delay_ms``) for a server started
    here by ``start_server``, and write it under ``logdir``; blocks meanwhile."""
    global _capture
    thread = None
    for addr in str(service_addr).split(","):
        host, _, port = addr.strip().rpartition(":")
        if not port.isdigit() or int(port) not in _servers or not _local(host):
            raise RuntimeError(
                f"{NAME}.trace({service_addr!r}): xlanb's profiler server answers requests "
                "from its own process only (start_server in this program, then trace / "
                "trace_detached here); to profile from outside, call "
                "xp.start_trace(logdir) / xp.stop_trace() in the program")
        thread = _servers[int(port)]
    if delay_ms:
        time.sleep(delay_ms / 1000)
    with _lock:
        if _capture is not None:
            raise RuntimeError("Profile has already been started. Only one profile may be "
                               "run at a time.")
        cap = _Capture(logdir, thread)
        cap.start()
        _capture = cap
    try:
        time.sleep(max(duration_ms, 0) / 1000)
    finally:
        with _lock:
            if _capture is cap:
                _capture = None
        cap.stop()


def _local(host: str) -> bool:
    host = host.strip("[]")
    return host in _LOCAL_HOSTS or host in (socket.gethostname(), socket.getfqdn())


def trace_detached(*args, **kwargs) -> threading.Thread:
    """``trace`` on a background thread (the program goes on meanwhile)."""
    t = threading.Thread(target=trace, args=args, kwargs=kwargs, name="xlanb-xp-trace",
                         daemon=True)
    t.start()
    return t


class Trace:
    """``with xp.Trace("forward"):`` an event of that name in the trace being recorded."""

    _category = "user annotation"

    def __init__(self, name: str, **kwargs):
        self.name = name
        self.kwargs = kwargs
        self._start = 0.0

    def __enter__(self):
        self._start = time.perf_counter()
        return self

    def _record(self) -> None:
        cap = _capture
        if cap is not None:
            args = {k: v if isinstance(v, (int, float, str, bool)) else repr(v)
                    for k, v in self.kwargs.items()}
            cap.add(self.name, self._start, time.perf_counter(), args, self._category)

    def __exit__(self, exc_type, exc, tb):
        self._record()
        return False


class StepTrace(Trace):
    """``with xp.StepTrace("train_step", step_num=i):`` a step event; the pending work is
    synced on exit (``torch_xla.sync()``), inside the event, as torch_xla does."""

    _category = "step annotation"

    def __enter__(self):
        set_tracer_marked_step(True)
        return super().__enter__()

    def __exit__(self, exc_type, exc, tb):
        __debuggerskip__ = True  # IPython's debugger steps over xlanb frames
        try:
            if exc_type is None:
                _xm._sync(f"user sync (xp.StepTrace {self.name!r} exit)")
        finally:
            self._record()
        return False


def trace_me(scope: str):
    """A decorator: each call of the function is a ``Trace(scope)`` event."""
    def decorate(fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with Trace(scope):
                return fn(*args, **kwargs)
        return wrapper
    return decorate
