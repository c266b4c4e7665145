"""xlanb's layer order: the one declaration that tests/test_layers.py checks and that
docs/DESIGN.md's layer diagram is written from.

Every module of ``xlanb/`` imports only modules listed before it (module-level imports
and those inside functions alike; only ``if TYPE_CHECKING:`` blocks are exempt). Where a
lower layer must call up, the higher one installs a hook at import through one named
function (``HOOKS``). Imports are read with ``ast``: nothing is imported to check them.

    python -m tools.layers           # print the diagram and any violation
    python -m tools.layers --write   # rewrite the diagram in docs/DESIGN.md
"""
from __future__ import annotations

import ast
import os
import sys
from typing import NamedTuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, "xlanb")
DESIGN = os.path.join(ROOT, "docs", "DESIGN.md")

# (layer, what it holds, modules in order). A module may import any module listed
# before it. ``xlanb.lowering.*`` is one unit: its modules import each other freely
# (never in a cycle) and only ``xlanb.base`` below them.
LAYERS: list[tuple[str, str, tuple[str, ...]]] = [
    ("base", "torch versions, formats (durations, bytes, hashes, locations, tables), settings, the cache registry, metrics, dtypes, the session state, source locations, scopes, RNG",
     ("xlanb.base.torch_compat", "xlanb.base.formats", "xlanb.base.config", "xlanb.base.caches", "xlanb.base.metrics", "xlanb.base.dtypes",
      "xlanb.base.session", "xlanb.base.frames", "xlanb.base.scopes", "xlanb.base.rng")),
    ("runtime", "JAX's private APIs, memory-mapping headroom, libtpu without a TPU, JAX devices and meshes, TPU "
     "targets, ending the process while XLA compiles, lowering and compiling, the executable store, array transfers",
     ("xlanb.runtime.jax_compat", "xlanb.runtime.maps", "xlanb.runtime.libtpu", "xlanb.runtime.devices", "xlanb.runtime.mesh",
      "xlanb.runtime.targets", "xlanb.runtime.compile_profile", "xlanb.runtime.shutdown", "xlanb.runtime.jit",
      "xlanb.runtime.store", "xlanb.runtime.transfer")),
    ("lowering", "aten op -> JAX function, one registry",
     ("xlanb.lowering.*",)),
    ("ir", "the lazy program's data: nodes, op infos, graph plans and hashes; argument "
     "templates; XlaTensor, storages, signature keys",
     ("xlanb.ir.nodes", "xlanb.ir.templates", "xlanb.ir.tensor")),
    ("graph", "a graph as plain data, its differ and its one renderer (text, DOT, SVG); "
     "its repeated layers and which parameter each optimizer op updates; where a graph "
     "whose shapes change is cut, and what grows",
     ("xlanb.graph.summary", "xlanb.graph.explain", "xlanb.graph.render",
      "xlanb.graph.updates", "xlanb.graph.hlo_text", "xlanb.graph.layouts", "xlanb.graph.collectives",
      "xlanb.graph.repeats", "xlanb.graph.compile_time", "xlanb.graph.segments")),
    ("ops", "op plans, view records, leaves, signatures, op infos",
     ("xlanb.ops.plan", "xlanb.ops.views", "xlanb.ops.leaves", "xlanb.ops.signature",
      "xlanb.ops.infos")),
    ("values", "device values: peeked values, device memory (figures, by line, the limit), "
     "fills (values made without compiling), the checks CPU torch makes on values",
     ("xlanb.values.peeks", "xlanb.values.memory", "xlanb.values.checks", "xlanb.values.fills")),
    ("executables", "making executables: the bounded set of loaded executables, the one build "
     "chain, single-op executables, background compiles, a graph's stages (lowering, "
     "compiled for a TPU target), a first look's prefix graph",
     ("xlanb.executables.resident", "xlanb.executables.compile", "xlanb.executables.single_op",
      "xlanb.executables.background", "xlanb.executables.stages", "xlanb.executables.target",
      "xlanb.executables.prefix")),
    ("execute", "running them: op-by-op, the first non-finite op, small changed segments on "
     "CPU torch, whole graphs (compiled once, run by one step) and their segments",
     ("xlanb.execute.opbyop", "xlanb.execute.nans", "xlanb.execute.host",
      "xlanb.execute.graphs")),
    ("pending", "pending storages, waiting views, peek values; sync, materialize, peek, "
     "values an op needs",
     ("xlanb.pending.live", "xlanb.pending.realize")),
    ("modes", "reading and writing through storages; the modes, one object each (what an "
     "op does, how a sync runs); lazy / eager / opbyop switching",
     ("xlanb.modes.record", "xlanb.modes.policy", "xlanb.modes.switch")),
    ("dispatch", "host reads of tensors, with their cause; CPU fallback, __torch_dispatch__ "
     "and the special ops, device registration",
     ("xlanb.dispatch.reads", "xlanb.dispatch.fallback", "xlanb.dispatch.inplace_meta",
      "xlanb.dispatch.dispatcher", "xlanb.dispatch.backend")),
    ("debugging", "numerics: the first op that made a NaN/Inf (debug_nans), op-by-op CPU "
     "comparison; the profiler by line, scope, op and phase",
     ("xlanb.debugging.debug_nans", "xlanb.debugging.compare", "xlanb.debugging.profile")),
    ("capture", "xlanb.compile and the torch.compile backend",
     ("xlanb.capture.function", "xlanb.capture.dynamo")),
    ("inspect", "tensor repr, pending IR and HLO, collectives",
     ("xlanb.inspect.repr", "xlanb.inspect.pending")),
    ("spmd", "xlanb.spmd: meshes, mark_sharding, shardings and shards; xlanb.distributed "
     "(public modules, so they stay loose in xlanb/)",
     ("xlanb.spmd", "xlanb.distributed")),
    ("loops", "xlanb.scan, xlanb.scan_layers: loops the program asks for, recorded "
     "unrolled and compiled as one; optimization barriers",
     ("xlanb.loops.scan", "xlanb.loops.barrier")),
    ("api", "the public API",
     ("xlanb",)),
    ("compat", "torch_xla's modules on the public API: import torch_xla runs on xlanb",
     ("xlanb.compat.missing", "xlanb.compat.metrics", "xlanb.compat.backends",
      "xlanb.compat.xlac", "xlanb.compat.runtime", "xlanb.compat.experimental",
      "xlanb.compat.xla_model", "xlanb.compat.profiler", "xlanb.compat.debug_env",
      "xlanb.compat.parallel_loader", "xlanb.compat.xla_multiprocessing",
      "xlanb.compat.spmd", "xlanb.compat.graph_saver", "xlanb.compat.dynamo_bridge",
      "xlanb.compat.checkpoint", "xlanb.compat.scan", "xlanb.compat.scan_layers",
      "xlanb.compat.fsdp_wrap", "xlanb.compat.fsdp", "xlanb.compat.spmd_fsdp",
      "xlanb.compat.toplevel", "xlanb.compat")),
    ("commands", "python -m xlanb.store: the executable store; python -m xlanb.run: a "
     "torch_xla script on xlanb; python -m xlanb.launch: N local processes",
     ("xlanb.store", "xlanb.cache", "xlanb.run", "xlanb.launch")),
    ("front ends", "extensions/ (IPython, pdb, widgets), kernel/, and the xlanb.widgets shim",
     ("xlanb.extensions.*", "xlanb.kernel.*", "xlanb.widgets")),
]

