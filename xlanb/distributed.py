"""``xlanb.distributed``: several processes, one program (SPMD), through
``jax.distributed``.

    xlanb.distributed.initialize()      # in each process, before anything else runs
    mesh = xlanb.spmd.Mesh(range(xlanb.distributed.global_device_count()), ...)

After ``initialize``, ``xla:N`` is this process's N-th device, a mesh's device ids index
every process's devices (JAX's global order), and a sharded tensor is one global array
whose shards live in several processes. ``python -m xlanb.launch --nproc N script.py``
starts N local processes with the environment ``initialize()`` reads.

Agreement. An SPMD program must run the same multi-process graphs in the same order in
every process; one that takes another branch gives a wrong answer or a hang. So, before
each run whose inputs span more than one process (a lazy graph, an eager op, an op-by-op
node, a replay, a host read that gathers), each process publishes what it is about to
run (sequence number, structural hash, collectives, a digest of its lifted Python numbers
and random keys, the user's line) through ``jax.distributed``'s key-value store and
reads the others'. On a mismatch every process raises ``DivergenceError`` before anything
runs, naming the odd process(es), the first op where the graphs differ (the recompile
differ, graph/explain.py, in words for processes) or the first Python number that
differs, with its value in each process, and each side's line. A process that ends
with an uncaught exception says so: the others raise ``ProcessCrashError`` with its
error and line at their next multi-process run.
A process that has not published within ``XLANB_DIST_TIMEOUT`` seconds is asked where
its Python is (a watcher thread of its own answers; it costs nothing until asked); one
compiling or busy in xlanb's, JAX's or torch's code is waited for again, at most
``BUSY_WAITS`` times; then every process stops with the report (``MissingProcessError``). ``XLANB_DIST_CHECK=0``
turns the check off (and the recorder: SIGUSR1 then prints the threads' stacks alone).
Each process keeps its last runs (``recent()``): printed with either error and on
SIGUSR1.
"""
from __future__ import annotations

import atexit
import faulthandler
import hashlib
import json
import os
import signal
import struct
import sys
import threading
import time
import traceback
from collections import deque
from typing import NamedTuple

import jax
import numpy as np
import torch

from .base.config import config, launch_settings
from .base.formats import format_hash, format_location
from .base.frames import PACKAGE_DIR, SourceLoc, format_loc, is_internal_file, user_frame
from .base.session import mode_state, session
from .execute.graphs import CompiledGraph
from .executables.single_op import _Sharded
from .graph.explain import explain
from .graph.summary import _LIFTED, GraphSummary, OpRecord, aval_text
from .ir.nodes import info_digest
from .ops.leaves import from_array
from .runtime import devices as _devices
from .runtime.mesh import as_mesh, named_sharding, sharding_text
from .ir.templates import format_call
from .ir.tensor import XlaTensor

__all__ = ["initialize", "is_initialized", "process_index", "process_count",
           "global_device_count", "local_device_count", "from_process_local", "is_main",
           "DivergenceError", "MissingProcessError", "ProcessCrashError", "RunRecord", "recent",
           "format_recent"]

ENV_COORDINATOR = "XLANB_COORDINATOR_ADDRESS"
ENV_NUM_PROCESSES = "XLANB_NUM_PROCESSES"
ENV_PROCESS_ID = "XLANB_PROCESS_ID"

_state = {"initialized": False}


def initialize(coordinator_address: str | None = None, num_processes: int | None = None,
               process_id: int | None = None, local_device_ids=None) -> None:
    """``jax.distributed.initialize``, with xlanb's defaults: arguments not given come
    from ``XLANB_COORDINATOR_ADDRESS`` / ``XLANB_NUM_PROCESSES`` / ``XLANB_PROCESS_ID``
    (which ``python -m xlanb.launch`` sets), and on the CPU, collectives between
    processes use gloo (``jax_cpu_collectives_implementation``). Call it before any
    tensor is made on the xla device."""
    if _state["initialized"]:
        return
    launched = launch_settings()
    coordinator_address = coordinator_address or launched.coordinator
    if num_processes is None:
        num_processes = launched.num_processes
    if process_id is None:
        process_id = launched.process_id
    if num_processes is not None and process_id is not None and not 0 <= process_id < num_processes:
        # JAX's own error names neither argument nor the variables they came from
        raise ValueError(f"xlanb.distributed.initialize: process_id={process_id} is not one of "
                         f"the {num_processes} processes (0 to {num_processes - 1}; from "
                         f"{ENV_PROCESS_ID} and {ENV_NUM_PROCESSES} when not given)")
    if _devices.jax_devices.cache_info().currsize:
        raise RuntimeError("xlanb.distributed.initialize must run before xlanb uses a device "
                           "(call it first thing in the program)")
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=coordinator_address,
                               num_processes=num_processes, process_id=process_id,
                               local_device_ids=local_device_ids)
    _state["initialized"] = True
    if jax.process_count() > 1:
        _install()


