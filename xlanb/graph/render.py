"""Drawing a graph: text, Graphviz DOT and SVG, from its ``GraphSummary``. The one renderer
for pending graphs, compiled graphs, magics, pdb commands and widgets."""
from __future__ import annotations

import html
import re
import shutil
import subprocess

from ..base.frames import format_loc
from .summary import GraphSummary


def _near_outputs(g: GraphSummary, depth: int | None) -> set[int] | None:
    """Positions at most ``depth`` hops before the outputs (None: all)."""
    if depth is None:
        return None
    n_in = len(g.inputs)
    dist = {p: 0 for p in g.outputs}
    for j in range(len(g.ops) - 1, -1, -1):
        p = n_in + j
        if p in dist:
            for q in g.ops[j].ins:
                d = dist[p] + 1
                if d < dist.get(q, d + 1):
                    dist[q] = d
    return {p for p, d in dist.items() if d < depth}


def render_text(g: GraphSummary, depth: int | None = None) -> str:
    """One line per node: ``%12 = f32[8,16] aten::addmm(%3, %10, %11)  # f.py:42 fwd  [M.l1]``."""
    n_in = len(g.inputs)
    shown = _near_outputs(g, depth)
    lines = []
    if shown is not None:
        hidden = len(g.ops) - sum(1 for p in shown if p >= n_in)
        if hidden:
            lines.append(f"# {hidden} earlier ops not shown (depth={depth})")
    for i, aval in enumerate(g.inputs):
        if shown is None or i in shown:
            lines.append(f"%{i} = {aval} device_data")
    for j, op in enumerate(g.ops):
        if shown is not None and n_in + j not in shown:
            continue
        line = f"%{n_in + j} = {op.aval} {op.name}({op.call})"
        if op.src or op.scope:
            line += "  #" + (f" {op.src.short}" if op.src else "") + (f"  [{op.scope}]" if op.scope else "")
        lines.append(line)
    lines.append("outputs: " + ", ".join(f"%{p}" for p in g.outputs))
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------
# DOT

def _cluster_id(scope: str) -> str:
    return "cluster_" + re.sub(r"\W", "_", scope)


def _clip_scope(scope: str, depth: int | None) -> str:
    if depth is None or not scope:
        return scope
    return ".".join(scope.split(".")[:depth]) if depth > 0 else ""


def _matches(pattern, op) -> bool:
    return bool(pattern) and (pattern.search(op.name) is not None
                              or pattern.search(format_loc(op.src)) is not None)


def render_dot(g: GraphSummary, scope_depth: int | None = None,
               highlight: str | None = None, depth: int | None = None) -> str:
    """Graphviz DOT with ids that are the same from run to run (graph positions), one
    ``cluster_`` per module scope (nested by path) and the source line in each node's
    tooltip.

    ``scope_depth`` collapses ops in scopes deeper than that many levels into one node
    per scope, labelled with its op count. ``highlight`` (a regex, matched against op
    names and ``file:line``) fills the matching nodes, and the collapsed scopes that hold
    them, in orange. ``depth`` draws only the ops at most that many hops before the
    outputs, as the text form does; what feeds them from further back is a dashed stub.
    """
    if depth is not None:
        g = _cut(g, depth)
    pattern = re.compile(highlight) if highlight else None
    n_in = len(g.inputs)
    out = ["digraph xla_graph {",
           '  rankdir=TB; node [shape=box, style="rounded,filled", fillcolor="#eef3fb", '
           'fontname="Helvetica", fontsize=10]; edge [color="#7f8c8d"];']
    # Inputs read only by collapsed scopes (weights, mostly) are folded into them.
    consumers: dict[int, set] = {}
    for j, op in enumerate(g.ops):
        for q in op.ins:
            if q < n_in:
                consumers.setdefault(q, set()).add(
                    _clip_scope(op.scope, scope_depth) if scope_depth is not None
                    and op.scope != _clip_scope(op.scope, scope_depth) else None)
    folded = {q for q, c in consumers.items() if None not in c}
    for i, aval in enumerate(g.inputs):
        if i not in folded:
            kind = "" if aval.startswith("…") else " data"  # cut ops show as stubs
            out.append(f'  n{i} [label="%{i}{kind}\\n{aval}", shape=ellipse, '
                       f'fillcolor="#f3f3f3", tooltip="device data"];')
    # Which drawn node stands for each position: itself, or its collapsed scope.
    rep: dict[int, str] = {i: f"n{i}" for i in range(n_in) if i not in folded}
    collapsed: dict[str, list] = {}  # clipped scope -> ops inside deeper scopes
    by_cluster: dict[str, list[str]] = {}
    for j, op in enumerate(g.ops):
        p = n_in + j
        clipped = _clip_scope(op.scope, scope_depth)
        if scope_depth is not None and op.scope != clipped:
            key = clipped or "<top>"
            rep[p] = _scope_node(key)
            collapsed.setdefault(key, []).append(op)
            continue
        rep[p] = f"n{p}"
        fill = ', fillcolor="#f5b041"' if _matches(pattern, op) else ""
        root = ', penwidth=2, color="#c0392b"' if p in g.outputs else ""
        tip = html.escape(format_loc(op.src), quote=True)
        by_cluster.setdefault(clipped, []).append(
            f'n{p} [label="%{p} {op.name}\\n{op.aval}", tooltip="{tip}"{fill}{root}];')
    for key, ops in collapsed.items():
        hit = any(_matches(pattern, o) for o in ops)
        fill = "#f5b041" if hit else "#d6eaf8"
        srcs = sorted({o.src.short for o in ops if o.src})
        tip = html.escape("; ".join(srcs[:5]) + (" ..." if len(srcs) > 5 else ""), quote=True)
        parent = _clip_scope(key, (scope_depth or 1) - 1) if key != "<top>" else ""
        by_cluster.setdefault(parent, []).append(
            f'{_scope_node(key)} [label="{key}\\n{len(ops)} ops", shape=box3d, '
            f'fillcolor="{fill}", tooltip="{tip}"];')
    out.extend(_nested_clusters(by_cluster))
    edges = set()
    for j, op in enumerate(g.ops):
        dst = rep[n_in + j]
        for q in op.ins:
            src = rep.get(q)
            if src is not None and src != dst and (src, dst) not in edges:
                edges.add((src, dst))
                out.append(f"  {src} -> {dst};")
    out.append("}")
    return "\n".join(out)


