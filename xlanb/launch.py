"""``python -m xlanb.launch --nproc N [--devices-per-proc K] script.py [args]``: start N
local processes of one SPMD program, as ``torchrun`` does, for trying multi-process
code on one machine. Each process gets ``XLANB_COORDINATOR_ADDRESS``,
``XLANB_NUM_PROCESSES`` and ``XLANB_PROCESS_ID`` (what ``xlanb.distributed.initialize()``
reads), and with ``--devices-per-proc K`` on the CPU, K simulated devices. The exit
status is the first failing process's; if one fails, the others are stopped."""
from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m xlanb.launch", description=__doc__.split("\n\n")[0])
    p.add_argument("--nproc", type=int, required=True, help="processes to start")
    p.add_argument("--devices-per-proc", type=int, default=None,
                   help="CPU only: simulated devices per process (XLA_FLAGS)")
    p.add_argument("--port", type=int, default=None, help="coordinator port (default: a free one)")
    p.add_argument("script")
    p.add_argument("args", nargs=argparse.REMAINDER)
    a = p.parse_args(argv)
    if a.nproc < 1:
        p.error("--nproc must be at least 1")
    port = a.port or _free_port()
    procs = []
    for i in range(a.nproc):
        env = dict(os.environ)
        env.setdefault("PYTHONFAULTHANDLER", "1")  # a native crash leaves its Python stacks
        env.update({"XLANB_COORDINATOR_ADDRESS": f"127.0.0.1:{port}",
                    "XLANB_NUM_PROCESSES": str(a.nproc), "XLANB_PROCESS_ID": str(i)})
        if a.devices_per_proc:
            env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count="
                                + str(a.devices_per_proc)).strip()
        procs.append(subprocess.Popen([sys.executable, a.script, *a.args], env=env))
    status = 0
    try:
        while procs:
            for proc in list(procs):
                rc = proc.poll()
                if rc is None:
                    continue
                procs.remove(proc)
                if rc and not status:
                    status = rc
                    for other in procs:  # one failed: the others would wait on it forever
                        other.terminate()
            time.sleep(0.05)
    except KeyboardInterrupt:
        for proc in procs:
            proc.terminate()
        status = 130
    return status


if __name__ == "__main__":
    sys.exit(main())
