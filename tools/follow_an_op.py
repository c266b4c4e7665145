"""Follow one op through xlanb: which of its modules a path touches, and how often a
call goes up the layer order (``tools/layers.py``), that is, through a hook.

    python -m tools.follow_an_op            # every path, one line each
    python -m tools.follow_an_op --path eager-cold --calls   # and the calls themselves
    python -m tools.follow_an_op --map      # each path's functions, with file:line
    python -m tools.follow_an_op --write    # rewrite that map in docs/DESIGN.md

Each path runs in a fresh process with the store off, under ``sys.setprofile``, from the
op's line to its value on the host. Only calls from one xlanb module into another count.
DESIGN's "follow an op" map is this tool's ``--map``, written there by ``--write``: its
file:line references come from the code, so they are refreshed, not edited by hand.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DESIGN = os.path.join(ROOT, "docs", "DESIGN.md")
BEGIN, END = "<!-- follow-an-op: python -m tools.follow_an_op --write -->", "<!-- /follow-an-op -->"

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
steps = []  # (depth, module, function, file, line): the first call into each function
stack = []  # the frames of those calls still running
seen = set()
def prof(frame, event, arg):
    if event == "return":
        if stack and stack[-1] is frame:
            stack.pop()
        return
    if event != "call":
        return
    callee = frame.f_globals.get("__name__", "")
    back = frame.f_back
    caller = back.f_globals.get("__name__", "") if back is not None else ""
    if callee.startswith("xlanb.") and callee != caller and (
            caller.startswith("xlanb.") or not stack):
        code = frame.f_code
        if caller.startswith("xlanb."):
            calls.append((caller, callee, code.co_name))
        if (callee, code.co_qualname) not in seen:
            seen.add((callee, code.co_qualname))
            steps.append((len(stack), callee, code.co_qualname, code.co_filename,
                          code.co_firstlineno))
        stack.append(frame)
sys.setprofile(prof)
exec(code)
sys.setprofile(None)
import threading  # compile threads are not followed: what the op's own thread does
mods = sorted({m for c in calls for m in c[:2]})
up = sorted({(a, b, f) for a, b, f in calls
             if layer(a) is not None and layer(b) is not None and layer(b) > layer(a)})
print(json.dumps({"modules": mods, "calls": len(calls), "up": up, "steps": steps}))
"""


def follow(name: str) -> dict:
    mode, warm, code = PATHS[name]
    env = dict(os.environ, XLANB_STORE_DIR="", PYTHONPATH=ROOT)
    out = subprocess.run([sys.executable, "-c", _CHILD, json.dumps([mode, warm, code])],
                         env=env, cwd=ROOT, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


# Left out of the map (not of the counts): settings, counters, formats, dtypes and the
# thread's mode, which every path reads along the way.
HELPERS = {"xlanb.base.config", "xlanb.base.metrics", "xlanb.base.formats",
           "xlanb.base.dtypes", "xlanb.base.session"}


def _where(file: str, line: int) -> str:
    rel = os.path.relpath(os.path.realpath(file), ROOT)
    return f"{rel}:{line}"


def op_map(names=None) -> str:
    """Each path as the functions it enters across modules, first call only, nested by
    who called whom, each with its file:line (Markdown); ``HELPERS`` left out."""
    out = []
    for name in names or PATHS:
        mode, warm, code = PATHS[name]
        r = follow(name)
        out.append(f"<details><summary><b>{name}</b> ({mode} mode, {'warm' if warm else 'cold'}): "
                   f"{len(r['modules'])} modules, {r['calls']} calls between them, "
                   f"{len(r['up'])} upward</summary>")
        out.append("")
        out.append("```")
        cut = None  # the depth of a helper left out: its callees go with it
        for depth, mod, fn, file, line in r["steps"]:
            if cut is not None and depth > cut:
                continue
            cut = depth if mod in HELPERS else None
            if cut is None:
                out.append(f"{'  ' * depth}{mod.removeprefix('xlanb.')}.{fn}  {_where(file, line)}")
        out.append("```")
        out.append("")
        out.append("</details>")
    return "\n".join(out)


def write_design(text: str) -> None:
    with open(DESIGN, encoding="utf-8") as f:
        doc = f.read()
    start, end = doc.index(BEGIN) + len(BEGIN), doc.index(END)
    with open(DESIGN, "w", encoding="utf-8") as f:
        f.write(doc[:start] + "\n" + text + "\n" + doc[end:])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--path", choices=sorted(PATHS), action="append")
    ap.add_argument("--calls", action="store_true", help="list the modules and upward calls")
    ap.add_argument("--map", action="store_true", help="each path's functions, with file:line")
    ap.add_argument("--write", action="store_true", help="write that map into docs/DESIGN.md")
    args = ap.parse_args()
    if args.map or args.write:
        text = op_map(args.path)
        if args.write:
            write_design(text)
        else:
            print(text)
        return
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
