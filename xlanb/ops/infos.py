"""How one signature of an op evaluates: its ``OpSignature``.

An ``OpSignature`` is built once per signature: torch's meta kernels give the result shapes
and dtypes, and its ``fn(inputs, scalars)`` evaluates the op on JAX values, cast to
torch's dtypes, through the op's JAX lowering or torch's decomposition. Decompositions
run on tensors that hold JAX values, op by op: the dispatcher that does that sits above
this module and installs itself with ``set_decomposition_runner``.
"""
from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import torch

from ..base.dtypes import to_jax_dtype, to_torch_dtype
from ..base.caches import cache
from ..ir.nodes import GETITEM, OpSignature, TensorMeta, contiguous_strides, result_metas
from ..ir.templates import fill_call, template_of
from .plan import OpPlan
from .signature import meta_tensor, metas_of
from .views import ViewRecord

# op signature -> OpSignature (dispatch/dispatcher.py and spmd.py fill it)
infos: dict = cache({}, "op signature -> OpSignature", compiled=True)
getitem_infos = cache({}, "(OpSignature uid, output index) -> OpSignature", compiled=True)


def _conform(res, out, name):
    """Cast a lowering's result to torch's dtype and check its shape against torch's."""
    if isinstance(out, TensorMeta):
        if res.shape != out.shape:
            raise RuntimeError(f"xlanb: lowering of {name} gave shape {res.shape}, "
                               f"torch expects {out.shape}")
        want = to_jax_dtype(out.dtype)
        res = res if res.dtype == want else res.astype(want)
        if out.dtype == torch.complex32:  # held as complex64: each part a float16 value
            res = jax.lax.complex(res.real.astype(jnp.float16).astype(jnp.float32),
                                  res.imag.astype(jnp.float16).astype(jnp.float32))
        return res
    if isinstance(out, tuple):
        return tuple(_conform(r, o, name) if o is not None and r is not None else r
                     for r, o in zip(res, out))
    return res


def _half_numbers(scs):
    # CPU torch rounds a Python float meeting a complex32 tensor to half first (it becomes
    # a complex32 number); the lifted float arrives as float32
    return [s.astype(jnp.float16).astype(s.dtype)
            if getattr(s, "dtype", None) in (jnp.float32, jnp.float64) and s.ndim == 0 else s
            for s in scs]


def _lowered_fn(plan: OpPlan, template, out):
    low = plan.lowering.fn
    name = plan.name
    random = plan.random
    half = not random and any(m.dtype == torch.complex32 for m in result_metas(out))

    def fn(ins, scs):  # runs when the op is traced, not per call
        args, kwargs = fill_call(template, ins, _half_numbers(scs) if half else scs)
        if random:
            kwargs["rng"] = jax.random.wrap_key_data(scs[-1])
        return _conform(low(*args, **kwargs), out, name)
    return fn


def _no_runner(decomp, template, arrays, scalars):
    raise RuntimeError("xlanb: no decomposition runner installed (import xlanb first)")


_run_decomposition = _no_runner


def set_decomposition_runner(fn) -> None:
    """Install ``fn(decomp, template, arrays, scalars) -> JAX value(s)``: runs torch's
    decomposition ``decomp``, called as ``template`` says, on tensors holding the JAX
    ``arrays`` (modes/record.py installs it)."""
    global _run_decomposition
    _run_decomposition = fn


def _decomposed_fn(plan: OpPlan, template, out):
    decomp = plan.decomp
    name = plan.name

    def fn(ins, scs):
        return _conform(_run_decomposition(decomp, template, ins, scs), out, name)
    return fn


def _view_raw_fn(plan: OpPlan, template):
    """A view op without the dtype cast: view chains also run on index arrays."""
    low = plan.lowering.fn if plan.lowering is not None else None
    if low is None:
        return None

    def raw(x):
        args, kwargs = fill_call(template, [x], ())
        return low(*args, **kwargs)
    return raw


def check_traceable(fn, tensors, scalars, random) -> None:
    """Trace ``fn`` once on abstract values; NotImplementedError if it cannot lower (an
    op inside a decomposition has no lowering, or a lowering refuses these inputs), so
    the caller falls back to CPU."""
    specs = [jax.ShapeDtypeStruct(t._meta.shape, to_jax_dtype(t._meta.dtype)) for t in tensors]
    scs = list(scalars) + ([np.zeros(2, np.uint32)] if random else [])
    try:
        with jax.enable_x64(True):
            jax.eval_shape(lambda *a: fn(a, scs), *specs)
    except (NotImplementedError, TypeError):
        # TypeError: the lowering refuses the call's dtypes (rounding a complex number);
        # the dispatcher lets CPU torch decide, and raise its own error
        raise
    except Exception as e:
        raise NotImplementedError(f"torch's decomposition does not lower: {e}") from e


