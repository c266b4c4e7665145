"""``python -m xlanb.launch --nproc N [--devices-per-proc K] script.py [args]``: start N
local processes of one SPMD program, as ``torchrun`` does, for trying multi-process
code on one machine. Each process gets ``XLANB_COORDINATOR_ADDRESS``,
``XLANB_NUM_PROCESSES`` and ``XLANB_PROCESS_ID`` (what ``xlanb.distributed.initialize()``
reads), and with ``--devices-per-proc K`` on the CPU, K simulated devices.

The launcher owns its children: they run in one process group of their own, and are
killed (SIGKILL) when the launcher dies, however it dies (SIGTERM would not do: once
``jax.distributed`` is initialized, JAX's preemption notifier catches it). Stopping them
is one procedure: SIGINT to the group (a KeyboardInterrupt: ``finally`` blocks and
atexit hooks such as ``XLA_METRICS_FILE``'s run), then SIGKILL to what still runs
``--stop-grace`` seconds later (default 10), each step said on stderr. SIGINT or SIGTERM
to the launcher stops them so (a second one kills them at once); when one process
fails, the others first get ``--grace`` seconds to end on their own (they may be
printing the same error). SIGUSR1 is passed on (each process prints its last
multi-process runs and its threads' stacks). The children start with SIGUSR1 ignored,
so that one that arrives before a child's handler is installed (before
``xlanb.distributed.initialize()``, or in a program that has none) does not kill it.

Output is passed through as it comes, in whole lines, a burst of one process's lines
(a traceback) written together, never mixed with another's; with several processes,
each stderr line starts ``[i] ``. On a failure every process's last lines are printed,
prefixed ``[i]``, and the exit status is non-zero: the first failing process's, or 128
+ the signal."""
from __future__ import annotations

import argparse
import ctypes
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque

TAIL_LINES = 20
_OUT_LOCK = threading.Lock()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


try:
    _prctl = ctypes.CDLL(None).prctl  # looked up here: the child only calls it
except (OSError, AttributeError):  # not Linux: the process group still lets us stop them
    _prctl = None


def _die_with(parent: int):
    """In the child, before exec: SIGKILL when the launcher dies, however it dies."""
    def preexec() -> None:
        if _prctl is not None:
            _prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
            if os.getppid() != parent:  # it died before the line above
                os._exit(1)
    return preexec


# a burst of one process's output goes out as one write: it ends after this quiet, or
# at these bounds (a process that prints without pause still shows as it goes)
BURST_QUIET_S, BURST_MAX_S, BURST_MAX_BYTES = 0.1, 1.0, 1 << 20


class _Child:
    """One process: its output is passed through as it comes, and its last lines kept."""

    def __init__(self, index: int, proc: subprocess.Popen, prefix_err: bool):
        self.index, self.proc = index, proc
        self.tail: deque = deque(maxlen=TAIL_LINES)
        self.lock = threading.Lock()
        err_prefix = f"[{index}] ".encode() if prefix_err else b""
        self.readers = [threading.Thread(target=self._pump, args=(proc.stdout, sys.stdout, b""), daemon=True),
                        threading.Thread(target=self._pump, args=(proc.stderr, sys.stderr, err_prefix),
                                         daemon=True)]

    def start(self) -> None:
        for r in self.readers:
            r.start()

    def _pump(self, src, dst, prefix: bytes) -> None:
        fd = src.fileno()
        partial = b""
        out = getattr(dst, "buffer", None)
        while True:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            burst, start = [chunk], time.monotonic()
            size = len(chunk)
            # the rest of the burst (a traceback comes in many writes)
            while size < BURST_MAX_BYTES and time.monotonic() - start < BURST_MAX_S and \
                    select.select([fd], [], [], BURST_QUIET_S)[0]:
                more = os.read(fd, 65536)
                if not more:
                    break
                burst.append(more)
                size += len(more)
            lines = (partial + b"".join(burst)).split(b"\n")
            partial = lines.pop()
            if lines:
                self._emit(out, lines, prefix)
        if partial:
            self._emit(out, [partial], prefix)

    def _emit(self, out, lines: list, prefix: bytes) -> None:
        """Whole lines only, so that two processes' lines never mix within one."""
        if out is not None:
            with _OUT_LOCK:
                out.write(b"".join(prefix + x + b"\n" for x in lines))
                out.flush()
        with self.lock:
            self.tail.extend(x.decode(errors="replace") for x in lines)

    def last_lines(self) -> list[str]:
        for r in self.readers:
            r.join(timeout=2)
        with self.lock:
            return [f"[{self.index}] {line}" for line in self.tail]


def _say(text: str) -> None:
    with _OUT_LOCK:
        print(f"xlanb.launch: {text}", file=sys.stderr, flush=True)


