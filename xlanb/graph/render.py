"""Drawing a graph: text, Graphviz DOT and SVG, from its ``GraphSummary``. The one renderer
for pending graphs, compiled graphs, magics, pdb commands and widgets."""
from __future__ import annotations

import re
import shutil
import subprocess
from typing import Callable, Iterable

from ..base.frames import SourceLoc, format_loc
from .summary import GraphSummary, sharding_colour

# Names a source location in text, tooltips and explanations. Front ends pass their own
# (a notebook's ``In[5] line 3``); the default is ``SourceLoc.short``.
Label = Callable[[SourceLoc], str]


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


def render_text(g: GraphSummary, depth: int | None = None, *, label: Label = format_loc) -> str:
    """One line per node: ``%12 = f32[8,16] aten::addmm(%3, %10, %11)  # f.py:42 fwd  [M.l1]``;
    ``label`` names each source line. Layers folded in ``g.folds`` are one comment line
    each (their values keep their numbers, which later ops name)."""
    n_in = len(g.inputs)
    shown = _near_outputs(g, depth)
    lines = []
    if shown is not None:
        hidden = len(g.ops) - sum(1 for p in shown if p >= n_in)
        if hidden:
            lines.append(f"# {hidden} earlier ops not shown (depth={depth})")
    sharded = dict(g.shardings)
    fold_at = {at: text for at, text, _ in g.folds}
    folded = frozenset().union(*(ops for _, _, ops in g.folds))
    if folded:  # inputs only folded layers read (their weights) fold with them
        used = {i for j, op in enumerate(g.ops) if j not in folded for i in op.ins}
        used.update(g.outputs)
        only_folded = {i for j in folded for i in g.ops[j].ins if i < n_in} - used
        if only_folded:
            lines.append(f"# {len(only_folded)} inputs that only the folded layers read "
                         "(device_data), folded")
    else:
        only_folded = set()
    for i, aval in enumerate(g.inputs):
        if (shown is None or i in shown) and i not in only_folded:
            lines.append(f"%{i} = {aval} device_data"
                         + (f"  sharding={sharded[i]}" if i in sharded else ""))
    for j, op in enumerate(g.ops):
        if j in fold_at:
            lines.append(fold_at[j])
        if j in folded or (shown is not None and n_in + j not in shown):
            continue
        line = f"%{n_in + j} = {op.aval} {op.name}({op.call})"
        if op.src or op.scope:
            line += "  #" + (f" {label(op.src)}" if op.src else "") + (f"  [{op.scope}]" if op.scope else "")
        if n_in + j in sharded:
            line += f"  sharding={sharded[n_in + j]}"
        lines.append(line)
    lines.append("outputs: " + ", ".join(f"%{p}" for p in g.outputs))
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------
# DOT

HIGHLIGHT = "#f5b041"  # the fill of ``highlight`` matches


def _cluster_id(scope: str) -> str:
    return "cluster_" + re.sub(r"\W", "_", scope)


def _clip_scope(scope: str, depth: int | None) -> str:
    if depth is None or not scope:
        return scope
    return ".".join(scope.split(".")[:depth]) if depth > 0 else ""


def _dot_str(text) -> str:
    """A DOT string literal's body: backslashes and quotes escaped, newlines as ``\\n``."""
    return str(text).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _matches(pattern, op, label: Label) -> bool:
    return bool(pattern) and (pattern.search(op.name) is not None
                              or (op.src is not None and pattern.search(label(op.src)) is not None))


def _default_box_tooltip(label: Label):
    def tip(key: str, ops: list) -> str:
        srcs = sorted({label(o.src) for o in ops if o.src})
        return "; ".join(srcs[:5]) + (" ..." if len(srcs) > 5 else "")
    return tip


