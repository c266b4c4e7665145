"""Registers the ``xla`` device with torch, in pure Python (``torch._C._acc``; the torch
versions that have it: base/torch_compat.py).

torch's PrivateUse1 backend is renamed to ``xla``; a Python device guard and hooks make
``.to("xla")`` and ``device="xla"`` legal; kernels for the few ops that create tensors on
the device (``empty``, ``empty_strided``, ``_copy_from``...) return ``XlaTensor``s, after
which every op reaches ``XlaTensor.__torch_dispatch__``.
"""
from __future__ import annotations

import contextlib
import ctypes
import functools
import gc
import itertools
import operator
import os
import queue
import signal
import sys
import threading
import time
import types

import torch

from ..base import rng, torch_compat
from .dispatcher import dispatch
from ..ir.nodes import Node, TensorMeta, contiguous_strides
from ..ops.leaves import empty_info
from ..runtime import devices, shutdown
from ..runtime.devices import device_index
from ..ir.tensor import new_tensor

aten = torch.ops.aten

_registered = False
_lib = None


# Ctrl-C must never end the process (issue 37). C++ reaches Python from code that cannot
# carry a Python exception: ``PythonDeviceGuard::getStream`` is noexcept, and autograd calls
# it for every output of an op on an xla tensor (``set_history``), as the autograd engine
# does for streams. An exception there is std::terminate ("terminate called without an
# active exception", rc 134). Two ways a KeyboardInterrupt got there:
# - a guard method written in Python runs a pending SIGINT's handler at its first bytecode;
#   so the guard and hooks below are builtin callables that return a constant: they run no
#   bytecode (nor give debuggers a frame to step into);
# - before calling any override, pybind11's lookup (``get_type_override``) calls
#   ``PyObject_Str``, which calls ``PyErr_CheckSignals``, which runs the Python SIGINT
#   handler; the default one raises, and pybind11 throws the error on. So ``_on_sigint``
#   below replaces ``signal.default_int_handler``: it raises as that one does, except when
#   the C stack shows it was called from that lookup in libtorch_python, where it leaves
#   the interrupt for a moment later and has it delivered again (see ``_interrupt_later``).
# The same handler holds a Ctrl-C back while an import runs: the first op imports parts of
# torch (torch.distributed.tensor, sympy, torch._dynamo) and JAX, and a half-done import
# broke every later op (``module 'sympy' has no attribute 'core'``).
def _constant(value):
    """A builtin callable of no arguments that returns ``value``."""
    return itertools.repeat(value).__next__


class _Guard(torch._C._acc.DeviceGuard if hasattr(torch._C, "_acc") else object):
    type_ = _constant(torch._C._autograd.DeviceType.PrivateUse1)


class _Hooks(torch._C._acc.PrivateUse1Hooks if hasattr(torch._C, "_acc") else object):
    is_available = _constant(True)
    is_built = _constant(True)
    # has_primary_context(device_index) -> True: ``None is not device_index``, in C
    has_primary_context = functools.partial(operator.is_not, None)


class _DlInfo(ctypes.Structure):
    _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]


_STACK_DEPTH = 128  # C frames looked at; nested handlers each add about fifteen
_probe = None  # (backtrace, dladdr, address of PyObject_Str), or False where not available
_later: "queue.SimpleQueue | None" = None
_later_pid = 0


def _load_probe():
    try:
        libc = ctypes.CDLL(None)
        backtrace, dladdr = libc.backtrace, libc.dladdr
        backtrace.argtypes = (ctypes.POINTER(ctypes.c_void_p), ctypes.c_int)
        backtrace.restype = ctypes.c_int
        dladdr.argtypes = (ctypes.c_void_p, ctypes.POINTER(_DlInfo))
        dladdr.restype = ctypes.c_int
        to_str = ctypes.cast(ctypes.pythonapi.PyObject_Str, ctypes.c_void_p).value
        backtrace((ctypes.c_void_p * 4)(), 4)  # glibc loads its unwinder on the first call
        return backtrace, dladdr, to_str
    except (AttributeError, OSError, TypeError, ValueError):
        return False


def _in_override_lookup() -> bool:
    """Whether this thread's C stack holds ``PyObject_Str`` called from libtorch_python:
    pybind11 looking up a Python override, which must not see a Python exception."""
    backtrace, dladdr, to_str = _probe
    frames = (ctypes.c_void_p * _STACK_DEPTH)()
    info = _DlInfo()
    called_by = False  # the frame before was in PyObject_Str
    for i in range(backtrace(frames, _STACK_DEPTH)):
        if not frames[i] or not dladdr(frames[i] - 1, ctypes.byref(info)):
            called_by = False
            continue
        if called_by and info.dli_fname and b"libtorch_python" in info.dli_fname:
            return True
        called_by = info.dli_saddr == to_str
    return False


