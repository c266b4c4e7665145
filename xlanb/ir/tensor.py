"""The torch side of the xla device: ``XlaTensor``, its storage, and views that alias.

An ``XlaTensor`` is a wrapper subclass: torch sees its shape, strides and dtype, and every
aten op on it (below autograd) arrives in ``__torch_dispatch__``, which hands it to the
handler ``xlanb.dispatch`` installs (see ``set_handler``: this module sits below the
layers that run ops, read values and print them, so they plug themselves in). Its value lives in a ``Storage``: the IR node holding the base
tensor's current value. Views share their base's storage and remember the chain of view
ops that leads from it, so writing through a view updates the base, and reading a view
after its base changed replays the chain.
"""
from __future__ import annotations


import torch

from ..base.caches import cache
from .nodes import Node, TensorMeta, contiguous_strides

_TORCH_DEVICES: dict[int, torch.device] = {}


def torch_device(index: int) -> torch.device:
    d = _TORCH_DEVICES.get(index)
    if d is None:
        d = _TORCH_DEVICES[index] = torch.device("xla", index)
    return d


class SigKey:
    """A tensor's element in an op signature: its (shape, stride, dtype, device),
    interned once per distinct layout. Not its storage offset: a functional op's result
    does not depend on where its input lies in its storage, and ``op(s) for s in x``
    would otherwise make one signature, and one compile, per row; in-place and out= ops,
    whose result lies where their inputs do, add the offsets to their signature
    (dispatcher._dispatch_general). A view does not: its result's offset moves with its
    input's (dispatcher._view_meta). Signatures hash and compare it by identity, which
    is fast, and no static argument (an int, a bool, a tuple) can ever equal it: an int
    key could, and ``mul(x, t)`` would then find the OpSignature of ``mul(x, 3)``."""

    __slots__ = ("layout",)

    def __init__(self, layout: tuple):
        self.layout = layout

    def __repr__(self) -> str:
        return f"<SigKey {self.layout}>"


_sig_keys = cache({}, "(shape, stride, dtype, device) -> SigKey")


def sig_key(meta: TensorMeta, device: int) -> SigKey:
    full = (meta.shape, meta.stride, meta.dtype, device)
    k = _sig_keys.get(full)
    if k is None:
        k = _sig_keys[full] = SigKey(full)
    return k


class Storage:
    """The current value of a base tensor, shared by all of its views."""

    # ``born``: (line, scope, op) of the value it was made with, set at its first write
    # (record.write), so memory_by_line credits a weight to the line that made it, not
    # to the optimizer step that last updated it. Unset until then: no cost per op.
    __slots__ = ("node", "version", "device", "meta", "placed", "born", "address", "__weakref__")

    def __init__(self, node: Node, meta: TensorMeta, device: int):
        self.node = node
        self.version = 0          # bumped on every write; views compare against it
        self.device = device
        self.meta = meta          # the base tensor's shape/stride/dtype
        # SPMD: the sharding of the device data this storage held before its pending
        # write, so that a graph that updates it in place keeps it where it was
        self.placed = None


