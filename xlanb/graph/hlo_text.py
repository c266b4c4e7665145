"""Reading XLA's optimized HLO text: the sizes of instructions' results, where each
instruction came from, and the largest buffers of a module's entry computation.

Every instruction keeps the metadata of the op it came from: ``op_type`` (the aten op,
which xlanb sets), ``op_name`` (the module scope path and the aten op) and a stack frame
(the user's source line, through the module's ``FileNames``/``FunctionNames``/
``FileLocations``/``StackFrames`` tables, or ``source_file``/``source_line``).
"""
from __future__ import annotations

import re
from typing import NamedTuple

from ..base.formats import format_location
from ..base.frames import is_internal_file
from .updates import PARAM_SEGMENT

BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4,
         "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16,
         "f8e4m3fn": 1, "f8e5m2": 1, "s4": 1, "u4": 1}
_ARRAY = re.compile(r"\b([a-z]+\d*(?:e\d+m\d+(?:fn)?)?)\[([\d,]*)\]")


def _prod(dims: str) -> int:
    n = 1
    for d in dims.split(","):
        if d:
            n *= int(d)
    return n


def array_sizes(shape: str) -> list[tuple[int, str]]:
    """``(bytes, "f32[4,16]")`` for each array in an HLO result type (a tuple has many)."""
    return [(BYTES.get(dt, 4) * _prod(dims), f"{dt}[{dims}]") for dt, dims in _ARRAY.findall(shape)]


def attr(line: str, name: str) -> str:
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


def stack_tables(text: str) -> dict:
    """The module's source tables (file names, locations, stack frames), by id."""
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


def _frame_source(tables: dict, frame_id: int) -> str:
    try:
        frame = tables["StackFrames"][frame_id]
        loc = tables["FileLocations"][int(re.search(r"file_location_id=(\d+)", frame).group(1))]
        f = int(re.search(r"file_name_id=(\d+)", loc).group(1))
        line = int(re.search(r"\bline=(\d+)", loc).group(1))
        return format_location(tables['FileNames'][f].strip(chr(34)), line)
    except (KeyError, AttributeError, ValueError):
        return ""


def origin(line: str, tables: dict) -> tuple[str, str, str]:
    """``(op_type, op_name, source)`` of one instruction: its aten op (as xlanb set it,
    "" if none), its raw ``op_name`` and the user's ``file:line`` ("" if unknown)."""
    meta = attr(line, "metadata")
    op_type = re.search(r'op_type="([^"]*)"', meta)
    op_name = re.search(r'op_name="([^"]*)"', meta)
    frame = re.search(r"stack_frame_id=(\d+)", meta)
    src_file = re.search(r'source_file="([^"]*)"', meta)
    src_line = re.search(r"source_line=(\d+)", meta)
    if frame:
        source = _frame_source(tables, int(frame.group(1)))
    elif src_file and src_line:
        source = format_location(src_file.group(1), src_line.group(1))
    else:
        source = ""
    if source and is_internal_file(source.rpartition(":")[0]):
        # an instruction a compiler pass made (the TPU partitioner's collectives) may
        # carry the frame that lowered the whole graph: never the user's line
        source = ""
    return (op_type.group(1) if op_type else ""), (op_name.group(1) if op_name else ""), source


def aten_of(op_name: str) -> str:
    """The aten op named in an ``op_name`` path ("" if none)."""
    parts = op_name.split("/")
    found = next((p for p in reversed(parts) if p.startswith("aten::")), "")
    if not found and parts and parts[0] and not parts[0].startswith(("jit(", "(")):
        found = "aten::" + parts[0]  # the tail of a combined name lost its "aten::"
    return found


