"""Ending the process while XLA compiles in the background, within a second of the
program's last line, without a crash and with the program's own exit status.

XLA cannot stop a compile, and the interpreter must not finalize while a compile thread
is inside XLA: a thread that wants the GIL back during finalization is ended with
``pthread_exit``, whose unwinding through XLA's C++ aborts the process ("terminate called
without an active exception", "FATAL: exception not rethrown"). Waiting for the compile
(what xlanb did) kept a script that ran one BERT step 4 s past its last line, for a
tier-up nobody would use, and up to 600 s for a big one.

So when the program ends (``threading._shutdown``, before the interpreter joins its
threads) with a compile in flight, this module:

1. ends the program as the interpreter would, in its order: the other threading exit
   hooks (``concurrent.futures`` joins its workers), then every non-daemon thread of the
   program (xlanb's compile threads are daemons: never joined);
2. drops the compiles not yet started and refuses new background work (``add_work``'s
   ``stop``);
3. waits ``GRACE_S`` for the running ones (one that finishes is stored, signed, for the
   next process); if they are done, the interpreter ends normally;
4. otherwise runs the ``atexit`` handlers (but JAX's ``clean_up``, which tears down the
   client the compile uses), flushes and closes the open files, lets the store finish or
   undo a write in progress (``before_exit``: nothing half-written stays), and ends the
   process with ``os._exit`` and the status the interpreter would have given: 0, a
   ``sys.exit`` code (a string printed, then 1), 1 for an uncaught exception, death by
   SIGINT for an uncaught KeyboardInterrupt. Objects' ``__del__`` do not run then.

That status comes from the exception that ended the program: the one ``sys.exit`` raised
(``sys.exit`` is wrapped to keep it) or ``sys.last_value`` (an uncaught exception), checked
to have ended the main module's frame, and from the C function that called
``Py_FinalizeEx`` (glibc's ``backtrace``): ``Py_Exit`` (a SystemExit ended a script) or
``Py_RunMain`` (the program returned or raised). Where that is not known for certain (a
``raise SystemExit(n)`` or ``exit(n)`` of the program's own; a ``python -m`` program that
ends without ``sys.exit``, whose SystemExit would leave no trace; ``python -i``; an
interpreter embedded in another program; a ``threading._shutdown`` called by Python code,
as a multiprocessing child's; no glibc) the compiles are waited for, as before, at most
``EXIT_WAIT_S``, with a message; Ctrl-C then exits at once, status 130. A forked child
minds nothing: the compile threads stayed in the parent.
"""
from __future__ import annotations

import atexit
import contextlib
import ctypes
import gc
import os
import signal
import sys
import threading
import time
from typing import Callable

from .jax_compat import exit_handlers_to_skip, shutdown_distributed

GRACE_S = 0.5      # how long a compile in flight may still finish (and be stored) at exit
EXIT_WAIT_S = 600.0  # the longest wait, where the exit status is not known for certain

# (what, pending, stop): ``pending()``: work queued or running; ``stop()``: drop what has
# not started and refuse new work (called once, at exit)
_work: list[tuple[str, Callable[[], bool], Callable[[], None]]] = []
_before_exit: list[Callable[[], None]] = []
_closing = [False]
_pid = os.getpid()  # a forked child has none of this process's compile threads


def add_work(what: str, pending: Callable[[], bool], stop: Callable[[], None]) -> None:
    """Background work the exit must mind (the compile threads, the TPU compile thread)."""
    _work.append((what, pending, stop))
    _install()


def before_exit(fn: Callable[[], None]) -> None:
    """``fn`` runs right before ``os._exit``, on the fast path only (the store: a write in
    progress finishes or leaves nothing, and no new one starts)."""
    _before_exit.append(fn)


def closing() -> bool:
    """Whether the program has ended and background work is no longer taken."""
    return _closing[0]


def pending() -> bool:
    """Whether any background work is queued or running (in this process)."""
    return os.getpid() == _pid and any(p() for _, p, _ in _work)


# ---------------------------------------------------------------------------------------
# The exit status: sys.exit's code, kept

_real_exit = sys.exit
_exits: list = [None]  # the SystemExit the main thread's last sys.exit raised


def _exit(*args):
    """``sys.exit``, keeping the exception it raises (the status, for ``os._exit``)."""
    __tracebackhide__ = True  # noqa: F841
    if threading.current_thread() is threading.main_thread():
        e = SystemExit(*args)
        _exits[0] = e
        raise e
    _real_exit(*args)


_exit.__doc__ = _real_exit.__doc__


