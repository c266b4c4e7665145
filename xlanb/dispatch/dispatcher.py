"""From an aten call on xla tensors to a recorded IR node or a run single-op executable.

Per call: find the op's plan (ops/plan.py), compute its signature (ops/signature.py),
look up the ``OpSignature`` for that signature, then record or run it (modes/record.py). In-place
ops, ``out=`` and views are reduced to functional nodes plus writes into storages; the
ops that move data between host and device, or need a value, are handled here too
(``SPECIAL``). Installed as the tensor's dispatch handler at import.
"""
from __future__ import annotations

import warnings

import torch

from ..base import rng
from ..base.config import config
from ..base.dtypes import UnsupportedDtypeError
from ..base.caches import cache
from ..base.frames import user_frame, warn_at
from ..base.scopes import scope_stack
from ..base.session import mode_state, session
from ..values.checks import (INDEX_RULES, IndexCheck, add_pending_check, device_range, host_range,
                             index_error)
from ..values.fills import fill_value, settle_fill
from .fallback import cpu_fallback
from ..ir.nodes import OpSignature, TensorMeta
from ..pending.live import track, track_view
from ..ops.infos import as_f32, infos, new_info
from ..ops.plan import OpPlan, make_plan
from ..ops.leaves import from_host, host_values
from ..ops.signature import sig_of
from .reads import to_host
from .inplace_meta import resize_, resize_out, set_
from ..modes import policy as mode_policy  # noqa: F401 (installs the modes)
from ..modes.record import cast_node, output_node, apply_op, value_node, wrap_results, write
from ..pending.realize import host_look, node_array, peek_node
from ..runtime.transfer import array_to_host
from ..runtime.devices import device_index
from ..ir.templates import readable_sig
from ..ir.tensor import BaseLayout, XlaTensor, new_base, set_handler
from ..ir.nodes import contiguous_strides

aten = torch.ops.aten

# id(OpOverload) -> OpPlan (OpOverload.__hash__ is Python code); their fast paths hold infos
plans = cache({}, "id(OpOverload) -> OpPlan", compiled=True)
_infos = infos  # signature -> OpSignature (ops/infos.py)


def _plan(op) -> OpPlan:
    plan = plans.get(id(op))
    if plan is None:
        plan = plans[id(op)] = make_plan(op)
        plan.special = SPECIAL.get(op)
        if plan.special is None and plan.kind == "inplace" and plan.fop is not None \
                and make_plan(plan.fop).kind == "view":
            plan.special = _inplace_view  # squeeze_, unsqueeze_, transpose_, t_, ...
        elif plan.special is None and plan.kind == "functional" and not op._schema.returns:
            plan.special = _no_result
        elif plan.special is None and plan.lowering is None and plan.decomp is None \
                and getattr(op, "namespace", None) == "prims" \
                and getattr(op, "impl_aten", None) is not None:
            plan.special = _prim_as_aten  # prims.conj, prims.real, ... (torch._refs call them)
        # functional ops and views (a third of a decode step's ops, each a new tensor
        # over its input's storage) take the fast path; an absolute view's signature
        # holds its offsets, which the fast path's key does not
        if plan.special is None and plan.kind in ("functional", "view") \
                and (plan.lowering is not None or plan.decomp is not None) \
                and plan.name not in _HOST_INDICES_OK and plan.name not in _ABSOLUTE_VIEWS \
                and plan.name not in INDEX_RULES:  # indexing checks its indices
            plan.fast = {}
    return plan


# torch's default dtype decides result dtypes (an int tensor divided, an int tensor times
# a Python float, a factory without dtype=), and op signatures do not hold it: every
# signature is forgotten when it changes (once per change; programs rarely change it).
_get_default_dtype = torch.get_default_dtype
_signed_under = torch.get_default_dtype()  # the default dtype the signatures were made under


def _default_dtype_changed() -> None:
    global _signed_under
    _signed_under = _get_default_dtype()
    _infos.clear()
    for plan in plans.values():
        if plan.fast is not None:
            plan.fast.clear()


def torch_dispatch(cls, func, types, args=(), kwargs=None):
    """``XlaTensor.__torch_dispatch__`` (installed by ``set_handler``): torch calls it
    for every aten op on an xla tensor, so the fast path below is the hot path, one
    Python frame deep."""
    __debuggerskip__ = True  # IPython's debugger steps over xlanb frames
    if _get_default_dtype() is not _signed_under:
        _default_dtype_changed()
    plan = plans.get(id(func)) or _plan(func)
    fast = plan.fast
    if fast is not None and not session.direct:
        # The hot path: a functional op whose signature was seen before.
        tensors: list = []
        scalars: list = []
        sig_args = []
        for a in args:
            if type(a) is XlaTensor:
                tensors.append(a)
                sig_args.append(a._key)
            elif isinstance(a, torch.Tensor):
                break  # a host tensor moves over in the general path, once
            else:
                sig_args.append(sig_of(a, tensors, scalars, plan.lift))
        else:
            if not kwargs:
                info = fast.get(tuple(sig_args))
            else:  # add(y, alpha=0.5): keyword scalars, in the schema's order
                info = fast.get(_fast_kw_key(tuple(sig_args), kwargs, tensors, scalars, plan.lift))
            if info is not None:
                if plan.kind == "view":
                    if session.recorder is not None:
                        session.recorder.saw(tensors)
                    return _view_result(func, info, tensors[0])
                return _functional(plan, info, tensors, scalars)
    return _dispatch_general(plan, func, args, kwargs if kwargs is not None else {})


