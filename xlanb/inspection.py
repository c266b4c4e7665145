"""Looking at pending work without running it: IR as text or DOT, and the HLO a sync
would compile. Nothing here changes the pending graph."""
from __future__ import annotations

import html
import re

import torch

from .ir import GraphPlan, Node, format_src, leaf_meta, plan_graph

_DTYPE_SHORT = {
    torch.float32: "f32", torch.float64: "f64", torch.float16: "f16", torch.bfloat16: "bf16",
    torch.int64: "s64", torch.int32: "s32", torch.int16: "s16", torch.int8: "s8",
    torch.uint8: "u8", torch.bool: "pred", torch.complex64: "c64", torch.complex128: "c128",
}


def _aval_text(meta) -> str:
    if isinstance(meta, tuple) and not hasattr(meta, "shape"):
        return "(" + ", ".join(_aval_text(m) for m in meta if m is not None) + ")"
    return f"{_DTYPE_SHORT.get(meta.dtype, str(meta.dtype))}[{','.join(map(str, meta.shape))}]"


def roots_of(tensors) -> list[Node]:
    """The pending nodes of ``tensors``, or of every live tensor when none are given."""
    from .dispatch import value_node
    from .sync import pending_roots
    if not tensors:
        return pending_roots()
    roots = []
    with torch._C._DisableTorchDispatch():
        for t in tensors:
            if not hasattr(t, "_storage"):
                raise TypeError(f"expected tensors on the xla device, got {type(t).__name__}"
                                + (f" on {t.device}" if isinstance(t, torch.Tensor) else ""))
            roots.append(value_node(t))
    return roots


def _plan(tensors) -> GraphPlan:
    return plan_graph(roots_of(tensors))


def _shown(plan: GraphPlan, depth: int | None) -> set[int] | None:
    """Positions of ops at most ``depth`` hops before the roots (None: all)."""
    if depth is None:
        return None
    n_leaves = len(plan.leaves)
    dist = {p: 0 for p in plan.root_pos}
    for j in range(len(plan.steps) - 1, -1, -1):
        p = n_leaves + j
        if p in dist:
            for q in plan.steps[j][1]:
                d = dist[p] + 1
                if d < dist.get(q, d + 1):
                    dist[q] = d
    return {p for p, d in dist.items() if d < depth}


def ir_text(plan: GraphPlan, depth: int | None = None) -> str:
    from .dispatch import format_call
    lines = []
    n_leaves = len(plan.leaves)
    shown = _shown(plan, depth)
    hidden = len(plan.steps) - len([p for p in shown if p >= n_leaves]) if shown is not None else 0
    if hidden:
        lines.append(f"# {hidden} earlier ops not shown (depth={depth})")
    for i, leaf in enumerate(plan.leaves):
        if shown is None or i in shown:
            lines.append(f"%{i} = {_aval_text(leaf_meta(leaf))} device_data")
    k = 0
    for j, ((info, ins), node) in enumerate(zip(plan.steps, plan.op_nodes)):
        n = len(info.scalar_specs)
        call = format_call(info, [f"%{p}" for p in ins], plan.scalars[k:k + n])
        k += n
        if shown is not None and n_leaves + j not in shown:
            continue
        line = f"%{n_leaves + j} = {_aval_text(info.out)} {info.name}({call})"
        where = format_src(node.src)
        if where or node.scope:
            line += "  #"
            if where:
                line += f" {where}"
            if node.scope:
                line += f"  [{node.scope}]"
        lines.append(line)
    lines.append("outputs: " + ", ".join(f"%{p}" for p in plan.root_pos))
    return "\n".join(lines)


def _cluster_id(scope: str) -> str:
    return "cluster_" + re.sub(r"\W", "_", scope)


