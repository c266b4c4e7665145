"""The collectives of a compiled (partitioned, optimized) HLO module, read from its text.

XLA's SPMD partitioner inserts the collectives; each keeps the metadata of the
instruction it came from: ``op_type`` (the aten op, which xlanb sets), ``op_name`` (the
module scope path and the aten op) and a stack frame (the user's source line, through
the module's ``FileNames``/``FunctionNames``/``FileLocations``/``StackFrames`` tables).
"""
from __future__ import annotations

import re
from typing import NamedTuple

from ..base.frames import source_text
from ..base.formats import format_hash, format_table, format_table_html
from .hlo_text import aten_of, array_sizes, attr, origin, scope_of, stack_tables

KINDS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute",
         "collective-broadcast", "ragged-all-to-all")

_INSTR = re.compile(r"^\s*(?:ROOT )?%?(?P<name>[\w.\-]+) = (?P<shape>.*?) "
                    r"(?P<op>" + "|".join(re.escape(k) for k in KINDS) + r")(?P<start>-start)?\(")


class Collective(NamedTuple):
    """One collective of a compiled module."""
    kind: str            # all-reduce, all-gather, reduce-scatter, all-to-all, collective-permute
    name: str            # the HLO instruction's name
    shape: str           # its result type on each device (``f32[4,16]``)
    bytes: int           # bytes of that result on each device
    groups: str          # replica_groups (or source_target_pairs for a permute)
    op: str              # the aten op it came from (HLO op_type), "" if unknown
    scope: str           # module scope path from HLO op_name (``MLP/fc1``)
    source: str          # the user's ``file:line`` that recorded the op, "" if unknown


_MESH_GROUPS = re.compile(r"^mesh\[([^\]]*)\]")


def _named_axes(groups: str, axes) -> str:
    """XLA prints mesh replica groups over axes it calls ``axis_0``...; when they are
    the graph's mesh axes (same sizes, same order), use the user's names. XLA may add
    axes of size 1 of its own (``mesh['axis_0'=2,'axis_1'=1,'axis_2'=4]`` for a
    ``(data=2, model=4)`` mesh): they group nothing, and are left out."""
    m = _MESH_GROUPS.match(groups)
    if not m or not axes:
        return groups
    found = re.findall(r"'(axis_\d+)'=(\d+)", m.group(1))
    names, sizes = list(axes), [int(n) for n in axes.values()]
    rename, k = {}, 0
    for xla_name, n in found:
        if k < len(sizes) and int(n) == sizes[k]:
            rename[xla_name] = names[k]
            k += 1
        elif int(n) != 1:  # not the user's mesh: say what XLA says
            return groups
    if k != len(sizes):
        return groups
    head = "mesh[" + ",".join(f"{rename[x]!r}={n}" for x, n in found if x in rename) + "]"
    rest = groups[m.end():]
    for xla_name, _ in found:  # the grouped axes: the user's names; an added one: gone
        rest = re.sub(rf"'{xla_name}'(,\s*)?", (f"{rename[xla_name]!r}\\1" if xla_name in rename
                                               else ""), rest)
    return head + re.sub(r",\s*\}", "}", rest)


def parse_collectives(text: str, axes: dict | None = None) -> list[Collective]:
    """Every collective instruction of an HLO module's text (async pairs once, at their
    ``-start``). ``axes`` (the mesh's axis name -> size) names mesh replica groups."""
    tables = stack_tables(text)
    out = []
    for line in text.splitlines():
        m = _INSTR.match(line)
        if m is None:
            continue
        sizes = array_sizes(m.group("shape"))
        if m.group("start") and sizes:  # (operand, result, ...): the result is the largest
            nbytes, shape = max(sizes)
        else:
            nbytes = sum(s for s, _ in sizes)
            shape = ", ".join(t for _, t in sizes)
        groups = _named_axes(attr(line, "replica_groups") or attr(line, "source_target_pairs"),
                             axes)
        op_type, op_name, source = origin(line, tables)
        combined = re.sub(r"^jit\([^)]*\)/", "", op_name)
        if combined.startswith("(") and ":" in combined:
            # collectives XLA combined into one: "(a/aten::x/y:b/aten::z/w)"; name each op
            names = [aten_of(n if n.startswith("aten::") else "aten::" + n)
                     for n in combined.strip("()").split(":aten::")]
            op_type = op_type or "+".join(dict.fromkeys(n for n in names if n))
            op_name = ""
        if not op_type:  # an op XLA's passes renamed: its aten op is still in op_name
            op_type = aten_of(op_name)
        out.append(Collective(m.group("op"), m.group("name"), shape, nbytes, groups, op_type,
                              scope_of(op_name, op_type), source))
    return out


class CollectiveList(list):
    """``xlanb.collectives()``: a list of ``Collective``, printable as a table."""

    HEADER = ("kind", "shape", "bytes", "groups", "aten op", "scope", "source")
    RIGHT = ()
    _COLUMNS = HEADER

    def __init__(self, items=(), graph_hash: str = ""):
        super().__init__(items)
        self.graph_hash = graph_hash

    @property
    def total_bytes(self) -> int:
        return sum(c.bytes for c in self)

    def counts(self) -> dict:
        out: dict = {}
        for c in self:
            out[c.kind] = out.get(c.kind, 0) + 1
        return out

    def rows(self, short=lambda s: s) -> list[tuple]:
        return [(c.kind, c.shape, str(c.bytes), c.groups, c.op, c.scope, short(c.source))
                for c in self]

    def headline(self) -> str:
        """The line above the table: how many of each kind, and the bytes per device."""
        head = f"graph {format_hash(self.graph_hash)}: " if self.graph_hash else ""
        if not self:
            return head + "no collectives"
        counts = ", ".join(f"{n} {k}" for k, n in self.counts().items())
        return f"{head}{len(self)} collectives ({counts}), {self.total_bytes} bytes per device"

    def __str__(self) -> str:
        if not self:
            return self.headline()
        return self.headline() + "\n" + format_table(self.HEADER, self.rows(_short))

    __repr__ = __str__  # a table in a terminal and as a notebook's text

    def _repr_html_(self) -> str:
        import html
        return f"<div>{html.escape(self.headline())}</div>" + format_table_html(
            self.HEADER, self.rows(_short), cls="xlanb-collectives")


def _short(source: str) -> str:
    """``/long/path/train.py:12`` -> ``train.py:12``; a notebook cell's -> ``In[5]:12``."""
    return source_text(source)