def _importing(frame) -> bool:
    """Whether ``frame`` runs inside an import (the first xla op imports parts of torch,
    sympy and JAX; an import cut in half leaves a module that later ops find broken)."""
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False


_IMPORT_GRACE_S = 10.0  # how long an import may hold back a Ctrl-C; past that it is delivered
_deferred_since: "float | None" = None


def _deliver_later() -> None:
    while True:
        main, delay = _later.get()
        time.sleep(delay)
        try:
            signal.pthread_kill(main, signal.SIGINT)
        except (OSError, ValueError):  # the main thread is gone: nothing to interrupt
            pass


def _interrupt_later(delay: float) -> None:
    """SIGINT to the main thread again after ``delay``, from a helper thread: a blocked
    wait is woken by a real signal, where a tripped flag would wait for the wait to end."""
    global _later, _later_pid
    if _later_pid != os.getpid():  # first use, or a forked child without the helper
        _later, _later_pid = queue.SimpleQueue(), os.getpid()
        threading.Thread(target=_deliver_later, name="xlanb-sigint", daemon=True).start()
    _later.put((threading.main_thread().ident, delay))


def _in_gc_callback(frame) -> bool:
    """Whether ``frame`` runs inside a garbage collector callback (JAX's
    ``_xla_gc_callback``): the collector prints an exception raised there and drops it,
    so a Ctrl-C would be lost."""
    codes = {getattr(cb, "__code__", None) for cb in gc.callbacks}
    while frame is not None:
        if frame.f_code in codes:
            return True
        frame = frame.f_back
    return False


def _in_backward(frame) -> bool:
    """Whether ``frame`` runs inside autograd's engine, on the thread that called backward
    (where the engine lacks a queue for xla: ``_run_backward``). A KeyboardInterrupt out
    of a node there aborts the process: unwinding, the engine's stream guard calls the
    device guard with the Python error still set. Where the engine's own thread runs the
    nodes, a Ctrl-C waits for the backward to end too (the caller waits in C++)."""
    code = _run_backward.__code__
    while frame is not None:
        if frame.f_code is code:
            return True
        frame = frame.f_back
    return False


def _exiting_while_compiling(frame) -> bool:
    """Whether the program has ended (the interpreter joins its threads:
    ``threading._shutdown`` is on the stack) while xlanb compiles in the background. A
    KeyboardInterrupt would end that join, and the interpreter would finalize under the
    compile, which crashes the process when it ends (runtime/shutdown.py)."""
    code = getattr(getattr(threading, "_shutdown", None), "__code__", None)
    while frame is not None:
        if frame.f_code is code:
            return shutdown.pending()
        frame = frame.f_back
    return False


def _exit_now() -> None:
    print("xlanb: Ctrl-C while exiting, during a compile that cannot be stopped: exiting "
          "now", file=sys.stderr)
    for f in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            f.flush()
    os._exit(130)


def _on_sigint(signum, frame):
    """``signal.default_int_handler``, except where a KeyboardInterrupt would do harm:
    inside pybind11's override lookup (it would end the process) it waits 2 ms; inside a
    garbage collector callback (it would be lost) likewise; inside a backward that runs on
    this thread (it would end the process) it waits for the backward to end; inside an
    import (it would leave a half-imported module behind) it waits for the import to end,
    at most ``_IMPORT_GRACE_S``; after the program ended, while xlanb compiles in the
    background, the process exits at once (exit status 130)."""
    global _deferred_since
    __tracebackhide__ = True  # noqa: F841  (IPython and pytest hide this frame)
    __debuggerskip__ = True  # noqa: F841
    try:
        if _probe and _in_override_lookup() or _in_gc_callback(frame):
            _interrupt_later(0.002)
            return
        if _in_backward(frame):
            _interrupt_later(0.01)
            return
        if _exiting_while_compiling(frame):
            _exit_now()
        if _importing(frame):
            now = time.monotonic()
            if _deferred_since is None:
                _deferred_since = now
            if now - _deferred_since < _IMPORT_GRACE_S:
                _interrupt_later(0.01)
                return
    except Exception:  # noqa: BLE001  (a broken probe: behave as the default handler)
        pass
    _deferred_since = None
    signal.default_int_handler(signum, frame)