def dispatch(func, args, kwargs):
    """Run the aten op ``func`` on xla tensors, as torch's dispatcher would."""
    return torch_dispatch(None, func, None, args, kwargs)


# Marks a fast-path key with keyword arguments: (_KW, positional sig, keyword sig).
_KW = object()


def _fast_kw_key(sig_args: tuple, kwargs: dict, tensors: list, scalars: list, lift):
    """The fast table's key for a call with keyword arguments (no host tensor), as the
    general path fills it; None when a keyword argument is a host tensor."""
    sig_kwargs = []
    for k, v in kwargs.items():
        if isinstance(v, torch.Tensor) and type(v) is not XlaTensor:
            return None
        sig_kwargs.append((k, sig_of(v, tensors, scalars, lift)))
    return (_KW, sig_args, tuple(sig_kwargs))


def _functional(plan: OpPlan, info: OpSignature, tensors: list, scalars: list):
    """Record or run a functional op whose OpSignature is known; its new result tensor(s)."""
    recorder = session.recorder
    if recorder is not None:  # xlanb.compile: where the graph's inputs come from
        recorder.saw(tensors)
    if scalars and info.scalar_specs[0] == "f32":
        scalars = as_f32(scalars)
    if plan.random:
        scalars.append(rng.next_key())
    inputs = []
    for t in tensors:  # a loop: a comprehension is a function call more
        inputs.append(value_node(t) if t._view else t._storage.node)
    state = session.default if not session.scoped else mode_state()
    # the mode decides (modes/policy.py); the walk for the user's line starts at
    # torch_dispatch's caller, 4 frames up from the policy's
    node = state.policy.op(state, info, tuple(inputs), tuple(scalars), 4)
    if info.multi:
        return wrap_results(node, info, info.device)
    layout = info.layout
    if layout is None:
        layout = info.layout = BaseLayout(info.out, info.device)
    t = new_base(layout, node)
    if node.data is None:
        track(t._storage)
    return t


def _dispatch_general(plan: OpPlan, func, args, kwargs):
    """Every call the fast path does not take: special ops, host operands, ``out=``,
    views, in-place and mutating ops, and signatures seen for the first time. As JAX's
    ``apply_primitive``: find (or make) the op's ``OpSignature``, record or run it, then write
    its results back as the op's kind says (``_WRITE_BACK``)."""
    if plan.special is not None:
        res = plan.special(func, args, kwargs)
        if res is not NotImplemented:
            return res
    # index checks left to a graph (a pending index, or a traced xlanb.compile call):
    # each guards the op's result (values/checks.py)
    graph_checks = _check_host_indices(plan, args)
    args, kwargs = _device_operands(plan, args, kwargs)
    if plan.lowering is None and plan.decomp is None:
        if session.direct or plan.kind == "view":
            # A view computed on the host would stop aliasing its base: never fall back.
            raise NotImplementedError(f"xlanb: no lowering for {plan.name}")
        return cpu_fallback(func, args, kwargs)
    kind = plan.kind
    outs = ()
    out_args = None
    if kind == "out":
        # an out= argument is a tensor or a list of them (split_copy's out=[a, b])
        out_args = {name: kwargs[name] for name in plan.mutated}
        outs = [o for v in out_args.values() for o in (v if isinstance(v, (list, tuple)) else (v,))]
        kwargs = {k: v for k, v in kwargs.items() if k not in plan.mutated}
    tensors: list = []
    scalars: list = []
    lift = plan.lift
    sig_args = tuple([sig_of(a, tensors, scalars, lift) for a in args])
    sig_kwargs = tuple([(k, sig_of(v, tensors, scalars, lift)) for k, v in kwargs.items()])
    sig = (plan, sig_args, sig_kwargs, tuple([o._key for o in outs])) if outs else (plan, sig_args, sig_kwargs)
    if kind != "functional" and (kind != "view" or plan.name in _ABSOLUTE_VIEWS):
        # an in-place op's or out='s result lies where its inputs do. A view's offset
        # follows from its input's (_view_meta), so a view of each row of a tensor is one
        # signature, not one per row (PyTorch's batch_vs_slicing tests of _refs ops:
        # 300 new unsqueeze signatures a run, 45-57 s a test)
        sig += (tuple([t._meta.offset for t in tensors]), tuple([o._meta.offset for o in outs]))
    info = _infos.get(sig)
    device = tensors[0]._storage.device if tensors else (
        outs[0]._storage.device if outs else _factory_device(kwargs))
    if info is None:
        info = _info_for(plan, func, args, kwargs, tensors, scalars, device, outs, out_args)
        if not isinstance(info, OpSignature):  # CPU torch answered instead (fallback, its error)
            return info.value
        _infos[sig] = info
        if plan.fast is not None:
            plan.fast[sig_args if not kwargs else (_KW, sig_args, sig_kwargs)] = info
    if kind != "functional" and kind != "view" and mode_state().recording:
        _settle_written_fills(func, plan, args, kwargs, outs)
    recorder = session.recorder
    if recorder is not None:  # xlanb.compile: where the graph's inputs come from
        recorder.saw(tensors)
        recorder.saw(outs)
    if plan.name in INDEX_RULES and not session.direct:
        graph_checks += _check_index_operands(plan, args, kwargs)
    if scalars and info.scalar_specs[0] == "f32":
        scalars = as_f32(scalars)
    if plan.random:
        scalars.append(rng.next_key())
    if kind == "view":
        return _view_result(func, info, tensors[0])
    node = apply_op(info, tuple([value_node(t) for t in tensors]), tuple(scalars))
    for c in graph_checks:
        c.guard(node)
    return _WRITE_BACK[kind](func, plan, info, node, args, kwargs, outs, device)