def is_initialized() -> bool:
    return _state["initialized"]


def process_index() -> int:
    return jax.process_index()


def process_count() -> int:
    return jax.process_count()


def is_main() -> bool:
    """Whether this is process 0: the one that prints what every process holds alike."""
    return jax.process_index() == 0


def global_device_count() -> int:
    return len(_devices.global_devices())


def local_device_count() -> int:
    return len(_devices.jax_devices())


def from_process_local(local: torch.Tensor, mesh, partition_spec) -> XlaTensor:
    """A global tensor sharded over ``mesh`` from each process's own piece of it
    (``jax.make_array_from_process_local_data``): ``local`` is this process's part of
    the global tensor along the sharded dimensions (a data loader's local batch)."""
    from .base.dtypes import tensor_to_numpy
    mesh = as_mesh(mesh)
    arr = tensor_to_numpy(local.detach().cpu())
    # the global shape: local pieces stacked along each dimension the processes split
    probe = named_sharding(mesh, partition_spec, _global_shape(arr.shape, mesh, partition_spec))
    with jax.enable_x64(True):
        data = jax.make_array_from_process_local_data(probe, np.ascontiguousarray(arr))
    session.spmd = True
    return from_array(data, 0)


def _global_shape(local_shape, mesh, spec) -> tuple:
    """How many processes split each dimension, from which processes hold which devices."""
    shape = list(local_shape)
    jm = mesh.jax_mesh
    for dim, entry in enumerate(tuple(spec)):
        if entry is None:
            continue
        axes = entry if isinstance(entry, tuple) else (entry,)
        axes = [mesh.axis_names[a] if isinstance(a, int) else a for a in axes]
        # processes along these axes: distinct process ids over the sub-mesh they span
        others = [a for a in jm.axis_names if a not in axes]
        devs = jm.devices.transpose([jm.axis_names.index(a) for a in axes + others])
        line = devs.reshape(int(np.prod([jm.shape[a] for a in axes])), -1)[:, 0]
        procs = len({d.process_index for d in line})
        shape[dim] *= procs
    return tuple(shape)


# ---------------------------------------------------------------------------------------
# Agreement before every multi-process run (issue 33)

class DivergenceError(RuntimeError):
    """The processes of one SPMD program were about to run different things over the
    same devices. Raised in every process, before anything ran. ``processes``: the odd
    ones; ``seq``: which multi-process run (counted from 0 in each process)."""

    def __init__(self, message: str, processes=(), seq: int = -1):
        super().__init__(message)
        self.processes = tuple(processes)
        self.seq = seq


class MissingProcessError(DivergenceError):
    """A process did not reach a multi-process run within ``XLANB_DIST_TIMEOUT``
    seconds: the report names it, its last multi-process run and where its Python was."""


class ProcessCrashError(DivergenceError):
    """Another process ended with an uncaught exception (its type, message and line are
    in the message) where this one was about to run with it; ``processes``: those that
    crashed."""


class RunRecord(NamedTuple):
    """One multi-process run as this process's flight recorder keeps it."""
    seq: int
    kind: str         # graph | op | gather | exit
    hash: str         # the structural hash every process must share
    collectives: str  # what it runs across devices ("1 all-reduce, 8 B")
    what: str         # "graph of 12 ops", "aten::mul"
    line: str         # the user's line that ran it
    time: float       # time.time() when it was checked
    status: str       # agreed | diverged | timed out | checking

    def __str__(self) -> str:
        stamp = time.strftime("%H:%M:%S", time.localtime(self.time)) + f".{int(self.time * 1000) % 1000:03d}"
        colls = f"; {self.collectives}" if self.collectives else ""
        return (f"#{self.seq} {stamp} {self.what} {format_hash(self.hash)}{colls} at "
                f"{self.line or '?'} [{self.status}]")


def recent() -> list[RunRecord]:
    """This process's last multi-process runs (``XLANB_DIST_RECENT``, 64 by default),
    oldest first; empty in a program of one process or with the check off."""
    a = session.agree
    return list(a.recent) if a is not None else []


