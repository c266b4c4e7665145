"""Finding the first op that made a NaN or an Inf (``xlanb.debug_nans``).

With ``config.debug_nans`` on, every sync checks its results with one fused finiteness
check (``all_finite``: one small jitted reduction and one boolean read back). When it
fails, ``check_run`` replays the same graph op by op from the same inputs (the leaves
still hold their data: nothing is swapped until a run succeeds) through the single-op
cache, and raises ``NonFiniteError`` (a ``FloatingPointError``) at the first node whose
output is non-finite: its aten op, shapes and dtypes, module scope, the user's line, the
min, max and non-finite count of each input, and for an op recorded during backward, the
forward op and line it comes from (``origins``, filled by ``xlanb.debug``).
"""
from __future__ import annotations

import functools
import sys
import weakref

import jax
import jax.numpy as jnp
import numpy as np

from ..base.frames import SourceLoc, format_loc
from ..graph.summary import aval_text
from ..ir.nodes import GETITEM, GraphPlan, Node, OpSignature
from ..executables.compile import op_context
from ..executables.single_op import op_executable

# Ops recorded during backward -> (autograd node name, forward aten op, its SourceLoc,
# its scope). Filled only while debug_nans is on (xlanb.debug); weak: a node nobody
# holds is never reported.
origins: "weakref.WeakKeyDictionary[Node, tuple]" = weakref.WeakKeyDictionary()


# Each non-finite origin is reported once. ``reported``: the nodes a NonFiniteError
# named; ``tainted``: results that synced holding non-finite values that came from a
# reported origin. A later sync whose only non-finite values come from these runs (as
# CPU torch would, NaN in, NaN out) and says so in one line, instead of raising the same
# error again: IPython's last traceback keeps the reported tensors alive, so without this
# no sync after a NaN could ever run, a clean computation included. Weak: a node nobody
# holds is forgotten.
reported: "weakref.WeakSet[Node]" = weakref.WeakSet()
tainted: "weakref.WeakSet[Node]" = weakref.WeakSet()


# An error found on autograd's engine thread (eager backward), where raising is lost:
# raised on the main thread by the next sync or the next op instead.
deferred: list = []


def raise_deferred() -> None:
    if deferred:
        err = deferred[0]
        deferred.clear()
        raise err


class NonFiniteError(FloatingPointError):
    """The first op whose output is NaN or Inf. Attributes: ``op`` (``aten::log``),
    ``src`` (SourceLoc | None), ``scope``, ``inputs`` (one stats dict per input),
    ``origin`` ((autograd node, forward op, forward SourceLoc, forward scope) for a
    backward op, else None), ``inputs_finite`` (False: the non-finite value came in
    from the graph's inputs, not from this op)."""

    def __init__(self, msg="", *, op=None, src=None, scope="", inputs=(), origin=None,
                 inputs_finite=True, mode=""):
        # every field has a default: autograd's engine thread may rebuild the error
        super().__init__(msg)
        self.op = op
        self.src = src
        self.scope = scope
        self.inputs = inputs
        self.origin = origin
        self.inputs_finite = inputs_finite
        self.mode = mode

    @property
    def where(self) -> tuple:
        """(SourceLoc, scope) the user wrote: the forward line for a backward op."""
        if self.origin is not None and self.origin[2] is not None:
            return self.origin[2], self.origin[3]
        return self.src, self.scope


def _is_float(x) -> bool:
    return jnp.issubdtype(x.dtype, jnp.inexact)


@jax.jit
def _fused_all_finite(xs):
    ok = jnp.bool_(True)
    for x in xs:
        ok = ok & jnp.all(jnp.isfinite(x))
    return ok


def all_finite(arrays) -> bool:
    """One fused check of every float array in ``arrays`` (nested tuples allowed)."""
    xs = [x for x in jax.tree_util.tree_leaves(arrays) if hasattr(x, "dtype") and _is_float(x)]
    if not xs:
        return True
    return bool(_fused_all_finite(xs))


