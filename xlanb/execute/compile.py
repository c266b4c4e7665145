"""What every executable needs: the abstract arguments it compiles for, how single-op
executables lower and compile, and the executable store's keys and loads."""
from __future__ import annotations

import time

import jax
import numpy as np

from ..base import metrics
from ..base.dtypes import to_jax_dtype
from ..base.frames import SourceLoc
from ..graph.summary import aval_text
from ..ir import OpInfo, info_digest
from ..runtime import store
from ..runtime.devices import jax_device
from ..runtime.jit import compile_lowered, lower_jitted
from .resident import reserve

_F64 = np.dtype(np.float64)
_F32 = np.dtype(np.float32)
_U32 = np.dtype(np.uint32)


def sharding(device: int):
    return jax.sharding.SingleDeviceSharding(jax_device(device))


def tensor_spec(meta, device: int):
    return jax.ShapeDtypeStruct(meta.shape, to_jax_dtype(meta.dtype), sharding=sharding(device))


def scalar_spec(kind: str, device: int):
    if kind == "f" or kind == "f32":  # a lifted Python float (ops/infos.py, float_kind)
        return jax.ShapeDtypeStruct((), _F64 if kind == "f" else _F32, weak_type=True,
                                    sharding=sharding(device))
    return jax.ShapeDtypeStruct((2,), _U32, sharding=sharding(device))  # PRNG key data


def single_op_options(device: int):
    # XLA:CPU's fusion emitters cost ~25% of a single-op compile and buy nothing for one
    # op (measured on the BERT eager first step: XLA compile 5.45 -> 4.02 s, same steady
    # step). Whole graphs keep them.
    if jax_device(device).platform == "cpu":
        return {"xla_cpu_use_fusion_emitters": False}
    return None


# What someone waits for at first sight (a first look in pdb, an eager run of new ops)
# compiles with LLVM's optimizations and the fusion emitters off: 3-4x quicker to compile
# (the six ops of bench_eager_shapes as one graph: 120-180 -> 30-40 ms). The optimized
# executable compiles after, in the background, and replaces it (execute/background.py,
# graphs.tier_up). XLA's HLO passes run either way, so both compute the same thing.
# XLA:CPU ignores JAX's effort options (exec_time_optimization_effort, optimization_level):
# measured, no quicker.
_QUICK_CPU = {"xla_cpu_use_fusion_emitters": False, "xla_backend_optimization_level": 0,
              "xla_llvm_disable_expensive_passes": True}


def quick_options(device: int):
    """XLA options for a quickly compiled executable (a single op, a look's prefix, an
    eager run); None where xlanb has no quicker tier for the platform (only XLA:CPU's
    were measured)."""
    return _QUICK_CPU if jax_device(device).platform == "cpu" else None


def lower_op(info: OpInfo):
    n = info.n_in
    fn = info.fn
    specs = [tensor_spec(m, info.device) for m in info.in_metas]
    specs += [scalar_spec(k, info.device) for k in info.scalar_specs]
    return lower_jitted(lambda *flat: fn(flat[:n], flat[n:]), specs, lower_metric="OpLowerTime")


def store_key(description: bytes, device: int, options) -> str | None:
    """The executable store's key (None: the store is off)."""
    return store.key(description, device, options) if store.directory() else None


def op_store_key(info: OpInfo) -> str | None:
    return store_key(info_digest(info), info.device, single_op_options(info.device))


def load_stored(key: str | None, device: int, metric: str):
    """The executable stored under ``key`` (no lowering), its load time counted as
    compile time in ``metric``; None on a miss or with the store off. Every compile
    starts here, so here the process's room for another executable is checked first
    (``ExecutableLimitError`` rather than a crash inside XLA)."""
    reserve()
    if key is None:
        return None
    t0 = time.perf_counter()
    exe = store.load(key, device)
    if exe is not None:
        metrics.record(metric, time.perf_counter() - t0)
    return exe


def compile_op(lowered, device: int, key: str | None, lower_s: float, *,
               metric: str = "OpCompileTime", options=None):
    """Compile a single op with ``options`` (default: ``single_op_options``); stored under
    ``key`` unless it is None."""
    exe = compile_lowered(lowered, metric=metric, lower_s=lower_s,
                          compiler_options=options or single_op_options(device))
    if key is not None:
        store.store(key, exe)
    return exe


def op_context(info: OpInfo, src: SourceLoc | None, scope: str) -> str:
    """A failing op as a person finds it: ``aten::mm(f32[2,3], f32[4,5]) at model.py:42
    forward [Model.fc]``."""
    ins = ", ".join(aval_text(m) for m in info.in_metas if m is not None)
    where = f" at {src.short}" if src is not None else ""
    return f"{info.name}({ins}){where}" + (f" [{scope}]" if scope else "")


def add_op_note(err: BaseException, what: str, info: OpInfo, src, scope: str) -> None:
    """Name the op in ``err``'s traceback (a note: its type and message stay)."""
    note = f"xlanb: {what} {op_context(info, src, scope)}"
    if note not in getattr(err, "__notes__", ()):
        err.add_note(note)
