"""The collectives of a compiled (partitioned, optimized) HLO module, read from its text.

XLA's SPMD partitioner inserts the collectives; each keeps the metadata of the
instruction it came from: ``op_type`` (the aten op, which xlanb sets), ``op_name`` (the
module scope path and the aten op) and a stack frame (the user's source line, through
the module's ``FileNames``/``FunctionNames``/``FileLocations``/``StackFrames`` tables).
"""
from __future__ import annotations

import re
from typing import NamedTuple

from ..base.tables import format_table

KINDS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute",
         "collective-broadcast", "ragged-all-to-all")

_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4,
          "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16,
          "f8e4m3fn": 1, "f8e5m2": 1, "s4": 1, "u4": 1}
_INSTR = re.compile(r"^\s*(?:ROOT )?%?(?P<name>[\w.\-]+) = (?P<shape>.*?) "
                    r"(?P<op>" + "|".join(re.escape(k) for k in KINDS) + r")(?P<start>-start)?\(")
_ARRAY = re.compile(r"\b([a-z]+\d*(?:e\d+m\d+(?:fn)?)?)\[([\d,]*)\]")


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


def _attr(line: str, name: str) -> str:
    """The value of ``name=...`` in an HLO instruction, up to the next top-level comma."""
    i = line.find(name + "=")
    if i < 0:
        return ""
    i += len(name) + 1
    depth = 0
    j = i
    while j < len(line):
        c = line[j]
        if c in "{[(":
            depth += 1
        elif c in "}])":
            if depth == 0:
                break
            depth -= 1
        elif c == "," and depth == 0:
            break
        j += 1
    return line[i:j].strip()


def _tables(text: str) -> dict:
    tables: dict = {}
    section = None
    for line in text.splitlines():
        if line in ("FileNames", "FunctionNames", "FileLocations", "StackFrames"):
            section = tables.setdefault(line, {})
            continue
        m = re.match(r"^(\d+) (.*)$", line)
        if section is not None and m:
            section[int(m.group(1))] = m.group(2)
        elif line.startswith("%") or line.startswith("ENTRY"):
            break
        else:
            section = None
    return tables


def _source(tables: dict, frame_id: int) -> str:
    try:
        frame = tables["StackFrames"][frame_id]
        loc = tables["FileLocations"][int(re.search(r"file_location_id=(\d+)", frame).group(1))]
        f = int(re.search(r"file_name_id=(\d+)", loc).group(1))
        line = int(re.search(r"\bline=(\d+)", loc).group(1))
        return f"{tables['FileNames'][f].strip(chr(34))}:{line}"
    except (KeyError, AttributeError, ValueError):
        return ""


def _scope(op_name: str, op_type: str) -> str:
    """``jit(run)/MLP/fc1/aten::addmm/dot_general`` -> ``MLP/fc1``."""
    parts = op_name.split("/")
    if parts and parts[0].startswith("jit("):
        parts = parts[1:]
    if op_type and op_type in parts:
        parts = parts[:parts.index(op_type)]
    else:
        parts = [p for p in parts[:-1] if not p.startswith("aten::")]
    return "/".join(parts)


_MESH_GROUPS = re.compile(r"^mesh\[([^\]]*)\]")


def _named_axes(groups: str, axes) -> str:
    """XLA prints mesh replica groups over axes it calls ``axis_0``...; when they are
    the graph's mesh axes (same sizes, same order), use the user's names."""
    m = _MESH_GROUPS.match(groups)
    if not m or not axes:
        return groups
    found = re.findall(r"'(axis_\d+)'=(\d+)", m.group(1))
    if [int(n) for _, n in found] != [int(n) for n in axes.values()]:
        return groups
    for (xla_name, _), name in zip(found, axes):
        groups = groups.replace(f"'{xla_name}'", repr(name))
    return groups