def _ended_the_program(exc) -> bool:
    """Whether ``exc`` (with its traceback: printed, or caught on its way) left the
    program's bottom frame (the main module's, or runpy's for ``python -m``): its
    traceback starts there, at the line that frame ended on. One caught and dealt with
    starts at the frame that caught it, or that frame ended elsewhere."""
    tb = getattr(exc, "__traceback__", None)
    if tb is None:
        return False
    f = tb.tb_frame
    bottom = (f.f_code.co_name == "<module>" and f.f_globals.get("__name__") == "__main__") or \
        (f.f_code.co_name == "_run_module_as_main" and f.f_globals.get("__name__") == "runpy")
    return bottom and f.f_back is None and f.f_lineno == tb.tb_lineno


_SIGINT = object()  # the status of an uncaught KeyboardInterrupt: death by SIGINT


def exit_status():
    """The status the interpreter is about to exit with (an int, a ``SystemExit`` code,
    ``_SIGINT``), or None where that is not known for certain. Call at exit only, from
    the interpreter's ``threading._shutdown``."""
    if sys.flags.inspect or os.environ.get("PYTHONINSPECT"):
        return None  # python -i: a prompt comes next
    stack = _c_stack() or []
    i = stack.index("Py_FinalizeEx") if "Py_FinalizeEx" in stack else -1
    caller = stack[i + 1] if 0 <= i < len(stack) - 1 else None
    if caller not in ("Py_Exit", "Py_RunMain"):
        return None  # no glibc, an embedded interpreter, or a stack not understood
    e = _exits[0]
    # Python 3.11 sets an exception's __traceback__ where a handler catches it: a
    # SystemExit from sys.exit that was never caught has none. One caught (and dealt
    # with, or raised again from a ``with`` or ``finally``), or any on 3.12, ended the
    # program only if its traceback shows it left the main module.
    if e is not None and (e.__traceback__ is None or _ended_the_program(e)):
        return 0 if e.code is None else e.code
    if caller == "Py_Exit":
        return None  # a SystemExit sys.exit did not raise: its code is out of reach
    v = getattr(sys, "last_value", None)  # an uncaught exception, printed
    if v is not None and _ended_the_program(v):
        return _SIGINT if isinstance(v, KeyboardInterrupt) else 1
    main = sys.modules.get("__main__")
    if getattr(main, "__spec__", None) is not None:
        return None  # python -m: a SystemExit ends it without Py_Exit, so 0 is a guess
    return 0


def _c_stack() -> list | None:
    """The names of the C functions on this thread's stack, innermost first (glibc's
    ``backtrace``; None for a function that is not exported), or None without glibc."""
    try:
        libc = ctypes.CDLL(None)
        backtrace, dladdr = libc.backtrace, libc.dladdr
    except (OSError, AttributeError):
        return None

    class DlInfo(ctypes.Structure):
        _fields_ = [("fname", ctypes.c_char_p), ("fbase", ctypes.c_void_p),
                    ("sname", ctypes.c_char_p), ("saddr", ctypes.c_void_p)]

    backtrace.argtypes = (ctypes.POINTER(ctypes.c_void_p), ctypes.c_int)
    backtrace.restype = ctypes.c_int
    dladdr.argtypes = (ctypes.c_void_p, ctypes.POINTER(DlInfo))
    dladdr.restype = ctypes.c_int
    frames = (ctypes.c_void_p * 256)()
    names = []
    for i in range(backtrace(frames, 256)):
        info = DlInfo()
        ok = dladdr(frames[i], ctypes.byref(info)) and info.sname
        names.append(info.sname.decode(errors="replace") if ok else None)
    return names


# ---------------------------------------------------------------------------------------
# At exit

def _at_exit() -> None:
    """Before the interpreter joins its threads and finalizes (see the module's text)."""
    if not pending():
        return  # nothing in the background: the interpreter ends as it always does
    try:
        _end_the_program()
        _closing[0] = True
        for _, _, stop in _work:
            stop()
        # (a _shutdown that Python code called, as multiprocessing's children do, is not
        # the end: the child returns its own status later)
        status = exit_status() if _by_the_interpreter(sys._getframe(1)) else None
        if status is None:
            if not _wait(GRACE_S):
                _wait_long()
            return  # finished (and stored): the interpreter ends as it always does
        # Where the status is known, the fast end even if the work ended within the grace:
        # an interpreter that went on to finalize after queued work was dropped left the
        # main module's objects undeleted (an unclosed file lost its buffer; seen under
        # load in tests/test_exit.py), and its teardown of torch and JAX takes 1-2 s.
        _wait(GRACE_S)
        _end(status)
    except KeyboardInterrupt:  # Ctrl-C while exiting: at once
        _exit_now(130, "xlanb: Ctrl-C while exiting, during a compile that cannot be "
                       "stopped: exiting now")


