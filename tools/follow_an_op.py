"""Follow one op through xlanb: which of its modules a path touches, and how often a
call goes up the layer order (``tools/layers.py``), that is, through a hook.

    python -m tools.follow_an_op            # every path, one line each
    python -m tools.follow_an_op --path eager-cold --calls   # and the calls themselves

Each path runs in a fresh process with the store off, under ``sys.setprofile``, from the
op's line to its value on the host. Only calls from one xlanb module into another count.
DESIGN's "follow an op" map quotes these figures.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# What each path runs; ``x`` is a device tensor made before the profile starts, and the
# warm paths ran the same thing once before it.
PATHS = {
    "eager-cold": ("eager", False, "y = (x * 3.5).sin(); y.cpu()"),
    "eager-warm": ("eager", True, "y = (x * 3.5).sin(); y.cpu()"),
    "lazy-cold": ("lazy", False, "y = (x * 3.5).sin(); y.cpu()"),
    "lazy-warm": ("lazy", True, "y = (x * 3.5).sin(); y.cpu()"),
    "opbyop-cold": ("opbyop", False, "y = (x * 3.5).sin(); y.cpu()"),
}

_CHILD = r"""
import json, sys
import torch, xlanb
from tools.layers import LAYERS
order = {}
for i, (_, _, mods) in enumerate(LAYERS):
    for m in mods:
        order[m] = i
def layer(mod):
    if mod in order:
        return order[mod]
    if mod.startswith("xlanb.lowering."):
        return order["xlanb.lowering.*"]
    return None
mode, warm, code = json.loads(sys.argv[1])
xlanb.set_mode(mode)
x = torch.arange(24, dtype=torch.float32).reshape(4, 6).to("xla")
xlanb.sync()
if warm:
    exec(code)
calls = []
def prof(frame, event, arg):
    if event != "call":
        return
    callee = frame.f_globals.get("__name__", "")
    back = frame.f_back
    caller = back.f_globals.get("__name__", "") if back is not None else ""
    if callee.startswith("xlanb.") and caller.startswith("xlanb.") and callee != caller:
        calls.append((caller, callee, frame.f_code.co_name))
sys.setprofile(prof)
exec(code)
sys.setprofile(None)
import threading  # compile threads are not followed: what the op's own thread does
mods = sorted({m for c in calls for m in c[:2]})
up = sorted({(a, b, f) for a, b, f in calls
             if layer(a) is not None and layer(b) is not None and layer(b) > layer(a)})
print(json.dumps({"modules": mods, "calls": len(calls), "up": up}))
"""


def follow(name: str) -> dict:
    mode, warm, code = PATHS[name]
    env = dict(os.environ, XLANB_STORE_DIR="", PYTHONPATH=ROOT)
    out = subprocess.run([sys.executable, "-c", _CHILD, json.dumps([mode, warm, code])],
                         env=env, cwd=ROOT, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--path", choices=sorted(PATHS), action="append")
    ap.add_argument("--calls", action="store_true", help="list the modules and upward calls")
    args = ap.parse_args()
    for name in args.path or PATHS:
        r = follow(name)
        print(f"{name:12s} {len(r['modules']):3d} modules  {r['calls']:5d} calls between "
              f"modules  {len(r['up'])} upward (through a hook)")
        if args.calls:
            print("   modules: " + ", ".join(m.removeprefix("xlanb.") for m in r["modules"]))
            for a, b, f in r["up"]:
                print(f"   up: {a} -> {b}.{f}")


if __name__ == "__main__":
    main()
