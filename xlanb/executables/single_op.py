"""Single-op executables: eager mode, op-by-op runs and peeks share one per signature."""
from __future__ import annotations

import threading
import time

import jax

from ..base import metrics
from ..base.dtypes import to_jax_dtype
from ..base.session import session
from ..graph.collectives import parse_collectives
from ..ir.nodes import OpSignature
from ..runtime.jit import lower_jitted
from ..runtime.mesh import common_mesh, on_mesh, place
from ..values.checks import checked
from .compile import Build
from .resident import admit, touch


# Guards the hand-over from a quick executable to its optimized one (executables/background.py):
# the compile thread that finishes the optimized one and op_executable collecting the
# quick one agree here.
tier_lock = threading.Lock()


def op_executable(info: OpSignature):
    """``info``'s single-op executable: cached, loaded from the executable store,
    compiled now, or collected from the background compile ``compile_op_ahead`` started."""
    exe = info.exe
    if exe is not None:
        metrics.counter("OpCacheHit")
        touch(info)
        return exe
    pending = info.compiling
    exe = None
    if pending is not None:
        t0 = time.perf_counter()
        try:
            exe = pending.result()  # an interrupt here keeps the compile for next time
        except Exception:  # compiled again below, so the error is raised on this thread
            info.compiling = None
        finally:
            metrics.record("OpCompileWaitTime", time.perf_counter() - t0)
    if exe is None:
        exe = Build.op(info).executable()
        if pending is None:
            metrics.counter("OpCompile")
    with tier_lock:
        later = info.compiling
        if later is not None and later is not pending:
            exe = later.result()  # the optimized one took the quick one's place meanwhile
        exe = info.exe = checked(exe, info)
        info.compiling = None
    admit(info)
    return exe


def direct_call(exe):
    """The C++ call inside a ``jax.stages.Compiled`` that has run once: calling it skips
    ``Compiled.__call__``'s Python frame on eager's per-op path (the executable itself
    when a JAX version has no such attribute)."""
    return getattr(exe, "_call", None) or exe


# ---------------------------------------------------------------------------------------
# Sharded inputs (xlanb.spmd): one executable per (signature, input shardings)

def run_op_on_arrays(info: OpSignature, arrays: list, scalars, src=None) -> object:
    """Run ``info`` on ``arrays`` (x64 on, as the caller has it): through its
    single-device executable, or, once any tensor is sharded and one of these inputs is,
    through the executable compiled for their shardings; a ``mark_sharding`` constraint
    outside a graph is a ``device_put`` onto its sharding. ``src``: the line that
    recorded it (op by op), for the multi-process check."""
    if info.sharding is not None:
        return place(arrays[0], info.sharding)
    if session.spmd:
        mesh = common_mesh([getattr(a, "sharding", None) for a in arrays])
        if mesh is not None:
            arrays = [on_mesh(a, mesh) for a in arrays]
            exe = sharded_executable(info, arrays, mesh)
            if session.agree is not None:  # several processes: all about to run the same op
                session.agree(exe, info, arrays, src, scalars)
            return exe(*arrays, *scalars)
    return op_executable(info)(*arrays, *scalars)


def sharded_executable(info: OpSignature, arrays: list, mesh):
    """``info`` compiled for the shardings of ``arrays`` (all on ``mesh``): XLA's
    partitioner decides the result's sharding and the collectives. Kept on the info,
    keyed by the input shardings; not written to the executable store."""
    key = tuple(a.sharding for a in arrays)
    table = info.sharded
    if table is None:
        table = info.sharded = {}
    exe = table.get(key)
    if exe is not None:
        metrics.counter("OpCacheHit")
        _count_collectives(exe)
        return exe
    n = info.n_in
    fn = info.fn
    specs = [jax.ShapeDtypeStruct(m.shape, to_jax_dtype(m.dtype), sharding=s)
             for m, s in zip(info.in_metas, key)]
    specs += [jax.ShapeDtypeStruct((), "float64" if k == "f" else "float32", weak_type=True,
                                   sharding=mesh) if k != "key"
              else jax.ShapeDtypeStruct((2,), "uint32", sharding=mesh) for k in info.scalar_specs]
    # not stored: a sharding's devices are this process's own
    exe = Build(info.device, lambda: lower_jitted(lambda *flat: fn(flat[:n], flat[n:]), specs,
                                                  lower_metric="OpLowerTime"),
                metric="OpCompileTime").compile()
    metrics.counter("OpCompile")
    colls = parse_collectives(exe.as_text(), dict(mesh.mesh.shape))
    exe = _Sharded(checked(exe, info), colls)
    table[key] = exe
    admit(info)
    _count_collectives(exe)
    return exe


class _Sharded:
    """A single-op executable for sharded inputs, with the collectives it runs."""
    __slots__ = ("exe", "collectives", "nbytes", "agree")

    def __init__(self, exe, collectives):
        self.agree = None  # what it publishes before a run over several processes
        self.exe = exe
        self.collectives = collectives
        self.nbytes = sum(c.bytes for c in collectives)

    def __call__(self, *args):
        return self.exe(*args)


def _count_collectives(exe) -> None:
    if exe.collectives:
        metrics.counter("CollectiveOps", len(exe.collectives))
        metrics.counter("CollectiveBytes", exe.nbytes)