def _by_the_interpreter(frame) -> bool:
    """Whether ``frame`` is ``threading._shutdown`` called by the interpreter's end."""
    shutdown = getattr(threading, "_shutdown", None)
    return frame.f_code is getattr(shutdown, "__code__", None) and frame.f_back is None


def _end_the_program() -> None:
    """What the interpreter does next, done here: the threading exit hooks registered
    before this one (``concurrent.futures`` joining its workers), then every non-daemon
    thread joined. The program's threads may still need compiles: nothing is stopped."""
    hooks = getattr(threading, "_threading_atexits", None)
    if isinstance(hooks, list) and _at_exit in hooks:
        earlier = hooks[:hooks.index(_at_exit)]
        del hooks[:hooks.index(_at_exit)]  # (the interpreter's loop then finds none left)
        for hook in reversed(earlier):
            hook()
    me = threading.current_thread()
    for t in threading.enumerate():
        if t is not me and not t.daemon and t.is_alive():
            t.join()


def _wait(seconds: float) -> bool:
    """Whether the background work ended within ``seconds``."""
    end = time.monotonic() + seconds
    while pending():
        left = end - time.monotonic()
        if left <= 0:
            return False
        time.sleep(min(0.01, left))
    return True


def _wait_long() -> None:
    """The slow, safe end: wait for the compiles in progress, at most ``EXIT_WAIT_S``
    (with a message after a second); past that, exit at once, status 1."""
    if _wait(1.0):
        return
    what = ", ".join(w for w, p, _ in _work if p())
    print(f"xlanb: waiting for the {what} in progress before exiting, at most "
          f"{EXIT_WAIT_S:.0f} s: XLA cannot stop a compile, and the process would crash if "
          "it ended meanwhile (Ctrl-C exits now)", file=sys.stderr, flush=True)
    if not _wait(EXIT_WAIT_S):
        _exit_now(1, "")


def _end(status) -> None:
    """The fast end: the program's atexit handlers, its files, the store, then
    ``os._exit`` with ``status`` (a message of ``sys.exit``'s was printed already)."""
    for fn in exit_handlers_to_skip():  # JAX's clean_up frees the client XLA compiles with
        atexit.unregister(fn)
    shutdown_distributed()  # (what JAX's clean_up would do beside that)
    run = getattr(atexit, "_run_exitfuncs", None)
    if run is not None:
        run()
    _close_files()
    for fn in _before_exit:
        with contextlib.suppress(Exception):
            fn()
    with contextlib.suppress(Exception):  # C's stdio buffers, as exit() would
        ctypes.CDLL(None).fflush(None)
    if status is _SIGINT:  # as the interpreter does: killed by SIGINT
        with contextlib.suppress(Exception):
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1.0)
        os._exit(130)
    os._exit((status if isinstance(status, int) else 1) & 0xFF)


def _close_files() -> None:
    """Flush and close the open files, as finalization would (a program that never
    closed its log file still has all of it): those that wrap others first."""
    import _io
    # (by type: isinstance reads __class__, which some objects warn about)
    files = [o for o in gc.get_objects() if issubclass(type(o), _io._IOBase)]
    inner = set()
    for f in files:
        for attr in ("buffer", "raw", "fileobj"):
            wrapped = getattr(f, attr, None)
            if wrapped is not None:
                inner.add(id(wrapped))
    std = set()  # flushed, never closed: a message may still come
    for s in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        while s is not None and id(s) not in std:
            std.add(id(s))
            s = getattr(s, "buffer", None) or getattr(s, "raw", None)
    def order(f) -> tuple:  # outermost first; a buffer before the raw file under it
        return (id(f) in inner, 0 if isinstance(f, _io._TextIOBase) else
                1 if isinstance(f, _io._BufferedIOBase) else 2)
    for f in sorted(files, key=order):
        with contextlib.suppress(Exception):
            if f.closed:
                continue
            if id(f) in std:
                f.flush()
            else:
                f.close()


def _exit_now(code: int, message: str) -> None:
    if message:
        print(message, file=sys.stderr)
    for f in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            f.flush()
    os._exit(code)


_installed: list = []


def _install() -> None:
    """The exit hook (registered with the work: last, so it runs before any other
    threading exit hook) and the ``sys.exit`` that keeps its code."""
    if _installed:
        return
    _installed.append(True)
    import concurrent.futures.thread  # noqa: F401  (its hook first, so that ours runs first)
    register = getattr(threading, "_register_atexit", None)
    if register is not None:
        with contextlib.suppress(RuntimeError):  # imported while the interpreter exits
            register(_at_exit)
    if sys.exit is _real_exit:
        sys.exit = _exit
