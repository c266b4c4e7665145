"""How every executable is made: the abstract arguments it compiles for, its compile
options (tiers), and ``Build``, the one chain from a lowering through the executable
store to XLA's compile."""
from __future__ import annotations

import time

import jax
import numpy as np

from ..base import metrics
from ..base.dtypes import to_jax_dtype
from ..base.frames import SourceLoc
from ..graph.summary import aval_text
from ..ir.nodes import OpSignature, info_digest
from ..runtime import store
from ..runtime.devices import jax_device
from ..runtime.jit import YNN_OFF, compile_lowered, lower_jitted
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
# compiles quickly; the optimized executable compiles after, in the background, and
# replaces it (executables/background.py, graphs.tier_up).
#
# What someone waits for compiles with LLVM at -O0 and its expensive passes off (pure
# JAX, ms, loaded machine):
#   six elementwise and reduce ops as one graph: 27-29 against 118 with XLA's defaults;
#   the BERT training step (824 ops) as one eager run: 1.9-2.9 s against 6.3 s with the
#   defaults (fusion emitters off without -O0: 12.6 s, LLVM's full pipeline over the
#   legacy emitters' loops);
#   tanh, matmul, softmax alone: 14-18 against 30-35.
# Its code runs slower (the BERT step: 0.9 s against 0.33 s), so what comes back gets the
# optimized executable (tier_up). -O0 keeps each op's own rounding across ops: XLA's
# defaults contract a multiply and the add after it into one FMA (x * y + x: 1 ulp from
# op by op and from CPU torch). The fusion emitters stay on: with the legacy emitters at
# -O0, XLA duplicated uniform_'s u * (high - low) + low into a gather's fusion, which
# contracted it, and into the fusion that wrote the tensor out, which did not, so
# take_along_dim(t, i) was not t[i] within one executable (PyTorch's test_take_along_dim
# in eager mode). With the emitters every fusion rounded the same.
# YNNPACK and XNNPACK off: YNNPACK builds its pipeline at an executable's first run (11
# against 0.5-0.9 ms for a small one), which the quick tier's graphs often have only once.
_QUICK_CPU = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True,
              **YNN_OFF}
# XLA:CPU ignores JAX's effort options (exec_time_optimization_effort,
# optimization_level): measured, no quicker.


def quick_options(device: int):
    """XLA options for a quickly compiled executable (a graph or a single op); None
    where xlanb has no quicker tier for the platform (only XLA:CPU's were measured)."""
    if jax_device(device).platform != "cpu":
        return None
    return _QUICK_CPU


# A small module compiles quicker unfused: the fusion emitters cost a fixed ~60 ms per
# compile and little per op, one kernel per op costs ~1 ms per op (pure JAX, blocks of
# exp, mul, add, sum, softmax, matmul, tanh; StableHLO ops: unfused ms / emitters ms):
#   29: 39 / 93   58: 75 / 126   116: 122 / 154   232: 254 / 177
# (issue 47's six-op shape: 144 -> 66 ms per new shape in xlanb). Unfused, no producer
# is copied into two fusions either, so every value is rounded once (see above).
_UNFUSED_CPU = {"xla_cpu_use_fusion_emitters": False, "xla_disable_hlo_passes": "fusion"}
UNFUSED_MAX_OPS = 128


# What may compile unfused. XLA:CPU's legacy emitters at -O0 without fusion give wrong
# values for a transpose whose result is reshaped (jnp: x.T.reshape(-1), pure JAX; the
# transpose becomes a layout the reshape then ignores): a write through a transposed
# view (.t().copy_(y)) landed row-major, and stft and bilinear interpolation (a dot
# beside a transpose) were wrong in most elements. -O3 unfused, -O0 fused and the
# fusion emitters were right. So a module with a transpose or a dot (which chooses its
# operands' layouts), or with any op not listed (scatter, gather, dynamic slices, sort,
# loops, custom calls, random bits, windows, convolutions) keeps the fusion emitters.
_UNFUSED_OK = frozenset(f"stablehlo.{n}" for n in (
    "constant add subtract multiply divide remainder negate abs exponential "
    "exponential_minus_one log log_plus_one logistic tanh sine cosine tan sqrt rsqrt cbrt "
    "power maximum minimum floor ceil round_nearest_afz round_nearest_even sign not and or "
    "xor shift_left shift_right_arithmetic shift_right_logical compare select clamp "
    "convert bitcast_convert broadcast_in_dim reshape slice concatenate reduce "
    "iota is_finite atan2 real imag complex pad reverse popcnt "
    "count_leading_zeros return").split()) | {"func.return", "func.call"}