def _device_operands(plan: OpPlan, args, kwargs):
    """The call's arguments with host tensors moved to the device (as torch does for a
    CPU scalar tensor), host index lists checked against the shape they index, and byte
    masks made bool."""
    if not session.direct and _has_host_tensor(args, kwargs):
        args, kwargs = _host_operands(plan, args, kwargs)
    if plan.name in _HOST_INDICES_OK and len(args) > 1:
        args = _byte_masks(args)
    return args, kwargs


class _Answered:
    """What CPU torch made of a call xlanb could not describe (``_info_for``)."""
    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value


def _info_for(plan: OpPlan, func, args, kwargs, tensors, scalars, device, outs, out_args):
    """The OpSignature of a signature seen for the first time, from torch's meta kernel; or
    ``_Answered`` where CPU torch decides instead: an op with no meta kernel falls back,
    and a call the meta kernel refuses gets CPU torch's own answer."""
    if any(t._storage.device != device for t in tensors):
        raise RuntimeError(f"xlanb: {plan.name} got tensors on different devices: "
                           + ", ".join(str(t.device) for t in tensors))
    lift = plan.lift
    # CPU torch answers outside the ``except`` blocks: its own error (a wrong-shape mask's
    # IndexError) must not arrive chained to xlanb's "no meta kernel" on the way there
    refused = None
    try:
        readable = (func, readable_sig(args, lift),
                    tuple((k, readable_sig(v, lift)) for k, v in kwargs.items()),
                    readable_sig(outs, lift))
        info = new_info(plan, func, readable, args, kwargs, tensors, scalars, device, out_args)
    except UnsupportedDtypeError as e:
        # a result the device cannot hold: no CPU fallback either (its result would have
        # to come back), so the op raises here, at its own line, in every mode
        _note_op(e, func._schema.name)
        raise
    except NotImplementedError as e:
        if session.direct or plan.kind == "view":
            raise
        refused = e
    except (RuntimeError, IndexError, ValueError, TypeError) as e:
        if session.direct or plan.kind == "view":
            raise
        refused = e
    if isinstance(refused, NotImplementedError):
        return _Answered(cpu_fallback(func, args, kwargs))
    if refused is not None:
        return _Answered(_meta_refused(func, args, {**kwargs, **(out_args or {})}, refused))
    if plan.name in _NO_IDENTITY and any(not t.numel() for t in tensors):
        _cpu_refuses_empty(plan, func, args, {**kwargs, **(out_args or {})})
    if outs and _out_casts(outs, info):
        # an out= of another dtype than the result: CPU torch's casting rules decide
        # (its meta kernels accept casts its CPU kernels refuse: neg(int, out=float))
        _cpu_accepts(func, args, {**kwargs, **out_args})
    return info


# -- write-backs: what a recorded or run node becomes, by the op's kind

def _write_functional(func, plan, info, node, args, kwargs, outs, device):
    return wrap_results(node, info, device)