def _check_lowering_takes(plan: OpPlan, sig, fn, tensors, scalars) -> None:
    """``check_traceable`` for a lowering that may refuse: once per dtype signature
    (the readable signature ``sig`` with each tensor reduced to rank and dtype) where it
    refuses by dtypes alone (``may_refuse="dtypes"``). Only a call that traced is
    remembered: a refusal goes to CPU torch, and is checked anew each time."""
    if plan.lowering.may_refuse != "dtypes":
        check_traceable(fn, tensors, scalars, plan.random)
        return
    key = _by_dtypes(sig)
    if key in _traced_by_dtypes:
        return
    check_traceable(fn, tensors, scalars, plan.random)
    _traced_by_dtypes.add(key)


_traced_by_dtypes = cache(set(), "dtype signatures whose may-refuse lowering traced")


def _by_dtypes(x):
    """``x`` (a readable signature: ``templates.readable_sig`` spells each tensor as
    (shape, stride, dtype, offset)) with each tensor reduced to its rank and dtype."""
    if type(x) is tuple:
        if len(x) == 4 and type(x[2]) is torch.dtype and type(x[0]) is tuple:
            return (len(x[0]), x[2])
        return tuple([_by_dtypes(e) for e in x])
    return x


def _grouped_mm_meta(a, b, offs=None, bias=None, out_dtype=None):
    """torch's meta kernel for _grouped_mm is CUDA's, which takes bfloat16 alone; CPU
    torch's kernel takes float32 and float16 too (transformers' MoE experts in float32).
    Those are checked as CPU torch checks them, the rest by torch's meta kernel on
    bfloat16 stand-ins whose strides (but unit ones) are doubled: the same 16-byte
    alignment rule at half the element size."""
    if a.dtype != b.dtype or a.dtype not in (torch.float32, torch.float16):
        return torch.ops.aten._grouped_mm.default(a, b, offs, bias, out_dtype)
    torch._check(out_dtype in (None, a.dtype),
                 lambda: "Grouped gemm output dtype must match `mat_a` dtype")
    scale = a.element_size() // 2

    def stand_in(t):
        stride = [s if s == 1 else s * scale for s in t.stride()]
        return torch.empty_strided(t.shape, stride, dtype=torch.bfloat16, device="meta")
    res = torch.ops.aten._grouped_mm.default(stand_in(a), stand_in(b), offs, bias)
    return torch.empty(res.shape, dtype=a.dtype, device="meta")


#: Meta kernels standing in for torch's where torch's refuse what CPU torch runs.
_META_STAND_INS = {torch.ops.aten._grouped_mm.default: _grouped_mm_meta}


def new_info(plan: OpPlan, op, sig, args, kwargs, tensors, scalars, device, out_args=None) -> OpSignature:
    """Build the OpSignature of one signature. For out= ops, ``kwargs`` and ``tensors`` exclude
    the out arguments, which are passed as ``out_args`` (name -> tensor or list of them)."""
    lift = plan.lift
    counters = [0, 0]
    targs = [template_of(a, counters, lift) for a in args]
    tkwargs = {k: template_of(v, counters, lift) for k, v in kwargs.items()}
    # torch's own meta kernel checks the call as made (in-place, out= included)...
    margs, mkwargs = fill_call((targs, tkwargs), [meta_tensor(t) for t in tensors], scalars)
    if "device" in mkwargs:
        mkwargs["device"] = "meta"
    for name, o in (out_args or {}).items():
        mkwargs[name] = [meta_tensor(x) for x in o] if isinstance(o, (list, tuple)) else meta_tensor(o)
    tkwargs = {k: v for k, v in tkwargs.items() if k not in ("device", "pin_memory")}
    template = (targs, tkwargs)
    try:
        with torch._C._DisableTorchDispatch(), warnings.catch_warnings():
            # an out= resized is the dispatcher's to warn about, on every call, not only
            # on the first call of a signature
            warnings.filterwarnings("ignore", message="An output with one or more elements")
            meta_res = _META_STAND_INS.get(op, op)(*margs, **mkwargs)
            # ...and the functional op that nodes record gives the result shapes and dtypes.
            if plan.fop is not op:
                fargs, fkwargs = fill_call(template, [meta_tensor(t) for t in tensors], scalars)
                meta_res = _META_STAND_INS.get(plan.fop, plan.fop)(*fargs, **fkwargs)
        out = metas_of(meta_res)
    except NotImplementedError:
        if plan.lowering is None or plan.kind in ("view", "out"):
            raise
        # No meta kernel (geqrf, histogram, some backwards): the lowering gives the shapes.
        out = _metas_from_lowering(plan, template, tensors, scalars)
    # a result the device cannot hold (a float8 type) is refused at its op, in every mode:
    # recorded, it failed at a later read, or at an unrelated one that ran the eager run
    for m in result_metas(out):
        to_jax_dtype(m.dtype)
    if plan.lowering is not None:
        fn = _lowered_fn(plan, template, out)
        if plan.lowering.may_refuse:
            _check_lowering_takes(plan, sig, fn, tensors, scalars)
    else:
        fn = _decomposed_fn(plan, template, out)
        check_traceable(fn, tensors, scalars, False)
    specs = (float_kind(tensors, out),) * len(scalars) if lift and scalars else ()
    if plan.random:
        specs = specs + ("key",)
    view = ViewRecord(_view_raw_fn(plan, template)) if plan.kind == "view" else None
    return OpSignature(plan.name, sig, fn, out, op=plan.fop, n_in=len(tensors),
                  scalar_specs=specs, device=device, plan=plan,
                  in_metas=tuple(t._meta for t in tensors), template=template, view=view)