def _cut(g: GraphSummary, depth: int) -> GraphSummary:
    """``g`` with only the ops near its outputs; inputs from cut ops become stub inputs."""
    shown = _near_outputs(g, depth)
    n_in = len(g.inputs)
    kept = [j for j in range(len(g.ops)) if n_in + j in shown]
    needed = sorted({q for j in kept for q in g.ops[j].ins if q not in shown or q < n_in})
    # New positions: needed inputs (real or stubs for cut ops) first, then kept ops.
    new_pos = {q: i for i, q in enumerate(needed)}
    new_pos.update({n_in + j: len(needed) + k for k, j in enumerate(kept)})
    inputs = tuple(g.inputs[q] if q < n_in else f"… {g.ops[q - n_in].aval} (cut)" for q in needed)
    ops = tuple(g.ops[j]._replace(ins=tuple(new_pos[q] for q in g.ops[j].ins)) for j in kept)
    return GraphSummary(inputs, ops, tuple(new_pos[p] for p in g.outputs))


def _nested_clusters(by_cluster: dict[str, list[str]]) -> list[str]:
    """Clusters nested by module path: BertModel > BertModel.encoder > ...layer.0."""
    children: dict[str, list[str]] = {}
    for scope in list(by_cluster):
        while scope:
            parent = scope.rpartition(".")[0]
            kids = children.setdefault(parent, [])
            if scope in kids:
                break
            kids.append(scope)
            scope = parent
    lines: list[str] = []

    def emit(scope: str, indent: str) -> None:
        lines.extend(indent + d for d in by_cluster.get(scope, ()))
        for kid in children.get(scope, ()):
            lines.append(f'{indent}subgraph {_cluster_id(kid)} {{ label="{kid}"; '
                         f'style=dashed; fontsize=9; fontname="Helvetica";')
            emit(kid, indent + "  ")
            lines.append(indent + "}")
    emit("", "  ")
    return lines


def _scope_node(key: str) -> str:
    return "s_" + re.sub(r"\W", "_", key)


INSTALL_DOT_HINT = ("Graphviz's `dot` is not installed: apt-get install graphviz "
                    "(Debian/Ubuntu), brew install graphviz (macOS) or conda install graphviz")


def render_svg(dot_source: str, timeout: float = 60.0) -> str:
    """DOT text rendered to SVG by Graphviz's ``dot``; a RuntimeError with an install hint
    when ``dot`` is not on PATH."""
    exe = shutil.which("dot")
    if exe is None:
        raise RuntimeError(INSTALL_DOT_HINT)
    res = subprocess.run([exe, "-Tsvg"], input=dot_source.encode(), capture_output=True,
                         timeout=timeout)
    if res.returncode != 0:
        raise RuntimeError(f"dot failed: {res.stderr.decode(errors='replace').strip()}")
    return res.stdout.decode()