def _write_out(func, plan, info, node, args, kwargs, outs, device):
    """``out=``: each result cast into its out tensor (resized when its shape differs)."""
    results = [node] if not info.multi else [output_node(node, info, i) for i in range(len(info.out))]
    for o, n, m in zip(outs, results, _out_metas(info)):
        if tuple(o.shape) != m.shape:
            resize_out(o, cast_node(n, m, o.dtype, device), m)
            continue
        write(o, cast_node(n, m, o.dtype, device))
    if not func._schema.returns:
        return None
    return outs[0] if len(outs) == 1 else tuple(outs)


def _write_inplace(func, plan, info, node, args, kwargs, outs, device):
    self_t = args[0]
    write(self_t, cast_node(node, info.out, self_t.dtype, device))
    return self_t


def _write_mutating(func, plan, info, node, args, kwargs, outs, device):
    """The functional op returns the op's results, then the mutated arguments' new values
    (a list argument, as in ``_foreach_add_``, takes one value per element)."""
    schema = func._schema
    n_ret = len(schema.returns)
    outs = wrap_results(node, info, device)
    outs = outs if isinstance(outs, tuple) else (outs,)
    k = n_ret
    for pos in plan.mutated:
        target = args[pos] if pos < len(args) else kwargs.get(schema.arguments[pos].name)
        for t in (target if isinstance(target, (list, tuple)) else (target,)):
            new = outs[k]
            k += 1
            if t is not None:
                write(t, cast_node(value_node(new), new._meta, t.dtype, device))
    if n_ret == 0:
        return None
    res = outs[:n_ret]
    return res[0] if n_ret == 1 else res


_WRITE_BACK = {"functional": _write_functional, "out": _write_out,
               "inplace": _write_inplace, "mutating": _write_mutating}


def _out_metas(info: OpSignature) -> list:
    """The result layouts an out= op writes into its out tensors, in order."""
    return [info.out] if not info.multi else list(info.out)


def _out_casts(outs: list, info: OpSignature) -> bool:
    return any(isinstance(m, TensorMeta) and o.dtype != m.dtype
               for o, m in zip(outs, _out_metas(info)))


# Ops that take CPU index tensors along with device tensors, as torch's do for cuda.
_HOST_INDICES_OK = frozenset(("aten::index", "aten::index_put", "aten::index_put_",
                              "aten::_index_put_impl_", "aten::_unsafe_index",
                              "aten::_unsafe_index_put"))


_CPU_CHECK_BYTES = 64 << 20

# Reductions with no identity: CPU torch refuses a zero-size input where its meta kernel
# does not, and XLA gives -inf/+inf or fails while tracing (JAX's "zero-size array").
_NO_IDENTITY = frozenset(("aten::max", "aten::min", "aten::amax", "aten::amin", "aten::argmax",
                          "aten::argmin", "aten::aminmax"))


def _cpu_refuses_empty(plan: OpPlan, func, args, kwargs) -> None:
    """CPU torch's error for a reduction of an empty input, as it raises it (type and
    message), with the op and the user's line; nothing if CPU torch accepts the call."""
    try:
        _cpu_accepts(func, args, kwargs)
    except Exception as e:
        _note_op(e, plan.name)
        raise


def _note_op(err: BaseException, name: str) -> None:
    """Name the op and the user's line in ``err`` (an error CPU torch decided)."""
    src = user_frame()
    note = f"xlanb: in {name}" + (f" at {src.short}" if src is not None else "")
    if note not in getattr(err, "__notes__", ()):
        err.add_note(note)


def _meta_refused(func, args, kwargs, err: Exception):
    """torch's meta kernel refused a call. CPU torch decides, as a user expects: on
    zeros of the same shapes and dtypes (nothing pending runs, no value moves), where
    its kernel raises its own error, with torch's type and message (meta kernels often
    raise another: a RuntimeError where CPU raises IndexError). Where CPU accepts the
    call, the meta kernel was stricter than torch: the op falls back to CPU torch on the
    real values. Inputs too big to copy as zeros keep the meta kernel's error."""
    try:
        if not _cpu_accepts(func, args, kwargs):
            raise err
    except Exception as e:
        _note_op(e, func._schema.name)
        raise
    return cpu_fallback(func, args, kwargs)