def render_dot(g: GraphSummary, scope_depth: int | None = None,
               highlight: str | None = None, depth: int | None = None, *,
               label: Label = format_loc, marks: dict[int, str] | None = None,
               only: Iterable[int] | None = None,
               tooltip: Callable[[int], str] | None = None,
               box_tooltip: Callable[[str, list], str] | None = None) -> str:
    """Graphviz DOT with ids that are the same from run to run (graph positions: ``n12``;
    a collapsed scope: ``s_<scope>``), one ``cluster_`` per module scope (nested by path)
    and the source line in each node's tooltip.

    ``scope_depth`` collapses ops in scopes deeper than that many levels into one node
    per scope, labelled with its op count. ``highlight`` (a regex, matched against op
    names and source lines) fills the matching nodes, and the collapsed scopes that hold
    them, in orange. ``depth`` draws only the ops at most that many hops before the
    outputs, as the text form does; what feeds them from further back is a dashed stub.

    For front ends: ``label`` names a source location (default ``SourceLoc.short``);
    ``marks`` fills nodes (position -> colour) and the collapsed scopes that hold them;
    ``only`` draws just those positions (no scope is collapsed), with a dashed border
    on a node some of whose neighbours are not drawn; ``tooltip(position)`` and
    ``box_tooltip(scope, ops)`` give the hover texts. Positions are ``g``'s, so ``depth``
    cannot be combined with ``marks`` or ``only``.
    """
    if depth is not None:
        if marks or only is not None:
            raise ValueError("render_dot: depth cuts the graph, so it cannot be combined "
                             "with marks or only (positions of the whole graph)")
        g = _cut(g, depth)
    marks = dict(marks or {})
    sharded = dict(g.shardings)
    for p, text in sharded.items():  # SPMD: nodes coloured by sharding
        marks.setdefault(p, sharding_colour(text))
    if highlight:
        pattern = re.compile(highlight)
        for j, op in enumerate(g.ops):
            if _matches(pattern, op, label):
                marks.setdefault(len(g.inputs) + j, HIGHLIGHT)
    n_in = len(g.inputs)
    n_all = n_in + len(g.ops)
    keep = set(range(n_all)) if only is None else set(only)
    if only is not None:
        scope_depth = None
    out = ["digraph xla_graph {",
           '  rankdir=TB; node [shape=box, style="rounded,filled", fillcolor="#eef3fb", '
           'fontname="Helvetica", fontsize=10]; edge [color="#7f8c8d"];']
    neighbours: dict[int, set[int]] = {}
    if only is not None:  # nodes with neighbours that are not drawn: a dashed border
        for j, op in enumerate(g.ops):
            for q in op.ins:
                neighbours.setdefault(q, set()).add(n_in + j)
                neighbours.setdefault(n_in + j, set()).add(q)

    def cut_off(p: int) -> bool:
        return bool(neighbours.get(p, set()) - keep)

    def attrs(p: int, default_tip: str) -> str:
        """A node's tooltip, border and fill (when marked)."""
        tip = tooltip(p) if tooltip is not None else default_tip
        out = f', tooltip="{_dot_str(tip)}"'
        if cut_off(p):
            out += ', style="rounded,filled,dashed"' if p >= n_in else ', style="filled,dashed"'
        return out + (f', fillcolor="{marks[p]}"' if p in marks else "")

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
        if i not in folded and i in keep:
            kind = "" if aval.startswith("…") else " data"  # cut ops show as stubs
            fill = "" if i in marks else ', fillcolor="#f3f3f3"'
            shard = f"\\n{_dot_str(sharded[i])}" if i in sharded else ""
            out.append(f'  n{i} [label="%{i}{kind}\\n{_dot_str(aval)}{shard}", shape=ellipse'
                       f'{fill}{attrs(i, "device data")}];')
    # Which drawn node stands for each position: itself, or its collapsed scope.
    rep: dict[int, str] = {i: f"n{i}" for i in range(n_in) if i not in folded and i in keep}
    collapsed: dict[str, list] = {}  # clipped scope -> positions of ops in deeper scopes
    by_cluster: dict[str, list[str]] = {}
    for j, op in enumerate(g.ops):
        p = n_in + j
        if p not in keep:
            continue
        clipped = _clip_scope(op.scope, scope_depth)
        if scope_depth is not None and op.scope != clipped:
            key = clipped or "<top>"
            rep[p] = _scope_node(key)
            collapsed.setdefault(key, []).append(p)
            continue
        rep[p] = f"n{p}"
        root = ', penwidth=2, color="#c0392b"' if p in g.outputs else ""
        shard = f"\\n{_dot_str(sharded[p])}" if p in sharded else ""
        by_cluster.setdefault(clipped, []).append(
            f'n{p} [label="%{p} {_dot_str(op.name)}\\n{_dot_str(op.aval)}{shard}"{root}'
            f'{attrs(p, label(op.src) if op.src else "")}];')
    box_tip = box_tooltip or _default_box_tooltip(label)
    for key, ps in collapsed.items():
        ops = [g.ops[p - n_in] for p in ps]
        colours = [marks[p] for p in ps if p in marks]
        fill = "#d6eaf8" if not colours else colours[0] if len(set(colours)) == 1 else \
            HIGHLIGHT if HIGHLIGHT in colours else colours[0]
        text = f"{key}\n{len(ops)} ops" + (f" ({len(colours)} marked)" if colours else "")
        parent = _clip_scope(key, (scope_depth or 1) - 1) if key != "<top>" else ""
        by_cluster.setdefault(parent, []).append(
            f'{_scope_node(key)} [label="{_dot_str(text)}", shape=box3d, '
            f'fillcolor="{fill}", tooltip="{_dot_str(box_tip(key, ops))}"];')
    out.extend(_nested_clusters(by_cluster))
    edges = set()
    for j, op in enumerate(g.ops):
        dst = rep.get(n_in + j)
        if dst is None:
            continue
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
    return GraphSummary(inputs, ops, tuple(new_pos[p] for p in g.outputs),
                        tuple((new_pos[p], t) for p, t in g.shardings if p in new_pos))


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