def scope_of(op_name: str, op_type: str) -> str:
    """``jit(run)/MLP/fc1/aten::addmm/dot_general`` -> ``MLP/fc1``. An optimizer's op
    named after its parameter's module (``param_of``) has no scope."""
    parts = op_name.split("/")
    if parts and parts[0].startswith("jit("):
        parts = parts[1:]
    if PARAM_SEGMENT in parts:
        return "/".join(parts[:parts.index(PARAM_SEGMENT)])
    if op_type and op_type in parts:
        parts = parts[:parts.index(op_type)]
    else:
        parts = [p for p in parts[:-1] if not p.startswith("aten::")]
    return "/".join(parts)


def param_of(op_name: str) -> str:
    """``jit(run)/xlanb-param/MLP/fc1/aten::add_/add`` -> ``MLP/fc1``: the module whose
    parameter an optimizer's op updates (graph/updates.py), "" if none is named."""
    parts = op_name.split("/")
    if PARAM_SEGMENT not in parts:
        return ""
    rest = parts[parts.index(PARAM_SEGMENT) + 1:]
    end = next((k for k, p in enumerate(rest) if p.startswith("aten::")), len(rest))
    return "/".join(rest[:end])


class HloBuffer(NamedTuple):
    """One instruction's result in a module's entry computation: a buffer XLA allocates
    while the executable runs (unless it reuses one whose value is dead)."""
    name: str     # the HLO instruction
    opcode: str   # fusion, dot, custom-call, ...
    shape: str    # its result type
    bytes: int
    op: str       # the aten op it came from, "" if unknown
    scope: str    # module scope path (``BertModel/encoder/layer/0``)
    source: str   # the user's ``file:line``, "" if unknown
    typed: str = ""  # its result type as printed, with layouts (``f32[8,128]{1,0:T(8,128)}``)


_INSTR = re.compile(r"^\s*(?P<root>ROOT )?%?(?P<name>[\w.\-]+) = (?P<shape>.*?) "
                    r"(?P<opcode>[a-z][\w\-]*)\(")
# Results that are no new buffer: the arguments, constants (in the executable), views
# of another buffer and the output tuple.
_NOT_BUFFERS = frozenset(("parameter", "constant", "get-tuple-element", "bitcast", "tuple",
                          "after-all", "partition-id", "replica-id"))


def entry_buffers(text: str) -> list[HloBuffer]:
    """The temporary buffers of an optimized module's entry computation (results that
    are not its output), largest first. Each is a buffer XLA allocates; its temp bytes
    (``memory_analysis().temp_size_in_bytes``) can be less than their sum, because XLA
    reuses a buffer once the value in it is dead."""
    tables = stack_tables(text)
    entry = []
    for line in text.splitlines():
        if line.startswith("ENTRY"):
            entry.append(line)
        elif entry:
            if line.startswith("}"):
                break
            entry.append(line)
    # the outputs: the root, or the operands of a root tuple
    outputs = set()
    for line in entry:
        m = _INSTR.match(line)
        if m is not None and m.group("root"):
            outputs.add(m.group("name"))
            if m.group("opcode") == "tuple":
                args = line[m.end():].split(")", 1)[0]
                outputs.update(a.strip().lstrip("%") for a in args.split(",") if a.strip())
    out = []
    for line in entry:
        m = _INSTR.match(line)
        if m is None or m.group("name") in outputs or m.group("opcode") in _NOT_BUFFERS:
            continue
        sizes = array_sizes(m.group("shape"))
        if not sizes:
            continue
        op_type, op_name, source = origin(line, tables)
        op_type = op_type or aten_of(op_name)
        out.append(HloBuffer(m.group("name"), m.group("opcode"),
                             ", ".join(t for _, t in sizes), sum(s for s, _ in sizes),
                             op_type, scope_of(op_name, op_type), source, m.group("shape")))
    out.sort(key=lambda b: -b.bytes)
    return out