def format_recent(title: str = "") -> str:
    a = session.agree
    me = a.me if a is not None else jax.process_index()
    runs = recent()
    head = title or f"xlanb: process {me}'s last multi-process runs (xlanb.distributed.recent())"
    return "\n".join([head + ":"] + [f"  {r}" for r in runs] if runs else [head + ": none"])


def _kv():
    from .runtime.jax_compat import distributed_client
    return distributed_client()


def _timed_out(e: Exception) -> bool:
    return "DEADLINE_EXCEEDED" in str(e)


def _digest(text: str) -> str:
    """The same in every process (Python's own ``hash`` of a str is not)."""
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


def _scalars_digest(scalars, keys: tuple = ()) -> str:
    """A run's lifted Python numbers and random keys as one short text, the same in
    every process that has the same values ("" for none): a learning rate that differs
    between processes is another program, though the graphs are the same. ``keys``:
    where the random keys (uint32[2]) are, known from the graph's structure."""
    if not scalars:
        return ""
    h = hashlib.blake2b(digest_size=8)
    if keys:  # the keys' bytes apart, the numbers packed at once (a loop over every
        nums = list(scalars)  # value costs 0.1 ms in a BERT step's 575)
        for p in keys:
            h.update(np.asarray(nums[p]).tobytes())
            nums[p] = 0.0
    else:
        nums = scalars
    try:
        h.update(struct.pack(f"{len(nums)}d", *nums))
    except (struct.error, TypeError):  # a complex number, say: slower, as rare
        for v in nums:
            h.update(np.asarray(v).tobytes())
    return h.hexdigest()


def _plain(v):
    """A lifted value as JSON takes it (published only when processes disagree)."""
    if hasattr(v, "tolist"):
        return v.tolist()
    return v if isinstance(v, (bool, int, float)) else repr(v)


def _agreed(entry) -> tuple:
    """What every process's entry for one run must share: its kind, structural hash,
    collectives and the digest of its lifted numbers."""
    return tuple(entry[1:4]) + (entry[7] if len(entry) > 7 else "",)


def _number_text(v, kind: str) -> str:
    """A lifted number as the user wrote it: one that passes as float32 (``"f32"``, the
    op computes in float32 or narrower) in float32's shortest form (0.1, not
    0.10000000149011612)."""
    if kind == "f32" and isinstance(v, float):
        return str(np.float32(v))
    return repr(v)


def _ended(entry) -> bool:
    return entry[1] in ("exit", "crash")


def _scalars_diff(summary, st: _Static, a, b, pa: int, pb: int) -> str:
    """The first lifted number (or random key) whose value differs between processes
    ``pa`` and ``pb``, with its op and line, on ``summary`` (process ``pa``'s)."""
    if a is None or b is None or len(a) != len(b) or len(a) != len(st.owners):
        return "the same graph, but the values of its Python numbers differ"
    # repr: NaN is NaN in both
    differ = [i for i, (x, y) in enumerate(zip(a, b)) if repr(x) != repr(y)]
    if not differ:
        return "the same graph, but the values of its Python numbers differ"
    i = differ[0]
    op = summary.ops[st.owners[i]]
    where = f" at {format_loc(op.src)}" if op.src else ""
    if st.kinds[i] == "key":
        text = (f"the random key of {op.name}{where}: {a[i]} in process {pa}, {b[i]} in "
                f"process {pb} (is torch.manual_seed the same in every process?)")
    else:
        text = (f"the Python number of {op.name}{where}: {_number_text(a[i], st.kinds[i])} in "
                f"process {pa}, {_number_text(b[i], st.kinds[i])} in process {pb}")
    more = len(differ) - 1
    return text + (f"; {more} more of its {len(a)} lifted values differ" if more else "")


def _spans_processes(devices) -> bool:
    return len({d.process_index for d in devices}) > 1


def _colls_text(colls) -> str:
    if not colls:
        return ""
    counts: dict = {}
    for c in colls:
        counts[c.kind] = counts.get(c.kind, 0) + 1
    total = sum(c.bytes for c in colls)
    # the groups and shapes too: the same kinds over other devices are another program
    key = _digest(repr([(c.kind, c.shape, c.groups) for c in colls]))[:8]
    return ", ".join(f"{n} {k}" for k, n in counts.items()) + f", {total} B #{key}"


