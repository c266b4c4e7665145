"""A plain-data description of a graph: per op its name, result type, arguments, source
line, module scope and inputs. Pending graphs and compiled graphs share it, so the same
renderers (text, DOT) and the recompile diff work on both, long after the IR is gone."""
from __future__ import annotations

from typing import NamedTuple

import torch

from ..base.frames import SourceLoc
from ..ir.nodes import leaf_meta
from ..runtime.mesh import is_sharded, sharding_text
from ..ir.templates import format_call

_DTYPE_SHORT = {
    torch.float32: "f32", torch.float64: "f64", torch.float16: "f16", torch.bfloat16: "bf16",
    torch.int64: "s64", torch.int32: "s32", torch.int16: "s16", torch.int8: "s8",
    torch.uint8: "u8", torch.bool: "pred", torch.complex64: "c64", torch.complex128: "c128",
}


def aval_text(meta) -> str:
    """``f32[8,128]``; a tuple of them for multi-output ops."""
    if isinstance(meta, tuple) and not hasattr(meta, "shape"):
        return "(" + ", ".join(aval_text(m) for m in meta if m is not None) + ")"
    return f"{_DTYPE_SHORT.get(meta.dtype, str(meta.dtype))}[{','.join(map(str, meta.shape))}]"


class OpRecord(NamedTuple):
    name: str     # aten::addmm
    aval: str     # f32[8,16]
    call: str     # %3, %10, %11, beta=1
    src: SourceLoc | None  # the user's line that recorded it
    scope: str    # BertModel.encoder.layer.0
    ins: tuple    # positions of its inputs (leaves first, then ops)
    static: str   # ``call`` with lifted floats as <float>: what the compile depends on


class GraphSummary(NamedTuple):
    inputs: tuple   # aval text per leaf (positions 0..len-1)
    ops: tuple      # OpRecord per op (positions len(inputs)..)
    outputs: tuple  # positions of the graph's outputs
    # SPMD: (position, sharding text) of each sharded input, annotated op
    # (``xlanb::mark_sharding``) and, once compiled, output (the partitioner's choice)
    shardings: tuple = ()
    # repeated layers folded in the text view: (op index where the fold line goes, the
    # line, frozenset of op indices it stands for), per run (graph/repeats.py)
    folds: tuple = ()


class _Lifted(float):
    """Stands for a lifted float (a graph input, not part of the compiled program)."""

    def __format__(self, spec):
        return "<float>"


_LIFTED = _Lifted(0.0)


def summarize(plan) -> GraphSummary:
    ops = []
    k = 0
    for (info, ins), node in zip(plan.steps, plan.op_nodes):
        n = len(info.scalar_specs)
        names = [f"%{p}" for p in ins]
        call = format_call(info, names, plan.scalars[k:k + n])
        static = format_call(info, names, [_LIFTED] * n) if n else call
        k += n
        ops.append(OpRecord(info.name, aval_text(info.out), call, node.src,
                            node.scope, ins, static))
    return GraphSummary(tuple(aval_text(leaf_meta(n)) for n in plan.leaves), tuple(ops),
                        tuple(plan.root_pos), _shardings(plan))


def _shardings(plan) -> tuple:
    out = []
    for i, n in enumerate(plan.leaves):
        data = n.data
        if data is not None and not isinstance(data, tuple) and is_sharded(data):
            # a leaf mark_sharding made remembers where: a recompile it causes names it
            # (ops.leaves.is_placed, a layer above, asks the same)
            marked = type(n.info.sig) is tuple and n.info.sig[:1] == ("placed",)
            out.append((i, sharding_text(data.sharding)
                        + (f" (marked at {n.src.short})" if marked else "")))
    n_in = len(plan.leaves)
    for j, (info, _) in enumerate(plan.steps):
        if info.sharding is not None:
            out.append((n_in + j, "annotated " + sharding_text(info.sharding)))
    return tuple(out)


def sharding_colour(text: str) -> str:
    """A fill colour per sharding (the same text, the same colour in every drawing)."""
    import zlib
    core = text.split(" (marked")[0].replace("annotated ", "").replace("propagated ", "")
    return _COLOURS[zlib.crc32(core.encode()) % len(_COLOURS)]


_COLOURS = ("#8dd3c7", "#ffffb3", "#bebada", "#fb8072", "#80b1d3", "#fdb462", "#b3de69",
            "#fccde5", "#bc80bd", "#ccebc5", "#ffed6f")