def install_sigint_handler() -> bool:
    """Make Ctrl-C safe with the xla device (main thread; idempotent). Replaces only
    ``signal.default_int_handler``, also where ipykernel puts it back before each cell;
    a handler of the user's own is left alone. Returns whether ``_on_sigint`` is in place."""
    global _probe
    if _probe is None:
        _probe = _load_probe()
    kernelbase = sys.modules.get("ipykernel.kernelbase")  # never imported from here
    if getattr(kernelbase, "default_int_handler", None) is signal.default_int_handler:
        kernelbase.default_int_handler = _on_sigint  # ipykernel's pre_handler_hook
    try:
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            signal.signal(signal.SIGINT, _on_sigint)
    except ValueError:  # not the main thread: signals are the main thread's to set
        pass
    return signal.getsignal(signal.SIGINT) is _on_sigint


def _device_module() -> types.ModuleType:
    """``torch.xla``: what torch asks a device module for (seeding, counts)."""
    m = types.ModuleType("torch.xla")
    m.is_available = lambda: True
    m.is_initialized = lambda: True  # FakeTensor asks (torch.compile traces on device xla)
    m.device_count = devices.device_count
    m.current_device = lambda: 0
    m._is_in_bad_fork = lambda: False
    m.manual_seed = rng.manual_seed
    m.manual_seed_all = rng.manual_seed
    m.seed = lambda: rng.manual_seed(torch.initial_seed())
    m.seed_all = m.seed
    m.initial_seed = rng.initial_seed
    m.get_rng_state = lambda device=None: rng.get_rng_state()
    m.set_rng_state = lambda state, device=None: rng.set_rng_state(state)
    m.synchronize = lambda device=None: None
    # torch.utils.checkpoint keeps a device's RNG state across the recomputation (the same
    # dropout masks) only for an initialized module, inside its device(i) block; xlanb's
    # generator is one for every device
    m._initialized = True
    m.device = lambda device=None: contextlib.nullcontext()
    return m


def _empty(size, dtype, device, stride=None):
    shape = tuple(int(s) for s in size)
    dtype = dtype or torch.get_default_dtype()
    idx = device_index(device)
    meta = TensorMeta(shape, tuple(stride) if stride is not None else contiguous_strides(shape), dtype)
    return new_tensor(Node(empty_info(meta, idx)), meta, idx)


def _empty_memory_format(size, dtype=None, layout=None, device=None, pin_memory=None,
                         memory_format=None):
    return _empty(size, dtype, device)


def _empty_strided(size, stride, dtype=None, layout=None, device=None, pin_memory=None):
    return _empty(size, dtype, device, stride)


def _copy_from(self, dst, non_blocking=False):
    return dispatch(aten.copy_.default, (dst, self), {})


def _copy_from_and_resize(self, dst):
    return _copy_from(self, dst)


# Factories whose composite kernels make an empty tensor and then resize it through an
# out= op: wrapper tensors cannot be resized, so these go straight to dispatch.
_FACTORIES = ("arange", "arange.start", "arange.start_step", "linspace", "logspace", "eye",
              "eye.m", "randperm", "scalar_tensor", "triu_indices", "tril_indices",
              "_efficientzerotensor")


def _dispatch_kernel(op):
    def kernel(*args, **kwargs):
        return dispatch(op, args, kwargs)
    return kernel


# Autograd's engine and the xla device (issue 58). The engine gives each device index
# other than CPU's a ready queue and a thread, and sizes that list once, at the process's
# first backward (``Engine::start_device_threads``, a ``call_once``): one per index below
# the largest ``deviceCount()`` of the device guards registered at that moment. A CPU
# backward before ``import xlanb`` (a notebook's first cells, then ``%load_ext xlanb``)
# sizes it with no xla device, torch never sizes it again, and the first node on xla
# stops at torch's ``device_ready_queues_ ... INTERNAL ASSERT FAILED``. The Python guard's
# ``deviceCount()`` is 1, so ``xla:1`` and above have no queue in any order either. The one
# way torch runs a node that has no queue: autograd multithreading off (thread-local; AOT
# and compiled autograd turn it off too) runs every node on the thread that called
# backward. So while xlanb wraps torch.autograd's entry into the engine, the first
# backward asks the engine whether it has a queue for the highest xla index, with a probe
# on that index whose gradient the engine hands back untouched (no kernel runs, JAX is
# not started). Where it has, torch's entry is put back and nothing changes; where it has
# not, every backward runs with multithreading off, on the calling thread.
class _QueueProbe(torch.Tensor):
    """A tensor on one xla index with no data and no kernels: the engine picks a node's
    queue by its gradient's device, and a root's gradient is only handed back."""

    @staticmethod
    def __new__(cls, device, requires_grad):
        return torch.Tensor._make_wrapper_subclass(cls, (), device=device,
                                                   requires_grad=requires_grad)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        raise NotImplementedError(f"xlanb's autograd engine probe runs no op ({func})")