def _cpu_accepts(func, args, kwargs) -> bool:
    """Whether CPU torch's kernel accepts the call, run on zeros of the same shapes and
    dtypes (nothing pending runs, no value moves); raises CPU torch's own error where it
    refuses. False where the inputs are too big to copy as zeros (not checked)."""
    total = 0

    def zeros(x):
        nonlocal total
        if isinstance(x, XlaTensor):
            total += x.numel() * x.element_size()
            with torch._C._DisableTorchDispatch():
                return torch.zeros(tuple(x.shape), dtype=x.dtype)
        if isinstance(x, (list, tuple)):
            return type(x)(zeros(e) for e in x)
        if isinstance(x, torch.device) and x.type == "xla":
            return torch.device("cpu")
        if isinstance(x, str) and x.startswith("xla"):
            return "cpu"
        return x
    cpu_args = [zeros(a) for a in args]
    cpu_kwargs = {k: zeros(v) for k, v in kwargs.items()}
    if total > _CPU_CHECK_BYTES:
        return False
    try:
        with torch._C._DisableTorchDispatch(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            func(*cpu_args, **cpu_kwargs)
    except Exception as cpu_err:
        raise cpu_err from None
    return True


def _byte_masks(args):
    """uint8 index tensors are boolean masks, deprecated, as torch reads them (its meta
    kernels refuse them, so they become bool here, with torch's warning)."""
    indices = args[1]
    if not isinstance(indices, (list, tuple)) or not any(
            isinstance(i, torch.Tensor) and i.dtype == torch.uint8 for i in indices):
        return args
    # torch warns once per uint8 index tensor, every time (PyTorch's test_indexing counts
    # them), at the user's line. A fixed stack level could not say where that is: the
    # first call of a signature takes more frames than a planned one, and a level that
    # lands on one of xlanb's or torch's lines is shown once per that line, not per use.
    message = ("indexing with dtype torch.uint8 is now deprecated, please use a dtype "
               "torch.bool instead.")
    for i in indices:
        if isinstance(i, torch.Tensor) and i.dtype == torch.uint8:
            loc = user_frame()
            if loc is not None:
                warn_at(loc, message, UserWarning)
            else:
                warnings.warn(message, UserWarning, stacklevel=2)
    fixed = type(indices)(i.to(torch.bool) if isinstance(i, torch.Tensor) and i.dtype == torch.uint8
                          else i for i in indices)
    return (args[0], fixed, *args[2:])


def _has_host_tensor(args, kwargs) -> bool:
    for a in (*args, *kwargs.values()):
        if isinstance(a, torch.Tensor):
            if type(a) is not XlaTensor:
                return True
        elif isinstance(a, (list, tuple)):
            if any(isinstance(e, torch.Tensor) and type(e) is not XlaTensor for e in a):
                return True
    return False


def _host_operands(plan: OpPlan, args, kwargs):
    """Match torch's device rules for CPU tensors passed to an op on xla: a 0-dim CPU
    tensor is a scalar operand on any device, and moves to the op's device (xla:1 too);
    CPU index tensors are accepted by indexing ops; any other CPU tensor is the
    same-device error torch raises for cuda and cpu."""
    device = None
    for a in (*args, *kwargs.values()):
        for e in (a if isinstance(a, (list, tuple)) else (a,)):
            if type(e) is XlaTensor:
                device = e._storage.device
                break
        if device is not None:
            break
    if device is None:
        return args, kwargs  # no xla tensor: a factory or fallback decides

    def move(x):
        if isinstance(x, torch.Tensor) and type(x) is not XlaTensor:
            if x.device.type == "cpu" and (x.dim() == 0 or plan.name in _HOST_INDICES_OK):
                return from_host(x, device)
            raise RuntimeError("Expected all tensors to be on the same device, but found at "
                               f"least two devices, xla:{device} and {x.device}! "
                               f"(in {plan.name})")
        if isinstance(x, (list, tuple)):
            return type(x)(move(e) for e in x)
        return x
    return tuple(move(a) for a in args), {k: move(v) for k, v in kwargs.items()}


_CHECKED_INDEX_MAX = 4096


def _check_host_indices(plan: OpPlan, args) -> list:
    """Indexing with a list of index tensors (``a[i, j]``, ``index_put_``): checked against
    the shape they index (``_check_known_indices``) before they move to the device."""
    if plan.name in _HOST_INDICES_OK and not session.direct and len(args) > 1 \
            and isinstance(args[1], (list, tuple)):
        return _check_known_indices(args[0], args[1], plan.name)
    return []


def _check_known_indices(t, indices, op: str) -> list:
    """XLA clamps an out-of-range index where torch raises: each index tensor of
    ``indices`` is checked against the dimension of ``t`` it indexes (``_check_index``).
    Returns the checks left to a graph."""
    if not isinstance(t, torch.Tensor):
        return []
    graph_checks = []
    dim = 0
    k = 0  # torch's message counts the dimensions indexed by tensors only
    for idx in indices:
        if idx is None:
            dim += 1
            continue
        if idx.dtype in (torch.bool, torch.uint8):  # a mask covers idx.dim() dims
            dim += idx.dim()
            k += idx.dim()
            continue
        if idx.numel() and dim < t.dim() and not idx.dtype.is_floating_point:
            n = t.shape[dim]
            where = f"dimension {k}" if n else "dimension"  # torch's two messages
            c = _check_index(IndexCheck(idx, -n, n, lambda v, where=where, n=n: IndexError(
                f"index {v} is out of bounds for {where} with size {n}")), idx, op)
            if c is not None:
                graph_checks.append(c)
        dim += 1
        k += 1
    return graph_checks


_PENDING = object()


def _index_range(idx: XlaTensor, ignore, measure=None):
    """(min, max) of an index tensor's values, or of their ``measure`` (without
    ``ignore``) where the host has them or can get them without a sync: kept from the
    host (from_host), or, with ``config.check_device_indices``, read back when computed
    (eager mode) or already materialized (an index too big to read back whole is reduced
    on the device). ``_PENDING`` for a pending index (lazy, opbyop), which the sync that
    computes it checks in its graph; None when empty or unchecked."""
    if not idx._view:
        host = host_values.get(idx._storage.node)
        if host is not None:
            return host_range(host, ignore, measure)
    if not config.check_device_indices:
        return None
    node = idx._storage.node if not idx._view else None
    if node is None or node.data is None:
        state = mode_state()
        if state.recording:
            return _PENDING  # recorded: checked in the graph of the sync that computes it
        if state.deferred:
            # eager ops wait on background compiles: compute the index alone, as a look
            # does (the waiting ops stay as they are), rather than run them all now;
            # a small one on CPU torch, where its ops would compile alone
            if idx.numel() <= _CHECKED_INDEX_MAX:
                host = host_look(value_node(idx))
                if host is not None:
                    return host_range(host, ignore, measure)
            arr = peek_node(value_node(idx))
            if idx.numel() <= _CHECKED_INDEX_MAX:
                return host_range(array_to_host(arr), ignore, measure)
            return device_range(arr, ignore, measure)
    if idx.numel() <= _CHECKED_INDEX_MAX:
        return host_range(to_host(idx, cause="index bounds check"), ignore, measure)
    return device_range(node_array(value_node(idx), cause="index bounds check"), ignore,
                        measure)


def _check_index(c: IndexCheck, idx, op: str) -> IndexCheck | None:
    """Raise CPU torch's error now where the values of ``c``'s index ``idx`` (an xla or
    CPU tensor, or a Python int) are known (``_index_range``) and out of range. Returns
    the check a graph runs instead, to be guarded by the op's result: a pending index's,
    the next sync's; inside ``xlanb.compile``, every device index's, so that replays on
    other values are checked too. None when nothing is left to check."""
    if type(idx) is XlaTensor:
        found = _index_range(idx, c.ignore, c.measure)
    elif isinstance(idx, torch.Tensor):
        found = host_range(idx, c.ignore, c.measure)
    else:
        found = (idx, idx)
    v = c.bad_value(*found) if found is not None and found is not _PENDING else None
    graph = found is _PENDING or (session.recorder is not None and type(idx) is XlaTensor
                                  and config.check_device_indices)
    if v is None and not graph:
        return None
    c.op = op
    c.src = user_frame()
    c.scope = scope_stack[-1] if scope_stack else ""
    if v is not None:
        raise index_error(c, v, "checked before it ran")
    return add_pending_check(c, value_node(idx))


def _checkable(idx: torch.Tensor, c: IndexCheck) -> bool:
    """An xla index tensor with values, of an index dtype unless ``c`` measures it
    (the op refuses the others itself)."""
    if type(idx) is not XlaTensor or not idx.numel():
        return False
    return c.measure is not None or not (idx.dtype.is_floating_point or idx.dtype.is_complex
                                         or idx.dtype == torch.bool)


def _check_index_operands(plan: OpPlan, args, kwargs) -> list:
    """Check the indices of ``plan``'s op (gather, scatter, index_select, embedding,
    nll_loss targets, ...; ``checks.INDEX_RULES``) as ``_check_index`` does. Returns the
    checks left to a graph."""
    try:
        checks = INDEX_RULES[plan.name](args, kwargs)
    except (IndexError, TypeError, AttributeError):  # a call torch's meta kernel let by
        return []
    graph_checks = []
    for c in checks:
        idx = c.index
        if isinstance(idx, torch.Tensor) and not _checkable(idx, c):
            continue
        c = _check_index(c, idx, plan.name)
        if c is not None:
            graph_checks.append(c)
    return graph_checks


def _settle_written_fills(func, plan: OpPlan, args, kwargs, outs) -> None:
    # State made on a training step's first call (optimizer moments from zeros_like,
    # caches from zeros) and written in place enters later steps' graphs as device data.
    # Making the fresh fill device data before its first write gives the first step that
    # same graph, so it compiles once, not twice.
    if plan.kind == "inplace":
        targets = (args[0],)
    elif plan.kind == "out":
        targets = outs
    else:
        names = func._schema.arguments
        targets = [args[p] if p < len(args) else kwargs.get(names[p].name) for p in plan.mutated]
    for t in targets:
        for x in (t if isinstance(t, (list, tuple)) else (t,)):
            if isinstance(x, XlaTensor):
                node = x._storage.node
                if node.data is None and not node.info.multi:
                    value = fill_value(node)
                    if value is not None:
                        settle_fill(node, value)


def _factory_device(kwargs) -> int:
    return device_index(kwargs.get("device"))


# Views whose result offset is an argument (absolute), not relative to the input's: their
# signature keeps the offsets, as in-place ops' do.
_ABSOLUTE_VIEWS = frozenset({"aten::as_strided"})


def _view_meta(info: OpSignature, m, src: XlaTensor):
    """``m`` (a result layout of the view ``info``, made for the input layout it first
    saw) for ``src``, which may lie at another offset of its storage: the result moves
    with it, scaled by the element sizes (view_as_real doubles an offset)."""
    moved = src._meta.offset - info.in_metas[0].offset
    if not moved:
        return m
    moved = moved * src._meta.dtype.itemsize // m.dtype.itemsize
    return m._replace(offset=m.offset + moved)


def _view_result(func, info: OpSignature, src: XlaTensor):
    storage = src._storage
    node = apply_op(info, (value_node(src),), ())
    waiting = mode_state().deferred and node.data is None  # eager, waiting on a compile
    if not info.multi:
        t = XlaTensor(_view_meta(info, info.out, src), storage, src._view + ((info, None),), node)
        if waiting:
            track_view(t)
        return t
    res = []
    for i, m in enumerate(info.out):
        res.append(XlaTensor(_view_meta(info, m, src), storage, src._view + ((info, i),),
                             output_node(node, info, i)))
        if waiting:
            track_view(res[-1])
    return res if func._schema.returns[0].type.kind() == "ListType" else tuple(res)


def _inplace_view(func, args, kwargs):
    # An in-place view op changes the tensor's own shape: it becomes the view of its old
    # self, and torch's C++ metadata (sizes, strides) is updated by the op itself.
    t = args[0]
    v = dispatch(_plan(func).fop, args, kwargs)
    with torch._C._DisableTorchDispatch():
        func(*args, **kwargs)
    t._meta, t._view, t._node, t._ver, t._key = v._meta, v._view, v._node, v._ver, v._key
    return t


def _no_result(func, args, kwargs):
    # Nothing to compute (aten._linalg_check_errors): XLA has no error path; the results
    # of a failed factorization hold NaNs instead of raising as LAPACK does.
    return None


def _as_strided(func, args, kwargs):
    # as_strided's sizes and strides index the storage, not the view: apply it to the
    # base (whose layout is the storage's when it is contiguous), as torch does.
    src = args[0]
    if not src._view:
        return NotImplemented
    s = src._storage
    if s.meta.stride != contiguous_strides(s.meta.shape) or s.meta.offset:
        raise NotImplementedError("xlanb: as_strided of a view of a non-contiguous base")
    size, stride = args[1], args[2]
    offset = args[3] if len(args) > 3 else kwargs.get("storage_offset")
    if offset is None:
        offset = src.storage_offset()
    base = XlaTensor(s.meta, s)
    return dispatch(func, (base, size, stride, offset), {})


def _identity_view(func, args, kwargs):
    # detach/alias: a new tensor over the same storage and view chain, no node.
    src = args[0]
    t = XlaTensor(src._meta, src._storage, src._view, src._node)
    t._ver = src._ver
    return t


def _copy_(func, args, kwargs):
    dst, src = args[0], args[1]
    dst_x, src_x = isinstance(dst, XlaTensor), isinstance(src, XlaTensor)
    if dst_x and src_x and dst._storage.device == src._storage.device:
        return NotImplemented  # device to device: an ordinary op
    if dst_x:
        # Host (or other device) to this device: a fresh leaf, converted on the host.
        if src_x:
            src = to_host(src, cause="copy between xla devices")
        if src.dtype != dst.dtype or tuple(src.shape) != tuple(dst.shape):
            src = src.to(dst.dtype).expand(dst.shape)
        leaf = from_host(src, dst._storage.device)
        write(dst, value_node(leaf))
        return dst
    host = to_host(src, cause="copy to CPU")
    with torch._C._DisableTorchDispatch():
        dst.copy_(host)
    return dst


def _to_copy(func, args, kwargs):
    src = args[0]
    device = kwargs.get("device")
    if device is None:
        return NotImplemented
    device = torch.device(device)
    kw = {k: v for k, v in kwargs.items() if k not in ("device", "pin_memory", "non_blocking")}
    if device.type == "cpu":
        host = to_host(src, cause="value needed by .cpu()/.to('cpu')")
        return host.to(dtype=kw["dtype"]) if kw.get("dtype") is not None else host
    if device.type == "xla" and (device.index or 0) != src._storage.device:
        host = to_host(src, cause="copy between xla devices")
        if kw.get("dtype"):
            host = host.to(kw["dtype"])
        return from_host(host, device.index or 0)
    kwargs = {k: v for k, v in kwargs.items() if k != "device"}
    if not kwargs:
        kwargs = {"dtype": src.dtype}
    return dispatch(aten._to_copy.default, args, kwargs)


def _lift_fresh(func, args, kwargs):
    # torch.tensor(data, device="xla") marks its fresh result: the tensor itself (torch's
    # kernel returns self), not a copy, which would lose the host values from_host kept.
    # Inside torch.compile's trace the data is made for real and FakeTensorMode refuses
    # the xla tensor: its fake stands in, as a CPU tensor's does. Handed back real, it
    # met fake tensors in the next op (transformers' KV cache: torch.tensor([]) then cat)
    fake_mode = torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE)
    if fake_mode is not None:
        return fake_mode.from_tensor(args[0])
    return args[0]