# Upward calls, each through one named function, and the modules allowed to call it.
HOOKS: dict[str, tuple[str, ...]] = {
    "xlanb.ir.tensor.set_handler": ("xlanb.dispatch.dispatcher", "xlanb.dispatch.reads",
                                    "xlanb.inspect.repr"),
    "xlanb.ops.infos.set_decomposition_runner": ("xlanb.modes.record",),
    "xlanb.base.session.set_policies": ("xlanb.modes.policy",),
}

# Upward imports allowed by name: ``%load_ext xlanb`` and ``xlanb.set_trace`` live in the
# public API but load their front end only when called.
ALLOWED_UP: set[tuple[str, str]] = {
    ("xlanb", "xlanb.extensions.ipython"),
    ("xlanb", "xlanb.extensions.pdb"),
}


def module_files() -> dict[str, str]:
    """Every module of the xlanb package: dotted name -> file."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(PACKAGE):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for name in sorted(filenames):
            if not name.endswith(".py"):
                continue
            path = os.path.join(dirpath, name)
            parts = os.path.relpath(path, ROOT)[:-3].split(os.sep)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
    return out


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or \
        (isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def _imports_of(tree: ast.AST):
    """Import statements, skipping ``if TYPE_CHECKING:`` bodies."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node):
            stack.extend(node.orelse)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def imports(module: str, path: str, known: set[str]) -> list[tuple[str, int]]:
    """The xlanb modules ``module`` imports, with line numbers."""
    tree = ast.parse(open(path).read(), path)
    package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
    found = []
    for node in _imports_of(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        else:
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            targets = [f"{mod}.{a.name}" if f"{mod}.{a.name}" in known else mod
                       for a in node.names]
        for t in targets:
            if t == "xlanb" or t.startswith("xlanb."):
                found.append((t, node.lineno))
    return found


def rank_of(name: str) -> tuple[int, int] | None:
    """(layer, position) of a module in the declared order; None if undeclared."""
    pos = 0
    for li, (_, _, mods) in enumerate(LAYERS):
        for m in mods:
            if m == name or (m.endswith(".*") and (name == m[:-2] or name.startswith(m[:-1]))):
                return li, pos
            pos += 1
    return None


def _is_package_init(name: str, path: str) -> bool:
    return path.endswith("__init__.py") and name != "xlanb" and rank_of(name) is None


def violations() -> list[str]:
    """Undeclared modules, imports that go up the order, cycles, misplaced hook calls."""
    files = module_files()
    known = set(files)
    problems = []
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        if _is_package_init(name, path):
            # a layer folder's __init__ holds nothing, so importing through it is free
            if any(True for _ in _imports_of(ast.parse(open(path).read()))):
                problems.append(f"{name}: a layer folder's __init__.py must not import anything")
            continue
        me = rank_of(name)
        if me is None:
            problems.append(f"{name}: not in the declared layer order (tools/layers.py LAYERS)")
            continue
        for target, line in imports(name, path, known):
            if target in known and _is_package_init(target, files[target]):
                continue
            graph.setdefault(name, set()).add(target)
            them = rank_of(target)
            if them is None:
                problems.append(f"{name}:{line} imports {target}, which is not in the layer order")
            elif (name, target) in ALLOWED_UP:
                continue
            elif them > me and not (me[0] == them[0] and LAYERS[me[0]][2][0].endswith(".*")):
                problems.append(f"{name}:{line} imports {target}, which is above it "
                                f"({LAYERS[me[0]][0]} -> {LAYERS[them[0]][0]})")
    problems += [f"import cycle: {' -> '.join(c)}" for c in cycles(graph)]
    problems += hook_violations(files)
    return problems


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp) + [sorted(comp)[0]])
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def hook_violations(files: dict[str, str]) -> list[str]:
    problems = []
    short = {h.rpartition(".")[2]: h for h in HOOKS}
    for name, path in files.items():
        tree = ast.parse(open(path).read(), path)
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                f = node.func
                called = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
                hook = short.get(called)
                if hook and name not in HOOKS[hook] and name != hook.rpartition(".")[0]:
                    problems.append(f"{name}:{node.lineno} calls the hook {hook}, which only "
                                    f"{', '.join(HOOKS[hook])} may install")
    return problems