def array_stats(x) -> dict:
    """min, max (over the finite values), nan and inf counts of one array."""
    a = np.asarray(x)
    st = {"shape": tuple(a.shape), "dtype": str(a.dtype)}
    if a.dtype.kind in "fc" or str(a.dtype) == "bfloat16":
        a = a.astype(np.complex128 if a.dtype.kind == "c" else np.float64)
        fin = np.isfinite(a)
        st["nan"] = int(np.isnan(a).sum())
        st["inf"] = int(a.size - fin.sum() - st["nan"])
        vals = a[fin].real if a.dtype.kind == "c" else a[fin]
    else:
        st["nan"] = st["inf"] = 0
        vals = a.reshape(-1)
    st["min"] = vals.min().item() if vals.size else None
    st["max"] = vals.max().item() if vals.size else None
    return st


def _stats_text(st: dict) -> str:
    bad = st["nan"] + st["inf"]
    rng = (f"min {st['min']:.6g}, max {st['max']:.6g}" if st["min"] is not None
           and isinstance(st["min"], float) else f"min {st['min']}, max {st['max']}")
    return f"{rng}, non-finite {bad}" + (f" ({st['nan']} nan, {st['inf']} inf)" if bad else "")


def origin_text(origin) -> str:
    if origin is None:
        return ""
    anode, fop, fsrc, fscope = origin
    where = f" at {format_loc(fsrc)}" if fsrc is not None else ""
    if fop is None:  # autograd's own step (a gradient's accumulation): no forward op
        return f"{anode}, autograd's own step (no forward op), in the backward started{where}"
    return (f"backward of {fop or '?'} ({anode}), whose forward ran{where}"
            + (f" [{fscope}]" if fscope else ""))


# What a sync that found a NaN leaves behind, and what happens next.
_KEPT = ("  The pending tensors are unchanged (xlanb.pending_ir() shows them). This origin is "
         "reported once: a later sync runs them (NaN in, NaN out, as CPU torch would) and "
         "names the results that still hold non-finite values.")


def make_error(info: OpSignature, src: SourceLoc | None, scope: str, args, scalars, out,
               origin, how: str, mode: str) -> NonFiniteError:
    """The error naming the op that made the first non-finite value."""
    ins = [array_stats(a) for a in jax.tree_util.tree_leaves(args)]
    finite_in = all(s["nan"] + s["inf"] == 0 for s in ins)
    outs = [array_stats(o) for o in jax.tree_util.tree_leaves(out) if hasattr(o, "dtype")]
    verb = "made the first non-finite value" if finite_in else \
        "is the first op with a non-finite output, from an input that was already non-finite"
    lines = [f"xlanb: {op_context(info, src, scope)} {verb} ({how})"]
    if origin is not None:
        lines.append(f"  {origin_text(origin)}")
    for i, st in enumerate(outs):
        lines.append(f"  output {i}: {aval_text(info.out if not info.multi else info.out[i])}"
                     f" non-finite {st['nan'] + st['inf']} ({st['nan']} nan, {st['inf']} inf)")
    metas = [m for m in info.in_metas if m is not None]
    for i, st in enumerate(ins):
        shown = aval_text(metas[i]) if i < len(metas) else f"{st['dtype']}{list(st['shape'])}"
        lines.append(f"  input {i}: {shown} {_stats_text(st)}")
    for i, s in enumerate(scalars):
        try:
            s = np.asarray(s).item()
        except Exception:
            pass
        lines.append(f"  scalar {i}: {s!r}")
    lines.append("  The op's result was not returned; earlier tensors are unchanged."
                 if mode == "eager" else
                 _KEPT)
    return NonFiniteError("\n".join(lines), op=info.name, src=src, scope=scope, inputs=ins,
                          origin=origin, inputs_finite=finite_in, mode=mode)


@functools.lru_cache(maxsize=None)
def _finite_one_fn():
    return jax.jit(lambda x: jnp.all(jnp.isfinite(x)))


def _finite(x) -> bool:
    leaves = [v for v in jax.tree_util.tree_leaves(x) if hasattr(v, "dtype") and _is_float(v)]
    f = _finite_one_fn()
    return all(bool(f(v)) for v in leaves)