_engine_entry = None  # torch.autograd.graph._engine_run_backward, torch's own
_engine_checked = -1  # the highest xla index the engine was seen to have a queue for
_on_calling_thread = False  # it lacks one: every backward runs on the thread calling it


def _engine_has_queue(index: int) -> bool:
    root = _QueueProbe(f"xla:{index}", True)
    try:  # as torch.autograd.grad(root, root, grad) calls it
        _engine_entry((root,), (_QueueProbe(f"xla:{index}", False),), False, False,
                      (root,), False, accumulate_grad=False)
    except Exception:  # noqa: BLE001  (torch's internal assert; anything else: the safe way)
        return False
    return True


def _check_engine() -> None:
    global _engine_checked, _on_calling_thread
    # before JAX has devices no tensor is on xla yet (each one names its JAX device)
    known = devices.jax_devices.cache_info().currsize > 0
    last = devices.device_count() - 1 if known else 0
    if last > _engine_checked:
        if not _engine_has_queue(last):
            _on_calling_thread = True
            return
        _engine_checked = last
    if known:  # every xla index has a queue, for good: torch's entry goes back
        for module in (torch.autograd, torch.autograd.graph):
            if getattr(module, "_engine_run_backward", None) is _run_backward:
                module._engine_run_backward = _engine_entry


def _run_backward(*args, **kwargs):
    """torch.autograd's entry into the engine (``backward``, ``grad``), until xlanb knows
    whether the engine has a ready queue for every xla device (see above)."""
    if not _on_calling_thread:
        _check_engine()
    if _on_calling_thread:
        with torch.autograd.set_multithreading_enabled(False):
            return _engine_entry(*args, **kwargs)
    return _engine_entry(*args, **kwargs)


def _wrap_engine_entry() -> None:
    global _engine_entry
    import torch.autograd.graph
    _engine_entry = torch.autograd.graph._engine_run_backward
    torch.autograd.graph._engine_run_backward = _run_backward
    torch.autograd._engine_run_backward = _run_backward


def register() -> None:
    """Make ``torch.device("xla")`` real. Idempotent."""
    global _registered, _lib
    if _registered:
        return
    torch_compat.check()
    torch._C._acc.register_python_privateuseone_device_guard(_Guard())
    torch._C._acc.register_python_privateuseone_hook(_Hooks())
    _wrap_engine_entry()  # a backward before this sized autograd's queues without xla
    torch.utils.rename_privateuse1_backend("xla")
    torch._register_device_module("xla", _device_module())
    # autocast's policy needs the device module (torch asks it which dtypes autocast
    # takes, even for autocast(enabled=False), which torch.utils.checkpoint enters): the
    # lowering registry's import came before it existed, so it installs now
    from ..lowering import aten_autocast
    aten_autocast.install()
    _lib = torch.library.Library("aten", "IMPL")
    _lib.impl("empty.memory_format", _empty_memory_format, "PrivateUse1")
    _lib.impl("empty_strided", _empty_strided, "PrivateUse1")
    _lib.impl("_copy_from", _copy_from, "PrivateUse1")
    _lib.impl("_copy_from_and_resize", _copy_from_and_resize, "PrivateUse1")
    for name in _FACTORIES:
        packet, _, overload = name.partition(".")
        op = getattr(getattr(torch.ops.aten, packet), overload or "default")
        _lib.impl(name, _dispatch_kernel(op), "PrivateUse1")
    # one_hot is CompositeImplicitAutograd: for a tensor with the Python key torch
    # decomposes it as eq(index.unsqueeze(-1), arange(C)), without CPU's class checks (a bad
    # class gave a zero row). A kernel of its own brings it to dispatch whole, where its
    # classes are checked (values/checks.py).
    _lib.impl("one_hot", _dispatch_kernel(aten.one_hot.default), "PrivateUse1")
    # The MHA / TransformerEncoderLayer fast paths call fused CUDA-style kernels when they
    # see a PrivateUse1 backend; the composite path lowers cleanly.
    torch.backends.mha.set_fastpath_enabled(False)
    install_sigint_handler()
    _registered = True