BEGIN = "<!-- layers: written by `python -m tools.layers --write`; do not edit by hand -->"
END = "<!-- /layers -->"


def diagram() -> str:
    """The layer diagram, top layer first (data flows down; imports go down only)."""
    lines = ["```"]
    w = max(len(name) for name, _, _ in LAYERS) + 1  # the names' column
    for name, what, mods in reversed(LAYERS):
        shown = ", ".join(m.replace("xlanb.", "", 1) if m != "xlanb" else "xlanb/__init__"
                          for m in mods)
        lines.append(f"{name:<{w}}{shown}")
        lines.append(f"{'':<{w}}  {what}")
    lines.append("```")
    hooks = "; ".join(f"`{h}` (installed by {', '.join(m for m in mods)})"
                      for h, mods in HOOKS.items())
    lines.append(f"Upward calls go through hooks installed at import: {hooks}.")
    return BEGIN + "\n" + "\n".join(lines) + "\n" + END


def design_block() -> str | None:
    text = open(DESIGN).read()
    if BEGIN not in text or END not in text:
        return None
    return text[text.index(BEGIN):text.index(END) + len(END)]


def write_design() -> None:
    text = open(DESIGN).read()
    old = design_block()
    if old is None:
        raise SystemExit(f"{DESIGN} has no layer block (markers {BEGIN!r} ... {END!r})")
    with open(DESIGN, "w") as f:
        f.write(text.replace(old, diagram()))


def main(argv: list[str]) -> int:
    if "--write" in argv:
        write_design()
    print(diagram())
    problems = violations()
    for p in problems:
        print(p, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