class XlaTensor(torch.Tensor):
    """A tensor on the ``xla`` device."""

    # No __torch_function__ layer: ops go straight to the aten level.
    __torch_function__ = torch._C._disabled_torch_function_impl

    # What a view holds: the view ops from its base's value ((OpSignature, output index | None),
    # ...), and its cached value (valid while _ver == storage.version). Class defaults,
    # so that a fresh base tensor (most results) sets only what it has.
    _view: tuple = ()
    _node: Node | None = None
    _ver: int = 0

    @staticmethod
    def __new__(cls, meta: TensorMeta, storage: Storage, view: tuple = (), node: Node | None = None):
        d = storage.device
        t = torch.Tensor._make_wrapper_subclass(
            cls, meta.shape, strides=meta.stride, storage_offset=meta.offset,
            dtype=meta.dtype, device=torch_device(d))
        t._storage = storage
        t._meta = meta
        t._key = sig_key(meta, d)  # this tensor's signature element
        if view:
            t._view = view
            t._node = node
            t._ver = storage.version
        return t

    def __init__(self, *args, **kwargs):
        pass

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        # replaced at import by dispatch/dispatcher.py's (set_handler("torch_dispatch", ...)), which
        # is one Python frame less on every op
        __debuggerskip__ = True  # IPython's debugger steps over xlanb frames
        return _dispatch(func, args, kwargs or {})

    def __repr__(self, *, tensor_contents=None) -> str:
        __debuggerskip__ = True  # IPython's debugger steps over xlanb frames
        return _handlers.repr(self)

    def __format__(self, spec: str) -> str:
        __debuggerskip__ = True  # IPython's debugger steps over xlanb frames
        if self.dim() == 0 and spec:
            return format(_handlers.scalar_value(self), spec)
        return repr(self)

    # The traceable-subclass protocol makes nn.Module.to("xla") swap each parameter in
    # place (torch.utils.swap_tensors) instead of wrapping a new Parameter per module, so
    # tied weights (BERT's decoder and word embeddings) stay one Parameter on the device.
    # It is also how torch.compile fakes its inputs. XlaTensor holds no inner tensors (its
    # value lives in the IR), so unflattening builds a plain FakeTensor on the xla device:
    # dynamo traces with meta kernels and never reaches __torch_dispatch__. The context is
    # small and equal for all tensors of one dtype and device because dynamo deep-copies
    # it into a guard and compares it on every call.
    def __tensor_flatten__(self):
        return [], (self._storage.device, self.dtype)

    @staticmethod
    def __tensor_unflatten__(inner_tensors, ctx, outer_size, outer_stride):
        device, dtype = ctx
        fake_mode = torch._guards.detect_fake_mode()
        if fake_mode is None:
            raise NotImplementedError("xlanb: an XlaTensor can only be unflattened into a fake "
                                      "tensor (inside torch.compile or a FakeTensorMode)")
        with fake_mode:
            return torch.empty_strided(outer_size, outer_stride, dtype=dtype,
                                       device=torch_device(device))

    def data_ptr(self) -> int:
        """Where this tensor starts in its storage, as an address: equal for tensors that
        share a storage at the same offset (a view and its base), different across
        storages, as torch's pointers compare. Like a CUDA pointer it cannot be read
        from the host (an XLA buffer has no fixed address, and a pending tensor none at
        all): each storage gets a range of its own in an address space xlanb keeps."""
        s = self._storage
        try:
            base = s.address
        except AttributeError:
            base = s.address = _storage_address(s.meta)
        return base + self.storage_offset() * self.element_size()

    def untyped_storage(self) -> torch.UntypedStorage:
        """torch's storage object of this tensor (``.storage()`` wraps it), whose
        ``data_ptr()`` is the address of xlanb's storage (see ``data_ptr``): a view's and
        its base's are equal. It holds no bytes a host could read."""
        st = super().untyped_storage()
        if type(st) is not XlaUntypedStorage:
            st.__class__ = XlaUntypedStorage  # the same object, one method more
        st._xlanb_address = self.data_ptr() - self.storage_offset() * self.element_size()
        st._xlanb_storage = self._storage  # for set_(storage, ...)
        return st

    def __bool__(self) -> bool:
        __debuggerskip__ = True  # IPython's debugger steps over xlanb frames
        # Its own cause: "if loss > 0:" cuts the graph, and the user should see it was bool.
        if self.numel() != 1:
            raise RuntimeError("Boolean value of Tensor with more than one value is ambiguous")
        return bool(_handlers.to_host(self, cause="value needed by bool()").item())

    def tolist(self):
        __debuggerskip__ = True  # IPython's debugger steps over xlanb frames
        return _handlers.to_host(self, cause="value needed by .tolist()").tolist()

    def __reduce_ex__(self, protocol):
        # Pickle (torch.save) through a CPU copy, with torch's own rebuild function, which
        # torch.load's weights_only unpickler already trusts.
        return (torch._utils._rebuild_device_tensor_from_cpu_tensor,
                (self.detach().cpu(), self.dtype, str(self.device), self.requires_grad))

    def __deepcopy__(self, memo):
        if id(self) in memo:
            return memo[id(self)]
        with torch.no_grad():
            new = self.clone()
        if self.requires_grad:
            new.requires_grad_(True)
        if getattr(self, "_is_param", False) or isinstance(self, torch.nn.Parameter):
            new = torch.nn.Parameter(new, requires_grad=self.requires_grad)
        memo[id(self)] = new
        return new