def lowered_ops(lowered, names: set | None = None) -> int:
    """The StableHLO ops in ``lowered``'s functions (a reduction's body not counted);
    with ``names``, each op's name is added to it."""
    n = 0
    for func in lowered.compiler_ir().body.operations:
        for region in func.regions:
            for block in region.blocks:
                n += len(block.operations)
                if names is not None:
                    names.update(op.operation.name for op in block.operations)
    return n


def unfused(lowered) -> bool:
    """Whether ``lowered`` compiles quicker unfused at the quick tiers, and safely
    (``_UNFUSED_OK``): a small module, or one that mostly hands its values out. The
    emitters' cost goes with the number of fusions, and a value handed out is a fusion
    of its own: ``unbind`` of a (1024, 512) tensor (1,024 results, 2,048 ops) took 9.0 s
    with the emitters, 2.0 s unfused (pure JAX)."""
    names: set = set()
    n = lowered_ops(lowered, names)
    if not names <= _UNFUSED_OK:
        return False
    return n <= UNFUSED_MAX_OPS or len(jax.tree_util.tree_leaves(lowered.out_info)) * 4 >= n


def compile_options(tier: str, options, lowered):
    """``options`` for this lowering: at the quick tiers, one that compiles quicker
    unfused (``unfused``) does. The choice follows from the lowering, so the store key
    need not hold it."""
    if tier in ("quick", "op_quick") and options is _QUICK_CPU and unfused(lowered):
        return {**options, **_UNFUSED_CPU}
    return options


def lower_op(info: OpSignature):
    n = info.n_in
    fn = info.fn
    specs = [tensor_spec(m, info.device) for m in info.in_metas]
    specs += [scalar_spec(k, info.device) for k in info.scalar_specs]
    return lower_jitted(lambda *flat: fn(flat[:n], flat[n:]), specs, lower_metric="OpLowerTime")


# The tiers an executable compiles at: "op" (a single op: XLA's optimizations, fusion
# emitters off), "quick" and "op_quick" (a graph or a single op someone waits for: see
# _QUICK_CPU) and "full" (XLA's defaults: graphs, tier-ups, TPU targets).
def tier_options(tier: str, device: int | None):
    if tier == "op":
        return single_op_options(device)
    if tier in ("quick", "op_quick"):
        return quick_options(device)
    return None


class _Lowering:
    """A build's lowering, made once and shared by its tiers (``Build.at``); its time is
    counted once, with the first compile."""
    __slots__ = ("make", "lowered", "seconds")

    def __init__(self, make, lowered=None, seconds: float = 0.0):
        self.make = make
        self.lowered = lowered
        self.seconds = seconds

    def get(self):
        if self.lowered is None:
            t0 = time.perf_counter()
            self.lowered = self.make()
            self.seconds = time.perf_counter() - t0
        return self.lowered

    def take_seconds(self) -> float:
        s, self.seconds = self.seconds, 0.0
        return s