def first_nonfinite(plan: GraphPlan, keep=None, leaves=None, scalars=None, known=None):
    """Replay ``plan`` op by op from its leaves (or from ``leaves`` and ``scalars``, the
    values an ``xlanb.compile`` replay ran it on); the first op node whose output is
    non-finite, as (index, node, info, args, scalars, out), or None.

    ``known`` (a list, filled): with it, a non-finite output of a ``reported`` origin,
    or of an op with an input made non-finite by one (or by a ``tainted`` leaf), is
    not a new origin: the replay goes on past it and its position lands in ``known``."""
    if leaves is not None:
        vals = list(leaves)
    else:
        vals = [n.data if n.data is not None else keep[id(n)] for n in plan.leaves]
    # positions (into vals) of values whose non-finiteness was reported already
    bad = set() if known is None or leaves is not None else \
        {i for i, n in enumerate(plan.leaves) if n in tainted}
    n_leaves = len(vals)
    all_scalars = plan.scalars if scalars is None else scalars
    k = 0
    with jax.enable_x64(True):
        for j, ((info, ins), node) in enumerate(zip(plan.steps, plan.op_nodes)):
            n = len(info.scalar_specs)
            args = [vals[i] for i in ins]
            scalars = all_scalars[k:k + n]
            k += n
            if info.name == GETITEM:
                out = info.fn(args, ())
            else:
                out = op_executable(info)(*args, *scalars)
            vals.append(out)
            if info.name == GETITEM:
                if ins[0] in bad:
                    bad.add(n_leaves + j)
                continue
            if not _finite(out):
                if known is not None and (node in reported or any(i in bad for i in ins)):
                    bad.add(n_leaves + j)
                    known.append(n_leaves + j)
                    continue
                return j, node, info, args, scalars, out
    return None


def check_run(plan: GraphPlan, arrays, mode: str, cause: str, src, leaves=None,
              scalars=None) -> None:
    """After a run of ``plan`` (results ``arrays``, not yet swapped in): raise
    NonFiniteError at the first op that made a NaN/Inf, if any result is non-finite.
    ``leaves`` and ``scalars``: the inputs of an ``xlanb.compile`` replay, which runs the
    plan on new values."""
    if all_finite(arrays):
        return
    known: list = []
    found = first_nonfinite(plan, leaves=leaves, scalars=scalars, known=known)
    at = f" at {format_loc(src)}" if src is not None else ""
    if found is None and known:  # only what was reported already: run, and say so once
        bad = [i for i, a in enumerate(arrays) if not _finite(a)]
        held = [plan.roots[i] for i in bad]
        tainted.update(held)
        names = "; ".join(op_context(r.info, r.src, r.scope) for r in held[:5])
        more = f"; and {len(held) - 5} more" if len(held) > 5 else ""
        print(f"xlanb: the {mode} sync{at} ran; {len(held)} of its {len(arrays)} results "
              f"still hold non-finite values from a NaN/Inf reported before: {names}{more}",
              file=sys.stderr)
        return
    if found is None:
        bad = [i for i, a in enumerate(arrays) if not _finite(a)]
        roots = ", ".join(op_context(plan.roots[i].info, plan.roots[i].src, plan.roots[i].scope)
                          for i in bad[:5])
        raise NonFiniteError(
            f"xlanb: the {mode} sync ({cause}){at} made non-finite values in {len(bad)} of "
            f"{len(arrays)} results ({roots}), but replayed op by op no op did: XLA's fused "
            "graph computes them differently (xlanb.set_mode('opbyop') runs that way).\n"
            + _KEPT,
            op=None, src=None, scope="", inputs=[], origin=None, inputs_finite=True, mode=mode)
    j, node, info, args, scalars, out = found
    how = (f"op {j + 1} of {len(plan.steps)} in the {mode} sync ({cause}){at}, replayed op by "
           "op from the same inputs")
    reported.add(node)
    raise make_error(info, node.src, node.scope, args, scalars, out, origins.get(node), how, mode)