def _local_scalar_dense(func, args, kwargs):
    return to_host(args[0], cause="value needed by .item()").item()


def _device_bool(t: XlaTensor, cause: str) -> bool:
    return bool(to_host(t, cause=cause).item())


def _equal(func, args, kwargs):
    # A Python bool: computed on the device, then fetched (a sync, as in torch_xla).
    a, b = args[0], args[1]
    if tuple(a.shape) != tuple(b.shape):
        return False
    same = dispatch(aten.all.default, (dispatch(aten.eq.Tensor, (a, b), {}),), {})
    return _device_bool(same, "value needed by torch.equal")


def _allclose(func, args, kwargs):
    close = dispatch(aten.isclose.default, args, kwargs)
    return _device_bool(dispatch(aten.all.default, (close,), {}), "value needed by torch.allclose")


def _is_nonzero(func, args, kwargs):
    return _device_bool(args[0], "value needed by bool()")


def _prim_as_aten(func, args, kwargs):
    # A prim with no lowering runs as the aten function torch gives for it (``impl_aten``:
    # torch.conj for prims.conj, torch.real for prims.real), whose ops xlanb has: a view
    # prim stays a view of its input, where a host fallback would copy it. Called from
    # here, below autograd, aten::real would come back undecomposed (a view xlanb cannot
    # write through into a complex base): its composite kernel (view_as_real, select) runs
    # instead, as it does for torch.real outside.
    packet = getattr(aten, func._opname, None)
    if _plan(func).kind == "view" and packet is not None and "default" in packet.overloads():
        try:  # (aten.ne.default is TorchScript's ne(Scalar, Scalar), no dispatcher op)
            composite = torch._C._dispatch_has_kernel_for_dispatch_key(
                packet.default.name(), "CompositeImplicitAutograd")
        except RuntimeError:
            composite = False
        if composite:
            return packet.default.decompose(*args, **kwargs)
    return func.impl_aten(*args, **kwargs)