def ir_dot(plan: GraphPlan) -> str:
    """Graphviz DOT: ids are plan positions (the same from run to run), one cluster per
    module scope, the source line in each node's tooltip."""
    out = ["digraph xla_pending {", '  rankdir=TB; node [shape=box, style="rounded,filled", '
           'fillcolor="#eef3fb", fontname="Helvetica", fontsize=10];']
    n_leaves = len(plan.leaves)
    for i, leaf in enumerate(plan.leaves):
        out.append(f'  n{i} [label="%{i} data\\n{_aval_text(leaf_meta(leaf))}", '
                   f'shape=ellipse, fillcolor="#f3f3f3", tooltip="device data"];')
    by_scope: dict[str, list[str]] = {}
    for j, ((info, ins), node) in enumerate(zip(plan.steps, plan.op_nodes)):
        p = n_leaves + j
        label = f"%{p} {info.name}\\n{_aval_text(info.out)}"
        tip = html.escape(format_src(node.src) or "", quote=True)
        root = ', penwidth=2, color="#c0392b"' if p in plan.root_pos else ""
        by_scope.setdefault(node.scope, []).append(
            f'n{p} [label="{label}", tooltip="{tip}"{root}];')
    for scope, decls in by_scope.items():
        if scope:
            out.append(f'  subgraph {_cluster_id(scope)} {{ label="{scope}"; style=dashed; '
                       f'fontsize=9; fontname="Helvetica";')
            out.extend("    " + d for d in decls)
            out.append("  }")
        else:
            out.extend("  " + d for d in decls)
    for j, (info, ins) in enumerate(plan.steps):
        for q in ins:
            out.append(f"  n{q} -> n{n_leaves + j};")
    out.append("}")
    return "\n".join(out)


def pending_ir(*tensors, fmt: str = "text", depth: int | None = None) -> str:
    """The pending IR of ``tensors`` (all live pending tensors when none are given).

    ``depth`` keeps only the ops at most that many hops before the outputs (text form)."""
    if fmt not in ("text", "dot"):
        raise ValueError(f"fmt must be 'text' or 'dot', got {fmt!r}")
    if depth is not None and depth < 1:
        raise ValueError(f"depth must be a positive integer, got {depth!r}")
    plan = _plan(tensors)
    return ir_text(plan, depth) if fmt == "text" else ir_dot(plan)


def hlo(*tensors, dialect: str = "stablehlo", optimized: bool = False) -> str:
    """The module the next sync of ``tensors`` would compile, without running it.

    ``optimized=True`` compiles it (through the graph cache, so the sync that follows
    reuses the executable) and returns XLA's optimized HLO.
    """
    from .executor import compiled_graph, lower_graph
    from .ir import user_frame
    if dialect not in ("stablehlo", "hlo"):
        raise ValueError(f"dialect must be 'stablehlo' or 'hlo', got {dialect!r}")
    plan = _plan(tensors)
    if not plan.steps:
        return ""
    device = plan.roots[0].info.device
    if optimized:
        rec, _ = compiled_graph(plan, device, "xlanb.hlo(optimized=True)", user_frame())
        return rec.executable.as_text()
    return lower_graph(plan, device).as_text(dialect=dialect)


def pending_count(*tensors) -> int:
    """How many ops are pending for ``tensors`` (all live tensors when none are given)."""
    return len(_plan(tensors).steps)


INSTALL_DOT_HINT = ("Graphviz's `dot` is not installed: apt-get install graphviz "
                    "(Debian/Ubuntu), brew install graphviz (macOS) or conda install graphviz")


def render_svg(dot_source: str, timeout: float = 60.0) -> str:
    """DOT text rendered to SVG by Graphviz's ``dot``; a RuntimeError with an install hint
    when ``dot`` is not on PATH."""
    import shutil
    import subprocess
    exe = shutil.which("dot")
    if exe is None:
        raise RuntimeError(INSTALL_DOT_HINT)
    res = subprocess.run([exe, "-Tsvg"], input=dot_source.encode(), capture_output=True,
                         timeout=timeout)
    if res.returncode != 0:
        raise RuntimeError(f"dot failed: {res.stderr.decode(errors='replace').strip()}")
    return res.stdout.decode()