# A lifted Python float passes to the executable as float32 where the op computes in a
# float type of 32 bits or fewer: CPU torch converts the number to the op's computation
# type (float for float32, and for float16 and bfloat16 too: their "opmath" type), so a
# float64 parameter only bought XLA's TPU compiler its float64 emulation (X64SplitLow),
# and no time estimate, in every optimizer step. It stays float64 where an input or the
# result is float64 or complex128, and where no float is involved (an integer result:
# full(..., dtype=int64) converts the number itself). The kind depends on the signature's
# dtypes only, so it adds no executables.
_WIDE = (torch.float64, torch.complex128)


def float_kind(tensors, out) -> str:
    """``"f32"`` or ``"f"`` (float64): how the lifted floats of an op with these input
    tensors and result metas pass to its executable."""
    # (a TensorMeta is a NamedTuple: result_metas tells one result from a tuple of them)
    dtypes = {t._meta.dtype for t in tensors} | {m.dtype for m in result_metas(out)}
    if any(d in _WIDE for d in dtypes):
        return "f"
    return "f32" if any(d.is_floating_point or d.is_complex for d in dtypes) else "f"


_F32_MAX = float(np.finfo(np.float32).max)


def as_f32(scalars) -> list:
    """The lifted floats of an ``"f32"`` op as numpy float32 values (a number beyond
    float32's range becomes an infinity, as CPU torch's ``tensor_f32 * 1e300`` does)."""
    out = []
    for v in scalars:
        if type(v) is float:
            if -_F32_MAX <= v <= _F32_MAX:
                v = np.float32(v)
            else:
                with np.errstate(over="ignore"):
                    v = np.float32(v)
        out.append(v)
    return out


def _metas_from_lowering(plan: OpPlan, template, tensors, scalars):
    fn = _lowered_fn(plan, template, None)
    specs = [jax.ShapeDtypeStruct(t._meta.shape, to_jax_dtype(t._meta.dtype)) for t in tensors]
    scs = list(scalars) + ([np.zeros(2, np.uint32)] if plan.random else [])
    try:
        with jax.enable_x64(True):
            res = jax.eval_shape(lambda *a: fn(a, scs), *specs)
    except Exception as e:
        raise NotImplementedError(f"{plan.name}: no meta kernel, and the lowering "
                                  f"does not trace: {e}") from e

    def meta(r):
        if isinstance(r, (tuple, list)):
            return tuple(meta(x) for x in r)
        shape = tuple(r.shape)
        return TensorMeta(shape, contiguous_strides(shape), to_torch_dtype(r.dtype))
    return meta(res)


def getitem_info(info: OpSignature, i: int) -> OpSignature:
    key = (info.uid, i)
    gi = getitem_infos.get(key)
    if gi is None:
        gi = getitem_infos[key] = OpSignature(
            GETITEM, (GETITEM, info.sig, i), lambda ins, scs: ins[0][i], info.out[i], n_in=1,
            device=info.device, in_metas=(None,))
    return gi