_XLANB_DIR = PACKAGE_DIR + os.sep
_LIBS = tuple(os.path.dirname(m.__file__) + os.sep for m in (jax, np))
# where a thread's innermost frame is xlanb's, JAX's or torch's own work
_THIS_FILE = os.path.abspath(__file__)
_WORK_DIRS = (_XLANB_DIR, _LIBS[0], os.path.dirname(torch.__file__) + os.sep)
_WORK_OWNERS = ("xlanb", "JAX", "torch")
# a peer that has not arrived but is busy (compiling, or running in xlanb's, JAX's or
# torch's own code) is waited for again, XLANB_DIST_TIMEOUT each time, at most this often:
# a slow compile or trace ends, a user's loop around torch's functions may not
BUSY_WAITS = 3


def _short(fs) -> str:
    return format_location(os.path.basename(fs.filename), fs.lineno, fs.name)


def _is_user(fs) -> bool:
    name = fs.filename
    return not (is_internal_file(name) or name.startswith(_LIBS) or name.startswith("<frozen"))


def _where_now(frame, thread_id: int | None = None) -> dict:
    """Where the main thread's Python is: its innermost user line, the innermost frame,
    whether it is compiling or otherwise busy in xlanb's or JAX's own work, and the last
    frames of its stack."""
    if frame is None:
        return {"at": "?", "inner": "", "compiling": False, "working": False, "stack": []}
    stack = traceback.extract_stack(frame)
    user = next((fs for fs in reversed(stack) if _is_user(fs)), None)
    # inside one of xlanb's compiles (compile_lowered, _compile_graph, compile_op...)
    compiling = any(fs.filename.startswith(_XLANB_DIR) and "compile" in fs.name for fs in stack)
    working = bool(stack) and _working(stack[-1], thread_id)
    owner = next((o for d, o in zip(_WORK_DIRS, _WORK_OWNERS)
                  if stack and stack[-1].filename.startswith(d)), "")
    return {"at": _short(user) if user else "?", "inner": _short(stack[-1]) if stack else "",
            "compiling": compiling, "working": working, "owner": owner if working else "",
            "stack": [_short(fs) for fs in stack[-8:]]}


def _doing(w: dict, at: bool = True) -> str:
    """What a busy peer does, from its watcher's answer: "at train.py:7 step, running
    torch's own code (functional.py:2910 layer_norm)"."""
    doing = ("compiling" if w.get("compiling") else
             f"running {w.get('owner') or 'its libraries'}'s own code")
    inner = f" ({w['inner']})" if w.get("inner") and w["inner"] != w["at"] else ""
    return (f"at {w['at']}, " if at else "") + doing + inner


def _working(inner, thread_id: int | None) -> bool:
    """The thread is running (its CPU time grows) inside xlanb's or JAX's own code:
    tracing, lowering or recording a large graph on a loaded machine, which is not a
    process that stopped arriving. Waits of this module's own are not work."""
    name = inner.filename
    if not name.startswith(_WORK_DIRS) or name == _THIS_FILE:
        return False
    try:
        clock = time.pthread_getcpuclockid(thread_id)
        before = time.clock_gettime(clock)
        time.sleep(0.2)
        return time.clock_gettime(clock) - before > 0.02
    except (AttributeError, OSError, TypeError):  # no per-thread clock here
        return False


def _summary_json(s: GraphSummary | None):
    if s is None:
        return None
    return [list(s.inputs), [[o.name, o.aval, o.call, list(o.src) if o.src else None, o.scope,
                              list(o.ins), o.static] for o in s.ops],
            list(s.outputs), [list(x) for x in s.shardings]]


def _summary_of(j) -> GraphSummary | None:
    if j is None:
        return None
    inputs, ops, outputs, shardings = j
    return GraphSummary(tuple(inputs), tuple(
        OpRecord(n, a, c, SourceLoc(*src) if src else None, sc, tuple(ins), st)
        for n, a, c, src, sc, ins, st in ops), tuple(outputs), tuple(tuple(x) for x in shardings))


class _Static(NamedTuple):
    """What one executable publishes every time it runs (computed once, kept on it)."""
    kind: str
    hash: str
    colls: str
    what: str
    summary: object  # a GraphSummary, for the differ when processes disagree
    owners: tuple = ()  # per lifted scalar, the position of its op in ``summary.ops``
    kinds: tuple = ()   # per lifted scalar: "f" or "f32" (a Python number), or "key" (a random key)
    keys: tuple = ()    # the positions of the random keys among them


_ABORT = "xlanb/agree/abort"