class Build:
    """One executable to make, and the one chain that makes every executable (single
    ops, sharded ops, a look's prefix graph, graphs, reloads, tier-ups, TPU targets), as
    JAX's ``Traced.lower`` -> ``Lowered.compile`` -> ``Compiled`` makes a primitive's and a
    function's alike:

    - ``stored()``: the executable from the store (no lowering), its load timed into
      ``metric``; where the process's room for another executable is checked first;
    - ``lower()``: the ``jax.stages.Lowered`` (made once, from ``lower``, on the calling
      thread: it holds the GIL, and a lowering error belongs to the caller's line);
    - ``compile()``: XLA's compile at the build's tier (``runtime/jit.compile_lowered``,
      the only call of ``Lowered.compile``), timed with the lowering into ``metric``, and
      stored under the build's key; it may run on a compile thread;
    - ``executable()``: stored, else lowered and compiled.

    ``description`` says what it computes, completely (the store key's input; None: not
    stored). ``device`` is xlanb's device (None for a TPU target, which is not stored and
    takes no room in this process)."""

    __slots__ = ("device", "lowering", "description", "tier", "metric", "info")

    def __init__(self, device: int | None, lower, *, description: bytes | None = None,
                 tier: str = "full", metric: str = "CompileTime", lowered=None,
                 lower_s: float = 0.0):
        self.device = device
        self.lowering = (lower if isinstance(lower, _Lowering)
                         else _Lowering(lower, lowered, lower_s if lowered is not None else 0.0))
        self.description = description
        self.tier = tier
        self.metric = metric
        self.info: dict = {}  # what the store kept beside the executable ``stored`` loaded

    @classmethod
    def op(cls, info: OpSignature) -> "Build":
        """``info``'s single-op executable."""
        return cls(info.device, lambda: lower_op(info), description=info_digest(info),
                   tier="op", metric="OpCompileTime")

    def at(self, tier: str, metric: str | None = None) -> "Build":
        """The same computation at another tier (its own store key), sharing the lowering."""
        return Build(self.device, self.lowering, description=self.description, tier=tier,
                     metric=metric or self.metric)

    @property
    def options(self):
        return tier_options(self.tier, self.device) if self.device is not None else None

    @property
    def key(self) -> str | None:
        """Its store key (None: not stored, or the store is off)."""
        if self.description is None or self.device is None or not store.directory():
            return None
        return store.key(self.description, self.device, self.options)

    def in_store(self) -> bool:
        """Whether the store has it: a look that counts no miss (``stored`` counts one)."""
        key = self.key
        return key is not None and store.has(key)

    def stored(self):
        """The executable in the store, or None (a miss, or the store is off)."""
        if self.device is not None:
            reserve()
        key = self.key
        if key is None:
            return None
        t0 = time.perf_counter()
        exe, self.info = store.load(key, self.device, with_info=True)
        if exe is not None:
            metrics.record(self.metric, time.perf_counter() - t0)
        return exe

    def lower(self):
        return self.lowering.get()

    def compile(self, *, metric: str | None = None, keep: bool = True):
        """Compile it (lowering it first if nobody has); stored unless ``keep`` is False.
        ``metric``: time it there instead (a tier-up's compile)."""
        if self.device is not None:
            reserve()
        lowered = self.lower()
        exe = compile_lowered(lowered, metric=metric or self.metric,
                              lower_s=self.lowering.take_seconds(),
                              compiler_options=compile_options(self.tier, self.options,
                                                               lowered))
        if keep:
            self.store(exe)
        return exe

    def store(self, exe, info: dict | None = None) -> None:
        """Write ``exe`` to the store under the build's key (nothing if it has none),
        with ``info`` beside it (``stored`` reads it back into ``self.info``)."""
        key = self.key
        if key is not None:
            store.store(key, exe, info)

    def executable(self):
        exe = self.stored()
        return exe if exe is not None else self.compile()


def op_context(info: OpSignature, src: SourceLoc | None, scope: str) -> str:
    """A failing op as a person finds it: ``aten::mm(f32[2,3], f32[4,5]) at model.py:42
    forward [Model.fc]``."""
    ins = ", ".join(aval_text(m) for m in info.in_metas if m is not None)
    where = f" at {src.short}" if src is not None else ""
    return f"{info.name}({ins}){where}" + (f" [{scope}]" if scope else "")


def add_op_note(err: BaseException, what: str, info: OpSignature, src, scope: str) -> None:
    """Name the op in ``err``'s traceback (a note: its type and message stay)."""
    note = f"xlanb: {what} {op_context(info, src, scope)}"
    if note not in getattr(err, "__notes__", ()):
        err.add_note(note)
