"""Single-op executables: eager mode, op-by-op runs and peeks share one per signature."""
from __future__ import annotations

import time

import jax

from ..base import metrics
from ..base.dtypes import to_jax_dtype
from ..base.session import session
from ..graph.collectives import parse_collectives
from ..ir.nodes import OpSignature
from ..runtime.jit import later_is_held, lower_jitted
from ..runtime.mesh import common_mesh, on_mesh, place
from ..values.checks import checked
from .compile import Build
from .resident import admit, touch


# A quick single-op executable (one someone waited for) runs for its first two uses; at
# its third, its optimized one (compiling since, ``background.start_prepared``) takes its
# place, waited for if need be, as a lazy graph's does (execute/graphs.finish_tier_up).
# At a fixed use, not when ready: the tiers round differently (XLA's defaults contract a
# multiply-add into an FMA), so an op's values must not depend on how quick the compile
# was.
TIER_UP_USE = 3


def op_executable(info: OpSignature):
    """``info``'s single-op executable: cached, loaded from the executable store,
    compiled now, or collected from the background compile ``compile_op_ahead`` started."""
    exe = info.exe
    if exe is not None:
        metrics.counter("OpCacheHit")
        touch(info)
        if info.tiering is not None:
            exe = _at_a_fixed_use(info, exe)
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
        exe = Build.op(info).executable()  # the optimized one: nothing to tier up to
        info.tiering = None
        if pending is None:
            metrics.counter("OpCompile")
    exe = info.exe = checked(exe, info)
    info.compiling = None
    info.quick_uses = 1
    admit(info)
    return exe


def _at_a_fixed_use(info: OpSignature, exe):
    """The quick ``exe`` for its first uses; from the ``TIER_UP_USE``-th, the optimized
    one. Not while a look holds back the compile threads' later work (``later_held``): it
    would wait on itself; the quick one runs once more."""
    info.quick_uses += 1
    better = info.tiering
    if info.quick_uses < TIER_UP_USE or better is None or (
            not better.done() and later_is_held()):
        return exe
    info.tiering = None
    t0 = time.perf_counter()
    try:
        optimized = better.result()
    except Exception:  # noqa: BLE001 - a failed optimized compile: the quick one stays
        return exe
    finally:
        metrics.record("OpCompileWaitTime", time.perf_counter() - t0)
    exe = info.exe = checked(optimized, info)
    info.call = None
    metrics.counter("OpTierUp")
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