class _Agreement:
    """``session.agree``: installed by ``initialize`` in a program of several processes."""

    def __init__(self) -> None:
        self.client = _kv()
        self.me = jax.process_index()
        self.n = jax.process_count()
        self.peers = [j for j in range(self.n) if j != self.me]
        self.seq = 0
        self.recent: deque = deque(maxlen=config.dist_recent)
        self.last: dict = {}  # peer -> its payload of the last run that agreed
        self.swept = 0  # process 0: the store's keys of blocks of 64 runs before this are gone
        self.lock = threading.RLock()
        self.stopping = False
        self.broken = False
        self.main_ident = threading.main_thread().ident
        self.crash = None  # (error, line) of the uncaught exception that ends the program

    # -- the hook ------------------------------------------------------------------
    def __call__(self, what, where=None, arrays=None, src=None, scalars=()) -> None:
        """Before a run: ``what`` is a CompiledGraph (``where``: its sync's line), a
        sharded single-op executable (``where``: its OpSignature, ``arrays``: its inputs,
        ``src``: an op-by-op node's line) or an array a host read gathers. ``scalars``:
        the run's lifted Python numbers and random keys, whose values must agree too."""
        if not config.dist_check:
            return
        if isinstance(what, CompiledGraph):
            st = what.__dict__.get("_agree")
            if st is None:
                st = what.__dict__["_agree"] = self._graph_static(what)
            line = where
        elif isinstance(what, _Sharded):
            st = what.agree
            if st is None:
                st = what.agree = self._op_static(what, where, arrays)
            line = src
        else:  # a host read that gathers a global array from every process
            if getattr(what, "is_fully_addressable", True):
                return
            st = self._gather_static(what)
            line = None
        if st is False:
            return  # every device it runs on is this process's
        if line is None:
            line = user_frame(1)
        with self.lock:
            self._exchange(st, line, scalars)

    def _graph_static(self, rec):
        low = rec.lowering
        if low.mesh is None or not _spans_processes(low.mesh.device_set):
            return False
        steps = low.recipe[0]
        owners = tuple(i for i, (info, _) in enumerate(steps) for _ in info.scalar_specs)
        kinds = low.scalar_kinds
        return _Static("graph", rec.hash_full, _colls_text(rec.collectives),
                       f"graph of {rec.n_nodes} ops", rec.summary, owners, kinds,
                       tuple(i for i, k in enumerate(kinds) if k == "key"))

    def _op_static(self, exe, info, arrays):
        devices = set()
        for a in arrays:
            devices |= set(getattr(a, "sharding", None).device_set) if hasattr(a, "sharding") else set()
        if not _spans_processes(devices):
            return False
        shardings = [sharding_text(a.sharding) for a in arrays]
        h = info_digest(info).hex() + "-" + _digest(repr(shardings))[:8]
        names = [f"%{i}" for i in range(info.n_in)]
        call = format_call(info, names, [_LIFTED] * len(info.scalar_specs))
        metas = info.in_metas or ()
        summary = GraphSummary(tuple(aval_text(m) for m in metas),
                               (OpRecord(info.name, aval_text(info.out), call, None, "",
                                         tuple(range(len(metas))), call),),
                               (len(metas),), tuple(enumerate(shardings)))
        kinds = tuple(info.scalar_specs)
        return _Static("op", h, _colls_text(exe.collectives), info.name, summary,
                       (0,) * len(kinds), kinds, tuple(i for i, k in enumerate(kinds) if k == "key"))

    def _gather_static(self, arr):
        text = f"{arr.dtype}{list(arr.shape)} {sharding_text(arr.sharding)}"
        summary = GraphSummary((text,), (OpRecord("xlanb::gather", text, "%0", None, "", (0,), "%0"),),
                               (1,), ())
        return _Static("gather", _digest(text), "",
                       f"host read of {arr.dtype}{list(arr.shape)}", summary)

    # -- one exchange ----------------------------------------------------------------
    def _exchange(self, st: _Static, loc, scalars=()) -> None:
        line = format_loc(loc)
        seq = self.seq
        mine = [seq, st.kind, st.hash, st.colls, st.what, line, mode_state().mode,
                _scalars_digest(scalars, st.keys)]
        prefix = f"xlanb/agree/{seq >> 6}/{seq}/"
        c = self.client
        c.key_value_set(prefix + str(self.me), json.dumps(mine))
        self.seq = seq + 1
        rec = RunRecord(seq, st.kind, st.hash, st.colls, st.what, line, time.time(), "checking")
        self.recent.append(rec)
        got = {self.me: mine}
        for j in self.peers:
            got[j] = json.loads(self._wait(prefix + str(j), j, seq, mine))
        if any(_agreed(got[j]) != _agreed(mine) for j in self.peers):
            self.recent[-1] = rec._replace(status="diverged")
            self._diverged(seq, st, got, loc, scalars)
        self.recent[-1] = rec._replace(status="agreed")
        for j in self.peers:
            self.last[j] = got[j]
        if self.me == 0 and (seq >> 6) - 2 >= self.swept:
            # everyone is past run seq-1, so every key two blocks back was read (the
            # entries, and the summaries a divergence published). Every block once, even
            # when the run that would have swept it diverged
            for block in range(self.swept, (seq >> 6) - 1):
                c.key_value_delete(f"xlanb/agree/{block}/")
            self.swept = (seq >> 6) - 1

    def _wait(self, key: str, j: int, seq: int, mine) -> str:
        """Peer ``j``'s entry for run ``seq``; on a timeout, the report (and the stop)."""
        c = self.client
        step = min(2.0, config.dist_timeout)
        deadline = time.monotonic() + config.dist_timeout
        busy_waits = 0
        while True:
            left = deadline - time.monotonic()
            try:
                return c.blocking_key_value_get(key, max(1, int(min(step, left) * 1000)))
            except Exception as e:
                if not _timed_out(e):
                    raise
            abort = self._get(_ABORT)
            if abort is not None:  # another process timed out waiting: everyone stops
                self._raise_missing(abort, seq)
            if time.monotonic() < deadline:
                continue
            missing = [k for k in self.peers
                       if k == j or self._get(key.rpartition("/")[0] + f"/{k}") is None]
            wheres = {k: self._ask_where(k) for k in missing}
            busy = {k: w for k, w in wheres.items() if w.get("compiling") or w.get("working")}
            if busy and busy_waits < BUSY_WAITS:
                # a slow first compile of the same graph, or a slow trace or lowering on a
                # loaded machine: not a divergence; wait again (not for ever: the same
                # looks hold for a user's loop around torch's own functions)
                busy_waits += 1
                names = ", ".join(f"process {k} ({_doing(w)})" for k, w in busy.items())
                print(f"xlanb: multi-process run #{seq}: still waiting for {names}; waiting "
                      f"another {config.dist_timeout:g} s ({busy_waits} of at most {BUSY_WAITS} "
                      "such waits)", file=sys.stderr, flush=True)
                deadline = time.monotonic() + config.dist_timeout
                continue
            report = self._missing_report(seq, mine, missing, wheres, busy_waits)
            try:
                c.key_value_set(_ABORT, report)
            except Exception:  # another waiter reported first: one report for everyone
                report = self._get(_ABORT) or report
            for k in missing:
                self._send(k, "abort")
            # this process may hold jax's coordination service: were it to end first, the
            # others' clients would abort before their watchers print why they stop
            end = time.monotonic() + 10
            for k in missing:
                try:
                    c.blocking_key_value_get(f"xlanb/stopped/{k}",
                                             max(1, int((end - time.monotonic()) * 1000)))
                except Exception:
                    pass
            self._raise_missing(report, seq, missing)

    def _get(self, key: str):
        try:
            return self.client.key_value_try_get(key)
        except Exception:  # not there (NOT_FOUND)
            return None

    def _raise_missing(self, report: str, seq: int, missing=()):
        self.broken = True  # a peer was stopped: jax's own shutdown could not complete
        if self.recent and self.recent[-1].seq == seq:
            self.recent[-1] = self.recent[-1]._replace(status="timed out")
        print(format_recent(), file=sys.stderr, flush=True)
        raise MissingProcessError(report, missing, seq)

    def _missing_report(self, seq, mine, missing, wheres, busy_waits) -> str:
        names = ", ".join(map(str, missing))
        s = "es" if len(missing) > 1 else ""
        lines = [f"process{s} {names} did not reach multi-process run #{seq} within "
                 f"{config.dist_timeout:g} s (XLANB_DIST_TIMEOUT)"
                 + (f" and {busy_waits} more such wait{'s' * (busy_waits > 1)} while "
                    f"{'they were' if s else 'it was'} busy" if busy_waits else "") + ":",
                 f"  process {self.me} waits there to run: {mine[4]} {format_hash(mine[2])} at {mine[5] or '?'}"]
        for k in missing:
            last = self.last.get(k)
            lines.append(f"  process {k}'s last multi-process run: " + (
                f"#{last[0]} {last[4]} {format_hash(last[2])} at {last[5] or '?'}" if last else "none yet"))
            w = wheres[k]
            if w.get("at") is None:
                lines.append(f"  process {k} did not say where it is (it crashed, or its "
                             "Python is inside native code that holds the interpreter lock)")
            else:
                lines.append(f"  process {k} is now at {w['at']}" + (
                    f" ({_doing(w, at=False)})" if w.get("compiling") or w.get("working") else
                    f" (innermost: {w['inner']})" if w.get("inner") and w["inner"] != w["at"] else ""))
        lines.append("Every process stops now. A process that only runs slower may need a "
                     "larger XLANB_DIST_TIMEOUT.")
        return "\n".join(lines)

    def _diverged(self, seq: int, st: _Static, got: dict, loc, scalars=()):
        c = self.client
        summary = st.summary
        if st.kind != "graph" and summary is not None:  # one op: its line is this run's
            summary = summary._replace(ops=tuple(o._replace(src=loc) for o in summary.ops))
        groups: dict = {}
        for j in sorted(got):
            groups.setdefault(_agreed(got[j]), []).append(j)
        # the majority is right, among processes that go on; on a tie, the group of the
        # lowest process (process 0)
        ref_group = max(groups.values(), key=lambda g: (not _ended(got[g[0]]), len(g), -g[0]))
        ref = ref_group[0]
        odd = sorted(j for j in got if j not in ref_group)
        # under the run's block: deleted with it (_exchange), at no cost of its own.
        # The scalars' values too: only now are they worth sending
        sum_key = f"xlanb/agree/{seq >> 6}/{seq}/sum/"
        try:
            c.key_value_set(sum_key + str(self.me),
                            json.dumps([_summary_json(summary), [_plain(v) for v in scalars]]))
        except Exception:
            pass
        summaries = {self.me: summary}
        values = {self.me: [_plain(v) for v in scalars]}
        for j in [ref] + odd:
            if j in summaries or _ended(got[j]):
                continue
            try:
                sj, vj = json.loads(c.blocking_key_value_get(sum_key + str(j), 10_000))
                summaries[j], values[j] = _summary_of(sj), vj
            except Exception:
                summaries[j] = values[j] = None
        s = "es" if len(odd) > 1 else ""
        who = ", ".join(map(str, odd))
        others = [j for j in ref_group if j != ref]
        crashed = [j for j in odd if got[j][1] == "crash"]
        same = all(got[j][1:4] == got[ref][1:4] for j in odd)  # only the numbers differ
        thing = "graph" if st.kind == "graph" else "op" if st.kind == "op" else "read"
        if crashed and len(crashed) == len(odd):
            how = f"crashed where process {ref} goes on"
        elif all(_ended(got[j]) for j in odd):
            how = f"ended {'their' if s else 'its'} program where process {ref} goes on"
        elif same:
            how = f"would run the same {thing} as process {ref} with other Python numbers"
        else:
            how = f"would run something else than process {ref}"
        lines = [f"the processes disagree about multi-process run #{seq}: process{s} {who} {how}"
                 + (f" (and {', '.join(map(str, others))}, which agree with it)" if others else "")
                 + ":"]
        for j in [ref] + odd:
            e = got[j]
            if e[1] == "exit":
                lines.append(f"  process {j}: ended its program ({e[4]})")
            elif e[1] == "crash":
                lines.append(f"  process {j}: crashed with {e[4]} at {e[5] or '?'} "
                             f"(after {e[0]} multi-process runs)")
            else:
                colls = f" ({e[3].split(' #')[0]})" if e[3] else " (no collectives)"
                lines.append(f"  process {j}: {e[4]} {format_hash(e[2])}{colls} at {e[5] or '?'} [{e[6]}]")
        for j in odd:
            a, b = summaries.get(ref), summaries.get(j)
            if a is None or b is None:
                continue
            if got[j][1:4] == got[ref][1:4]:
                diff = _scalars_diff(a, st, values.get(ref), values.get(j), ref, j)
            elif got[j][1:3] == got[ref][1:3]:
                diff = "the same graph, but its collectives differ: " + \
                    f"{got[ref][3].split(' #')[0] or 'none'} -> {got[j][3].split(' #')[0] or 'none'}"
            else:
                diff = explain(a, b, sides=(f"process {ref}", f"process {j}"))
            lines.append(f"  process {j} against process {ref}: {diff}")
        lines.append("Nothing ran: every process raised this error before the run (each "
                     "one's last runs: xlanb.distributed.recent(), printed to stderr).")
        print(format_recent(), file=sys.stderr, flush=True)
        error = ProcessCrashError if crashed else DivergenceError
        raise error("\n".join(lines), odd, seq)

    # -- where is a process: its watcher answers ------------------------------------
    def _send(self, k: int, msg: str) -> int:
        n = self.client.key_value_increment(f"xlanb/ctlseq/{k}", 1) - 1
        self.client.key_value_set(f"xlanb/ctl/{k}/{n}", msg)
        return n

    def _ask_where(self, k: int) -> dict:
        # (not get_live_nodes: it waits for every process named to call it too)
        try:
            n = self._send(k, "where")
            return json.loads(self.client.blocking_key_value_get(f"xlanb/where/{k}/{n}", 5_000))
        except Exception:
            return {"at": None}

    def watch(self) -> None:
        """The watcher thread: blocked in the store (no cost) until another process asks
        where this one is, or tells it to stop."""
        c = self.client
        n = 0
        while not self.stopping:
            try:
                msg = c.blocking_key_value_get(f"xlanb/ctl/{self.me}/{n}", 600_000)
            except Exception as e:
                if _timed_out(e):
                    continue
                return  # the store is gone: the program is ending
            n += 1
            if msg == "stop":
                return
            if msg == "where":
                frame = sys._current_frames().get(self.main_ident)
                try:
                    c.key_value_set(f"xlanb/where/{self.me}/{n - 1}", json.dumps(_where_now(frame, self.main_ident)))
                except Exception:
                    pass
                del frame
            elif msg == "abort":
                try:
                    report = c.blocking_key_value_get(_ABORT, 5_000)
                except Exception:
                    report = "another process stopped the program"
                print(f"{format_recent()}\nxlanb: process {self.me} stops: another process "
                      f"waited for it in vain.\n{report}", file=sys.stderr, flush=True)
                try:
                    c.key_value_set(f"xlanb/stopped/{self.me}", "1")
                except Exception:
                    pass
                os._exit(1)

    def at_exit(self) -> None:
        """Say so to processes that wait for this one, then stop the watcher."""
        self.stopping = True
        if self.broken:
            # jax's client would wait (minutes) at exit for the processes that were
            # stopped; the report is out already
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(1)
        try:
            seq = self.seq
            if self.crash is not None:  # the others say it crashed, with what and where
                end = [seq, "crash", "", "", *self.crash, "", ""]
            else:
                end = [seq, "exit", "", "", f"after {seq} multi-process runs", "", "", ""]
            self.client.key_value_set(f"xlanb/agree/{seq >> 6}/{seq}/{self.me}", json.dumps(end))
        except Exception:
            pass
        try:
            self._send(self.me, "stop")
        except Exception:
            pass