def parse_collectives(text: str, axes: dict | None = None) -> list[Collective]:
    """Every collective instruction of an HLO module's text (async pairs once, at their
    ``-start``). ``axes`` (the mesh's axis name -> size) names mesh replica groups."""
    tables = _tables(text)
    out = []
    for line in text.splitlines():
        m = _INSTR.match(line)
        if m is None:
            continue
        arrays = _ARRAY.findall(m.group("shape"))
        sizes = [(_BYTES.get(dt, 4) * _prod(dims), f"{dt}[{dims}]") for dt, dims in arrays]
        if m.group("start") and sizes:  # (operand, result, ...): the result is the largest
            nbytes, shape = max(sizes)
        else:
            nbytes = sum(s for s, _ in sizes)
            shape = ", ".join(t for _, t in sizes)
        groups = _named_axes(_attr(line, "replica_groups") or _attr(line, "source_target_pairs"),
                             axes)
        meta = _attr(line, "metadata")
        op_type = re.search(r'op_type="([^"]*)"', meta)
        op_name = re.search(r'op_name="([^"]*)"', meta)
        frame = re.search(r"stack_frame_id=(\d+)", meta)
        src_file = re.search(r'source_file="([^"]*)"', meta)
        src_line = re.search(r"source_line=(\d+)", meta)
        op_type = op_type.group(1) if op_type else ""
        op_name = op_name.group(1) if op_name else ""
        if frame:
            source = _source(tables, int(frame.group(1)))
        elif src_file and src_line:
            source = f"{src_file.group(1)}:{src_line.group(1)}"
        else:
            source = ""
        combined = re.sub(r"^jit\([^)]*\)/", "", op_name)
        if combined.startswith("(") and ":" in combined:
            # collectives XLA combined into one: "(a/aten::x/y:b/aten::z/w)"; name each op
            names = [_aten_of(n if n.startswith("aten::") else "aten::" + n)
                     for n in combined.strip("()").split(":aten::")]
            op_type = op_type or "+".join(dict.fromkeys(n for n in names if n))
            op_name = ""
        if not op_type:  # an op XLA's passes renamed: its aten op is still in op_name
            op_type = _aten_of(op_name)
        out.append(Collective(m.group("op"), m.group("name"), shape, nbytes, groups, op_type,
                              _scope(op_name, op_type), source))
    return out


def _aten_of(op_name: str) -> str:
    parts = op_name.split("/")
    found = next((p for p in reversed(parts) if p.startswith("aten::")), "")
    if not found and parts and parts[0] and not parts[0].startswith(("jit(", "(")):
        found = "aten::" + parts[0]  # the tail of a combined name lost its "aten::"
    return found


def _prod(dims: str) -> int:
    n = 1
    for d in dims.split(","):
        if d:
            n *= int(d)
    return n


class CollectiveList(list):
    """``xlanb.collectives()``: a list of ``Collective``, printable as a table."""

    _COLUMNS = ("kind", "shape", "bytes", "groups", "aten op", "scope", "source")

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

    def __str__(self) -> str:
        head = f"graph {self.graph_hash[:12]}: " if self.graph_hash else ""
        if not self:
            return head + "no collectives"
        counts = ", ".join(f"{n} {k}" for k, n in self.counts().items())
        return (f"{head}{len(self)} collectives ({counts}), {self.total_bytes} bytes per device\n"
                + format_table(self._COLUMNS, self.rows(_short)))

    __repr__ = __str__  # a table in a terminal and as a notebook's text

    def _repr_html_(self) -> str:
        import html
        head = "".join(f"<th>{c}</th>" for c in self._COLUMNS)
        body = "".join("<tr>" + "".join(f"<td>{html.escape(v)}</td>" for v in r) + "</tr>"
                       for r in self.rows(_short))
        title = html.escape(str(self).split("\n")[0])
        return f"<div>{title}</div><table class='xlanb-collectives'><tr>{head}</tr>{body}</table>"


def _short(source: str) -> str:
    """``/long/path/train.py:12`` -> ``train.py:12``."""
    return source.rsplit("/", 1)[-1]