def _stop_group(pgid: int, children: list, grace: float, got_signal: list) -> None:
    """SIGINT to the group (KeyboardInterrupt: atexit hooks run), SIGKILL to what still
    runs ``grace`` seconds later, or at once on another signal to the launcher."""
    def running():
        return [c for c in children if c.proc.poll() is None]

    if not running():
        return
    seen = len(got_signal)
    try:
        os.killpg(pgid, signal.SIGINT)
    except ProcessLookupError:
        return
    end = time.monotonic() + grace
    while running() and time.monotonic() < end and len(got_signal) == seen:
        time.sleep(0.05)
    left = running()
    if not left:
        return
    why = ("another signal" if len(got_signal) > seen else f"still running after {grace:g} s")
    _say(f"{why}: killing process{'es' * (len(left) > 1)} "
         f"{', '.join(str(c.index) for c in left)} (SIGKILL)")
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        return
    end = time.monotonic() + 5.0
    while running() and time.monotonic() < end:
        time.sleep(0.05)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m xlanb.launch", description=__doc__.split("\n\n")[0])
    p.add_argument("--nproc", type=int, required=True, help="processes to start")
    p.add_argument("--devices-per-proc", type=int, default=None,
                   help="CPU only: simulated devices per process (XLA_FLAGS)")
    p.add_argument("--port", type=int, default=None, help="coordinator port (default: a free one)")
    p.add_argument("--grace", type=float, default=3.0,
                   help="seconds the others get to end on their own after one fails (default 3)")
    p.add_argument("--stop-grace", type=float, default=10.0,
                   help="seconds processes get after SIGINT to run their atexit hooks before "
                        "they are killed (default 10)")
    p.add_argument("script")
    p.add_argument("args", nargs=argparse.REMAINDER)
    a = p.parse_args(argv)
    if a.nproc < 1:
        p.error("--nproc must be at least 1")
    if a.devices_per_proc is not None and a.devices_per_proc < 1:
        p.error(f"--devices-per-proc must be at least 1 (got {a.devices_per_proc})")
    for name, value in (("--grace", a.grace), ("--stop-grace", a.stop_grace)):
        if not 0 <= value < float("inf"):
            p.error(f"{name} must be a number of seconds >= 0 (got {value})")
    port = a.port or _free_port()
    children: list[_Child] = []
    pgid = 0  # the first child leads the group; the others join it
    got_signal: list[int] = []

    def on_signal(signum, frame):
        if signum == signal.SIGUSR1:  # each process prints its flight recorder
            if pgid:
                os.killpg(pgid, signal.SIGUSR1)
            return
        got_signal.append(signum)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    # the children inherit SIGUSR1 ignored (an ignored signal stays ignored across exec;
    # a handler would not): xlanb.distributed installs its own handler over it. Ours
    # goes in once every child is started, so that no child ever runs it
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    for i in range(a.nproc):
        env = dict(os.environ)
        env.setdefault("PYTHONFAULTHANDLER", "1")  # a native crash leaves its Python stacks
        env.setdefault("PYTHONUNBUFFERED", "1")  # its last lines reach us even if it is killed
        env.update({"XLANB_COORDINATOR_ADDRESS": f"127.0.0.1:{port}",
                    "XLANB_NUM_PROCESSES": str(a.nproc), "XLANB_PROCESS_ID": str(i)})
        if a.devices_per_proc:
            env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count="
                                + str(a.devices_per_proc)).strip()
        proc = subprocess.Popen([sys.executable, a.script, *a.args], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                process_group=pgid, preexec_fn=_die_with(os.getpid()))
        pgid = pgid or proc.pid
        children.append(_Child(i, proc, prefix_err=a.nproc > 1))
    signal.signal(signal.SIGUSR1, on_signal)
    for c in children:  # threads only once every child is forked (preexec_fn)
        c.start()
    stopping = (f"each gets SIGINT (KeyboardInterrupt: its atexit hooks run) and is killed if "
                f"still running after {a.stop_grace:g} s (--stop-grace)")
    status = 0
    failed = None
    while True:
        if got_signal:
            status = 128 + got_signal[0]
            _say(f"{signal.Signals(got_signal[0]).name}: stopping every process: {stopping}; "
                 "a second signal kills them at once")
            _stop_group(pgid, children, a.stop_grace, got_signal)
            break
        running = [c for c in children if c.proc.poll() is None]
        bad = [c for c in children if c.proc.returncode not in (None, 0)]
        if bad and failed is None:
            failed = bad[0]
            rc = failed.proc.returncode
            status = rc if rc > 0 else 128 - rc
            deadline = time.monotonic() + a.grace  # the others may be ending on the same error
        if not running:
            break
        if failed is not None and time.monotonic() >= deadline:
            _say(f"process {failed.index} failed (exit status {failed.proc.returncode}): "
                 f"stopping the others: {stopping}")
            _stop_group(pgid, children, a.stop_grace, got_signal)
            break
        time.sleep(0.05)
    if status:
        lines = [f"xlanb.launch: exit status {status}; each process's last lines:"]
        for c in children:
            rc = c.proc.poll()
            state = ("running" if rc is None else f"exit status {rc}" if rc >= 0
                     else f"killed by {signal.Signals(-rc).name}")
            lines.append(f"[{c.index}] --- process {c.index} ({state}) ---")
            lines.extend(c.last_lines())
        with _OUT_LOCK:
            print("\n".join(lines), file=sys.stderr, flush=True)
    else:
        for c in children:
            for r in c.readers:
                r.join(timeout=5)
    return status


if __name__ == "__main__":
    sys.exit(main())