def _is_same_size(func, args, kwargs):
    return tuple(args[0].shape) == tuple(args[1].shape)


def _one_hot(func, args, kwargs):
    # num_classes=-1: the largest class + 1, read back as CPU torch does (the result's
    # shape depends on it); an empty or non-int64 index goes on to torch's error
    index = args[0]
    n = args[1] if len(args) > 1 else kwargs.get("num_classes", -1)
    if n != -1 or not index.numel() or index.dtype != torch.int64:
        return NotImplemented
    top = to_host(dispatch(aten.max.default, (index,), {}), cause="one_hot's class count")
    return dispatch(func, (index, int(top) + 1), {})


def _native_batch_norm(func, args, kwargs):
    # The CPU kernel updates running stats in place although the schema does not say so;
    # the _legit op says so, and has a functional variant.
    if len(args) > 5 and args[5] and args[3] is not None:
        return dispatch(aten._native_batch_norm_legit.default, args, kwargs)
    return NotImplemented


SPECIAL = {
    aten.detach.default: _identity_view,
    aten.alias.default: _identity_view,
    aten.native_batch_norm.default: _native_batch_norm,
    aten.one_hot.default: _one_hot,
    aten.copy_.default: _copy_,
    aten._to_copy.default: _to_copy,
    aten._local_scalar_dense.default: _local_scalar_dense,
    aten.is_same_size.default: _is_same_size,
    aten.equal.default: _equal,
    aten.as_strided.default: _as_strided,
    aten.allclose.default: _allclose,
    aten.is_nonzero.default: _is_nonzero,
    aten.lift_fresh.default: _lift_fresh,
    aten.resize_.default: resize_,
    aten.resize_as_.default: resize_,
    aten.set_.source_Storage: set_,
    aten.set_.source_Storage_storage_offset: set_,
    aten.set_.source_Tensor: set_,
    aten.set_.source_Tensor_storage_offset: set_,
}


set_handler("dispatch", dispatch)
set_handler("torch_dispatch", torch_dispatch)