class InstrOrigin(NamedTuple):
    """Where one instruction of an optimized module came from."""
    op: str       # the aten op ("" if none: a copy or layout change XLA added)
    scope: str    # module scope path, "/"-separated as in op_name
    sources: tuple  # ``file:line`` of its stack frames, innermost first (may be xlanb's)
    opcode: str   # fusion, dot, copy, ...


def frame_chain(tables: dict, frame_id: int) -> tuple:
    """``file:line`` of a stack frame and of each frame it was called from."""
    out = []
    seen = set()
    while frame_id and frame_id not in seen:
        seen.add(frame_id)
        src = _frame_source(tables, frame_id)
        if src:
            out.append(src)
        frame = tables.get("StackFrames", {}).get(frame_id, "")
        m = re.search(r"parent_frame_id=(\d+)", frame)
        frame_id = int(m.group(1)) if m else 0
    return tuple(out)


def instruction_origins(text: str) -> dict[str, InstrOrigin]:
    """Every instruction of an optimized module (any computation), by name: what XLA's
    profiler calls a thunk (``hlo_op``) is one of them. A fusion carries the metadata of
    the op it was built around."""
    tables = stack_tables(text)
    out = {}
    for line in text.splitlines():
        m = _INSTR.match(line)
        if m is None:
            continue
        op_type, op_name, source = origin(line, tables)
        op_type = op_type or aten_of(op_name)
        frame = re.search(r"stack_frame_id=(\d+)", attr(line, "metadata"))
        sources = frame_chain(tables, int(frame.group(1))) if frame else (
            (source,) if source else ())
        out[m.group("name")] = InstrOrigin(op_type, scope_of(op_name, op_type), sources,
                                           m.group("opcode"))
    return out


# ---------------------------------------------------------------------------------------
# Counted loops, in an unoptimized module (a ``lax.scan``'s while)

_COMPUTATION = re.compile(r"^(ENTRY )?%?([\w.\-]+) \(", re.M)


def computations(text: str) -> dict[str, tuple[bool, str]]:
    """Each computation of a module's text by name: ``(is the entry, its text)``."""
    out = {}
    starts = list(_COMPUTATION.finditer(text))
    for m, nxt in zip(starts, starts[1:] + [None]):
        body = text[m.start():nxt.start() if nxt else len(text)]
        body = body[:body.rfind("\n}") + 2] if "\n}" in body else body
        out[m.group(2)] = (bool(m.group(1)), body)
    return out


_WHILE = re.compile(r"\swhile\(.*condition=%?([\w.\-]+), body=%?([\w.\-]+)")
_LIMIT = re.compile(r"ROOT .* compare\(%?[\w.\-]+, %?([\w.\-]+)\), direction=LT")


def counted_loops(text: str) -> list[tuple[str, int]]:
    """``(body, trip count)`` for each while of the entry computation whose condition is
    JAX's scan test, ``counter < constant`` (the counter starts at 0)."""
    comps = computations(text)
    entry = next((t for is_entry, t in comps.values() if is_entry), "")
    loops = []
    for m in _WHILE.finditer(entry):
        cond = comps.get(m.group(1), (False, ""))[1]
        limit = _LIMIT.search(cond)
        trip = limit and re.search(
            rf"^\s*%?{re.escape(limit.group(1))} = \w+\[\] constant\((\d+)\)", cond, re.M)
        if trip:
            loops.append((m.group(2), int(trip.group(1))))
    return loops


def with_entry(text: str, name: str) -> str:
    """The module's text with computation ``name`` as its entry (the old entry left out),
    for costing one computation on its own."""
    first = _COMPUTATION.search(text)
    # the stack-frame tables between the header and the first computation stay
    preamble = text[:first.start()].split("\n", 1) if first else ["", ""]
    parts = [f"HloModule {name}_alone\n" + (preamble[1] if len(preamble) > 1 else "")]
    for comp, (is_entry, body) in computations(text).items():
        if not is_entry:
            parts.append(("ENTRY " + body) if comp == name else body)
    return "\n".join(parts)
