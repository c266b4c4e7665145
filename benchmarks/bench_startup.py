"""Start-up cost: what ``import xlanb``, ``%load_ext xlanb`` and ``python -m xlanb.store
info`` take, beside ``import torch`` and ``import jax`` on their own, each in a fresh
process, interleaved over rounds so that load drifts across all of them alike.

    python benchmarks/bench_startup.py [--rounds 5]

The table gives the median wall and CPU seconds of each, and, from ``python -X
importtime``, how much of ``import xlanb`` is torch, JAX and xlanb's own modules.
"""
from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_modes import _cpu_model  # noqa: E402

# a shell with xlanb's extension loaded, as a notebook's first cell does
_LOAD_EXT = ("from IPython.testing.globalipapp import start_ipython; ip = start_ipython(); "
             "ip.run_line_magic('load_ext', 'xlanb')")
CASES = {
    "python (nothing)": ["-c", "pass"],
    "import torch": ["-c", "import torch"],
    "import jax": ["-c", "import jax"],
    "import torch, jax": ["-c", "import torch, jax"],
    "import xlanb": ["-c", "import xlanb"],
    "IPython shell": ["-c", "from IPython.testing.globalipapp import start_ipython; start_ipython()"],
    "IPython shell + %load_ext xlanb": ["-c", _LOAD_EXT],
    "python -m xlanb.store info": ["-m", "xlanb.store", "info"],
}


def run_once(args: list[str], env: dict) -> tuple[float, float]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, *args], env=env, check=False,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def import_shares(env: dict) -> dict:
    """Cumulative import seconds of torch and jax, and the self time of xlanb's own
    modules, in one ``import xlanb`` (``-X importtime``)."""
    err = subprocess.run([sys.executable, "-X", "importtime", "-c", "import xlanb"], env=env,
                         capture_output=True, text=True).stderr
    shares = {"torch": 0.0, "jax": 0.0, "xlanb's own modules": 0.0}
    for line in err.splitlines():
        if "|" not in line or "self [us]" in line:
            continue
        self_us, cum_us, name = line.split(":", 1)[1].split("|")
        top = name.strip()
        if top in ("torch", "jax"):   # the first (outermost) import of each
            shares[top] = shares[top] or int(cum_us) / 1e6
        elif top.startswith("xlanb"):
            shares["xlanb's own modules"] += int(self_us) / 1e6
    return shares


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args(argv)
    # a fresh IPython profile and store, so no user setting changes what is timed
    home = tempfile.mkdtemp(prefix="xlanb-startup-")
    env = dict(os.environ, IPYTHONDIR=os.path.join(home, "ipython"),
               XLANB_STORE_DIR=os.path.join(home, "cache"))
    runs: dict = {name: [] for name in CASES}
    for name, args in CASES.items():   # warm the OS's file cache once
        run_once(args, env)
    for _ in range(a.rounds):
        for name, args in CASES.items():
            runs[name].append(run_once(args, env))
    print(f"{_cpu_model()}, {os.cpu_count()} cores; median of {a.rounds} interleaved rounds, "
          f"each a fresh process\n")
    print("| what | wall s | CPU s |")
    print("|---|---|---|")
    for name, rs in runs.items():
        print(f"| {name} | {statistics.median(r[0] for r in rs):.2f} "
              f"| {statistics.median(r[1] for r in rs):.2f} |")
    shares = import_shares(env)
    print("\n`import xlanb` by `-X importtime` (one run): "
          + ", ".join(f"{k} {v:.2f} s" for k, v in shares.items()))


if __name__ == "__main__":
    main()