class XlaUntypedStorage(torch.UntypedStorage):
    """The storage object torch keeps for an xla tensor, with the address of xlanb's
    storage as its ``data_ptr()`` (torch's own has none: a wrapper holds no memory)."""

    def data_ptr(self) -> int:
        return self._xlanb_address


_next_address = 1 << 40  # far from 0: no storage starts at the null pointer


def _storage_address(meta: TensorMeta) -> int:
    """A fresh range for a storage of ``meta``'s bytes (never reused, 64-byte aligned)."""
    global _next_address
    n = 1
    for d, st in zip(meta.shape, meta.stride):
        n += (d - 1) * st if d else 0
    size = (meta.offset + n) * torch._utils._element_size(meta.dtype)
    addr = _next_address
    _next_address += (size + 127) // 64 * 64
    return addr


class _Handlers:
    """What the tensor calls into the layers above it for. Each is installed at import by
    the module that implements it, through ``set_handler``."""
    __slots__ = ("dispatch", "torch_dispatch", "repr", "scalar_value", "to_host")

    def __init__(self):
        for name in self.__slots__:
            setattr(self, name, _missing(name))


def _missing(name: str):
    def fail(*args, **kwargs):
        raise RuntimeError(f"xlanb: no {name} handler installed (import xlanb first)")
    return fail


_handlers = _Handlers()
_dispatch = _handlers.dispatch  # the hot path reads it as a module global


def dispatch_op(func, args, kwargs):
    """Run the aten op ``func`` on xla tensors as ``__torch_dispatch__`` would: for the
    layers below the dispatcher that need an op of their own (a dtype cast, a copy)."""
    return _dispatch(func, args, kwargs)


def set_handler(name: str, fn) -> None:
    """Install ``fn`` as the tensor's ``name`` handler: ``dispatch(func, args, kwargs)``
    and ``torch_dispatch`` (``__torch_dispatch__`` itself; dispatch/dispatcher.py), ``repr(t)`` and
    ``scalar_value(t)`` (inspect/repr.py), or ``to_host(t, cause=...)`` (dispatch/reads.py)."""
    if name not in _Handlers.__slots__:
        raise ValueError(f"unknown tensor handler {name!r}")
    setattr(_handlers, name, fn)
    if name == "dispatch":
        global _dispatch
        _dispatch = fn
    elif name == "torch_dispatch":  # torch looks it up on the class for every op
        XlaTensor.__torch_dispatch__ = classmethod(fn)


_make_wrapper = torch.Tensor._make_wrapper_subclass


class BaseLayout:
    """How to make fresh base tensors of one layout on one device, worked out once: an
    op's results all share it, and making them is most of what recording an op costs."""

    __slots__ = ("meta", "device", "key", "wrapper_args")

    def __init__(self, meta: TensorMeta, device: int):
        self.meta = meta
        self.device = device
        self.key = sig_key(meta, device)
        # torch's own default layout needs no strides or offset passed (which is quicker)
        default = meta.stride == contiguous_strides(meta.shape) and not meta.offset
        self.wrapper_args = (XlaTensor, meta.shape, None if default else meta.stride,
                             None if default else meta.offset, None, meta.dtype,
                             torch.strided, torch_device(device))


def new_base(layout: BaseLayout, node: Node) -> XlaTensor:
    """A fresh base tensor whose value is ``node`` (the hot path's ``new_tensor``)."""
    t = _make_wrapper(*layout.wrapper_args)
    meta = layout.meta
    t._storage = Storage(node, meta, layout.device)
    t._meta = meta
    t._key = layout.key
    return t


def new_tensor(node: Node, meta: TensorMeta, device: int) -> XlaTensor:
    """A fresh base tensor whose value is ``node``."""
    return XlaTensor(meta, Storage(node, meta, device))