def _crash_of(exc: BaseException) -> tuple:
    """``("ZeroDivisionError: division by zero", "train.py:12 step")``: an uncaught
    exception and the innermost line of the user's in its traceback."""
    first = (str(exc).strip().splitlines() or [""])[0]
    what = type(exc).__name__ + (f": {first[:300]}" if first else "")
    tb = traceback.extract_tb(exc.__traceback__)
    user = next((fs for fs in reversed(tb) if _is_user(fs)), tb[-1] if tb else None)
    return what, (format_loc(SourceLoc(user.filename, user.lineno, user.name)) if user else "")


def _note_crash(agree: _Agreement, previous):
    """``sys.excepthook``: notes the exception that ends the program, for ``at_exit``."""
    def hook(tp, value, tb):
        try:
            agree.crash = _crash_of(value)
        except Exception:  # never in the way of the traceback
            pass
        previous(tp, value, tb)
    return hook


def _on_sigusr1(signum, frame) -> None:
    print(format_recent(), file=sys.stderr, flush=True)


def _install() -> None:
    """Several processes: the agreement check and its watcher (unless
    ``XLANB_DIST_CHECK=0``), and the recorder's signal (always: ``python -m xlanb.launch``
    passes SIGUSR1 to every process, and a process without the handler would die of it)."""
    if config.dist_check and session.agree is None:
        agree = _Agreement()
        threading.Thread(target=agree.watch, name="xlanb-dist-watcher", daemon=True).start()
        atexit.register(agree.at_exit)  # before jax's client goes (atexit runs last-in first)
        sys.excepthook = _note_crash(agree, sys.excepthook)
        session.agree = agree
    # not over the user's own handler. Ignored is not the user's: the launcher starts its
    # children so, lest a SIGUSR1 kill one before this runs
    if threading.current_thread() is threading.main_thread() and \
            signal.getsignal(signal.SIGUSR1) in (signal.SIG_DFL, signal.SIG_IGN, None):
        signal.signal(signal.SIGUSR1, _on_sigusr1)
        # every thread's stack at once, even while the main thread is inside native code
        # (then the recorder follows when it returns to Python)
        faulthandler.register(signal.SIGUSR1, all_threads=True, chain=True)
