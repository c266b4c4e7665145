"""Device memory: what holds it, from which line, and whether a graph fits before it runs.

Three figures, each from where it is true:

- **tensors** (``memory_allocated``): the device buffers that hold live xla tensors'
  storages, each buffer once. A view shares its base's storage and adds nothing, as in
  torch. Found by walking the garbage collector's objects when asked, so the per-op hot
  path keeps no books at all;
- **device** (``device_bytes``): every buffer xlanb holds on the device, from JAX's own
  list of live arrays: the tensors, plus eager views' copies (XLA has no aliasing view, so
  a view that ran keeps its own copy), values kept for peeks, inputs that pending work
  still needs, and lifted scalars. Cheap enough to sample at every sync: the timeline and
  the peak are of this figure, and a memory limit is checked against it;
- **each compiled graph's** argument, output, alias, temp and peak bytes, from XLA's
  ``memory_analysis()`` of its executable.

Eager results remember their user's line only when they are at least
``XLANB_MEMORY_LINE_BYTES`` big (one flag test per op); lazy and opbyop nodes always have it.
"""
from __future__ import annotations

import functools
import gc
import os
import time
from typing import NamedTuple

import jax
import torch

from ..base.config import config
from ..base.caches import cache
from ..base.frames import PACKAGE_DIR, SourceLoc, format_loc
from ..base.session import session
from ..base.formats import format_bytes, format_hash, format_table, format_table_html, parse_bytes
from ..graph.hlo_text import array_sizes, entry_buffers
from ..ir.nodes import result_bytes
from ..ops.infos import getitem_infos, infos
from ..ops.views import scatter_infos
from ..runtime.devices import device_index, jax_device, jax_devices
from ..ir.tensor import Storage, XlaTensor
from .peeks import peek_values


# ---------------------------------------------------------------------------------------
# An executable's memory, as XLA analysed it

class GraphMemory(NamedTuple):
    """XLA's memory analysis of one executable (``compiled.memory_analysis()``), in bytes.

    ``peak_bytes`` is the device memory the executable needs at once while it runs:
    ``argument + output + temp - alias``, every argument, output and temporary live
    together, an output written into a donated argument counted once. It is an upper
    bound: XLA may free an argument or a temporary before the last output is written.
    ``xla_peak_bytes`` is XLA's own heap-simulation figure where the backend gives one
    (0 otherwise); on XLA:CPU it can be less than the outputs and temps, so the limit
    is checked against ``peak_bytes``."""
    argument_bytes: int
    output_bytes: int
    alias_bytes: int     # outputs written into donated argument buffers
    temp_bytes: int      # scratch the executable allocates while it runs
    peak_bytes: int
    code_bytes: int      # generated code (host memory on XLA:CPU)
    xla_peak_bytes: int = 0

    @property
    def extra_bytes(self) -> int:
        """What running it adds to the device beyond its (already live) arguments."""
        return max(0, self.peak_bytes - self.argument_bytes)

    def __str__(self) -> str:
        return (f"peak {format_bytes(self.peak_bytes)} (arguments {format_bytes(self.argument_bytes)}, "
                f"outputs {format_bytes(self.output_bytes)}, temps {format_bytes(self.temp_bytes)}, "
                f"aliased {format_bytes(self.alias_bytes)})")


def graph_memory(executable) -> GraphMemory | None:
    """``executable``'s ``GraphMemory``, or None where the backend does not analyse it."""
    try:
        ma = executable.memory_analysis()
    except Exception:  # not every backend (or loaded executable) implements it
        return None
    if ma is None:
        return None
    arg, out = ma.argument_size_in_bytes, ma.output_size_in_bytes
    alias, temp = ma.alias_size_in_bytes, ma.temp_size_in_bytes
    return GraphMemory(arg, out, alias, temp, arg + out + temp - alias,
                       ma.generated_code_size_in_bytes, getattr(ma, "peak_memory_in_bytes", 0) or 0)


_op_memory = cache({}, "OpSignature uid -> its single-op executable's memory analysis", compiled=True)


def op_memory(info) -> GraphMemory | None:
    """The memory analysis of ``info``'s single-op executable (once per signature)."""
    got = _op_memory.get(info.uid)
    if got is None and info.exe is not None:
        got = _op_memory[info.uid] = graph_memory(info.exe)
    return got


# ---------------------------------------------------------------------------------------
# Device buffers: JAX's live arrays

@functools.cache
def _device_indices() -> dict:
    return {d: i for i, d in enumerate(jax_devices())}


def array_bytes_by_device(a, out: dict, where: dict) -> None:
    """Add the bytes ``a`` holds on each of this process's devices into ``out``
    (``where``: jax Device -> xla index)."""
    if isinstance(a, tuple):
        for x in a:
            array_bytes_by_device(x, out, where)
        return
    sharding = a.sharding
    devices = sharding.device_set
    if len(devices) == 1:
        i = where.get(next(iter(devices)))
        if i is not None:
            out[i] = out.get(i, 0) + a.nbytes
        return
    shard = a.dtype.itemsize
    for d in sharding.shard_shape(a.shape):
        shard *= d
    for dev in devices:
        i = where.get(dev)
        if i is not None:
            out[i] = out.get(i, 0) + shard


def device_bytes() -> dict:
    """Bytes of every live device buffer, by xla device index (JAX's ``live_arrays``,
    which leaves deleted arrays out). Every sync calls it: about 0.3 µs per live buffer
    on one device (``nbytes`` and ``sharding.device_set`` cost several times that)."""
    where = _device_indices()
    arrays = jax.live_arrays(config.platform)
    if len(where) == 1:  # one device: every array of the platform is on it
        total = 0
        for a in arrays:
            total += a.size * a.dtype.itemsize
        return {0: total} if arrays else {}
    out: dict = {}
    placed: dict = {}  # sharding -> xla index, or None for one spanning several devices
    for a in arrays:
        sh = a.sharding
        i = placed.get(sh, -1)
        if i == -1:
            devices = sh.device_set
            i = placed[sh] = where.get(next(iter(devices))) if len(devices) == 1 else None
        if i is not None:
            out[i] = out.get(i, 0) + a.size * a.dtype.itemsize
        else:
            array_bytes_by_device(a, out, where)
    return out


def platform_stats(index: int) -> dict | None:
    """The platform allocator's own figures (``bytes_in_use``, ``peak_bytes_in_use``,
    ``bytes_limit``...) where it reports them (TPU, GPU); None on XLA:CPU."""
    try:
        stats = jax_device(index).memory_stats()
    except Exception:
        return None
    return dict(stats) if stats else None


# ---------------------------------------------------------------------------------------
# What holds device memory: a walk over live tensors

class Holding(NamedTuple):
    """One buffer (or pending value) and who made it."""
    kind: str              # "tensor", "pending", "view copy", "peek"
    device: int
    bytes: int
    loc: SourceLoc | None  # the user's line that made its value
    scope: str             # the nn.Module path active then
    op: str                # the aten op that made it


def _nbytes_on(a, index: int, where: dict) -> int:
    out: dict = {}
    array_bytes_by_device(a, out, where)
    return out.get(index, 0)


def _subclasses(cls) -> list:
    out = [cls]
    for sub in cls.__subclasses__():
        out.extend(_subclasses(sub))
    return out


def holdings() -> list[Holding]:
    """Every live tensor storage's buffer (each once), pending values, eager views' copies
    and peek values, with their lines. Walks the garbage collector's objects: costs
    milliseconds, and nothing on the per-op path."""
    where = _device_indices()
    wanted = {Storage, *_subclasses(XlaTensor)}
    found = [o for o in gc.get_objects() if type(o) in wanted]  # one pass, in C mostly
    storages = [o for o in found if type(o) is Storage]
    views = [o for o in found if type(o) is not Storage and o._view]
    out: list[Holding] = []
    seen: set = set()
    for s in storages:
        node = s.node
        data = node.data
        # credited to what made the storage, not to the last in-place update of it
        src, scope, op = getattr(s, "born", None) or (node.src, node.scope, node.info.name)
        if data is None:
            out.append(Holding("pending", s.device, result_bytes(s.meta), src, scope, op))
            continue
        if id(data) in seen:
            continue
        seen.add(id(data))
        per: dict = {}
        array_bytes_by_device(data, per, where)
        for i, n in per.items():
            out.append(Holding("tensor", i, n, src, scope, op))
    for v in views:
        node = v._node
        if node is None or v._ver != v._storage.version or node.data is None:
            continue
        if id(node.data) in seen:
            continue
        seen.add(id(node.data))
        per = {}
        array_bytes_by_device(node.data, per, where)
        for i, n in per.items():
            out.append(Holding("view copy", i, n, node.src, node.scope, node.info.name))
    for node, value in list(peek_values._entries.values()):
        per = {}
        array_bytes_by_device(value, per, where)
        for i, n in per.items():
            out.append(Holding("peek", i, n, node.src, node.scope, node.info.name))
    return out


class MemoryRow(NamedTuple):
    """One line (and module scope) of ``memory_by_line``: the live values it made."""
    source: str            # ``train.py:12 step`` (``In[3]:2`` in a notebook), or "(...)"
    scope: str
    count: int             # tensors (buffers)
    bytes: int
    loc: SourceLoc | None  # the line as data
    op: str                # the op that made them, when no line was recorded


class MemoryByLine(list):
    """``xlanb.memory_by_line()``: device rows (largest first), with ``pending`` (values
    not yet computed, and the bytes they will take) and ``peeks`` (values kept for peeks
    until the next sync) apart. Views do not count: they share their base's storage."""

    def __init__(self, rows, pending, peeks, device: int, stats: dict | None = None):
        super().__init__(rows)
        self.pending = pending
        self.peeks = peeks
        self.device = device
        self.stats = stats  # memory_stats() from the same walk

    @property
    def total_bytes(self) -> int:
        return sum(r.bytes for r in self)

    @staticmethod
    def _table(rows) -> str:
        return format_table(("bytes", "tensors", "source", "scope"),
                            [(format_bytes(r.bytes), str(r.count), r.source, r.scope) for r in rows],
                            right=(0, 1))

    def __str__(self) -> str:
        parts = [f"xla:{self.device}: {format_bytes(self.total_bytes)} in live tensors, by the line "
                 "that made them"]
        parts.append(self._table(self) if self else "  (none)")
        if self.pending:
            parts.append(f"pending (not computed yet; will take "
                         f"{format_bytes(sum(r.bytes for r in self.pending))}):")
            parts.append(self._table(self.pending))
        if self.peeks:
            parts.append(f"kept for peeks until the next sync "
                         f"({format_bytes(sum(r.bytes for r in self.peeks))}):")
            parts.append(self._table(self.peeks))
        return "\n".join(parts)

    __repr__ = __str__

    def _repr_html_(self) -> str:
        import html

        def table(title, rows):
            cells = [(format_bytes(r.bytes), str(r.count), r.source, r.scope) for r in rows]
            return f"<div>{html.escape(title)}</div>" + format_table_html(
                ("bytes", "tensors", "source", "scope"), cells, right=(0, 1), cls="xlanb-memory")
        out = table(f"xla:{self.device}: {format_bytes(self.total_bytes)} in live tensors", self)
        if self.pending:
            out += table("pending (will take)", self.pending)
        if self.peeks:
            out += table("kept for peeks until the next sync", self.peeks)
        return out


def _rows(items) -> list[MemoryRow]:
    groups: dict = {}
    for h in items:
        key = (h.loc, h.scope) if h.loc is not None else (None, h.scope, h.op)
        g = groups.get(key)
        groups[key] = (h, 1, h.bytes) if g is None else (g[0], g[1] + 1, g[2] + h.bytes)
    rows = []
    for (h, count, nbytes) in groups.values():
        source = format_loc(h.loc) if h.loc is not None else f"({h.op}: line not recorded)"
        rows.append(MemoryRow(source, h.scope, count, nbytes, h.loc, h.op))
    rows.sort(key=lambda r: -r.bytes)
    return rows


def memory_by_line(device=None) -> MemoryByLine:
    """One row per source line (and module scope) that made live tensors on ``device``:
    ``.source``, ``.scope``, ``.count``, ``.bytes``, largest first; ``.stats`` is
    ``memory_stats()`` from the same walk of live objects (which costs milliseconds:
    about 0.2 µs per object the garbage collector tracks)."""
    __debuggerskip__ = True  # IPython's debugger steps over xlanb frames
    index = device_index(device)
    return _by_line([h for h in holdings() if h.device == index], index)


def _by_line(hs: list, index: int) -> MemoryByLine:
    return MemoryByLine(_rows(h for h in hs if h.kind == "tensor"),
                        _rows(h for h in hs if h.kind == "pending"),
                        _rows(h for h in hs if h.kind == "peek"), index, _stats(hs, index))


# ---------------------------------------------------------------------------------------
# Figures, the peak and the timeline

class MemorySample(NamedTuple):
    """Device bytes after one sync (``xlanb.memory_timeline()``)."""
    index: int        # the sync's number in this session
    time: float       # perf_counter seconds when sampled
    device: dict      # xla index -> bytes of live device buffers after the sync
    cause: str
    # xla index -> the most bytes seen since the previous sync: the projected peaks of
    # the graphs (and checked ops) that ran, temporaries included, and the samples
    peak: dict = {}


_timeline = cache([], "MemorySample per sync")
_peaks = cache({}, "xla index -> the most device bytes sampled")
TIMELINE_MAX = 100_000


_step_peaks = cache({}, "xla index -> the most device bytes since the last sync's sample")


def _note_peak(index: int, nbytes: int) -> None:
    if nbytes > _peaks.get(index, 0):
        _peaks[index] = nbytes
    if nbytes > _step_peaks.get(index, 0):
        _step_peaks[index] = nbytes


def sample(cause: str) -> dict:
    """Device bytes now, into the peak and the timeline (every sync calls it)."""
    now = device_bytes()
    for i, n in now.items():
        _note_peak(i, n)
    if len(_timeline) >= TIMELINE_MAX:  # a very long run: keep the recent half
        del _timeline[:TIMELINE_MAX // 2]
    t = time.perf_counter()
    idx = _timeline[-1].index + 1 if _timeline else 0
    _timeline.append(MemorySample(idx, t, now, cause, dict(_step_peaks)))
    _step_peaks.clear()
    return now


class MemoryTimeline(list):
    """``xlanb.memory_timeline()``: a ``MemorySample`` per sync, oldest first."""

    def bytes(self, device: int = 0) -> list[int]:
        """Device bytes after each sync."""
        return [s.device.get(device, 0) for s in self]

    def peaks(self, device: int = 0) -> list[int]:
        """The most device bytes between each sync and the one before (graph peaks)."""
        return [max(s.peak.get(device, 0), s.device.get(device, 0)) for s in self]

    def seconds(self) -> list[float]:
        return [s.time - self[0].time for s in self] if self else []

    def __str__(self) -> str:
        if not self:
            return "no syncs sampled"
        b = self.bytes()
        return (f"{len(self)} syncs sampled on xla:0: first {format_bytes(b[0])}, last "
                f"{format_bytes(b[-1])}, most {format_bytes(max(b))}")

    __repr__ = __str__


def memory_timeline() -> MemoryTimeline:
    """Device bytes after each sync of this session (``%xla_memory --timeline`` plots it)."""
    return MemoryTimeline(_timeline)


def memory_allocated(device=None) -> int:
    """Bytes of the device buffers that hold live xla tensors on ``device`` (views add
    nothing; pending tensors take nothing yet)."""
    __debuggerskip__ = True  # IPython's debugger steps over xlanb frames
    index = device_index(device)
    return sum(h.bytes for h in holdings() if h.kind == "tensor" and h.device == index)


def memory_reserved(device=None) -> int:
    """Bytes of every device buffer xlanb holds on ``device``: the tensors, plus eager
    views' copies, values kept for peeks, inputs pending work needs and lifted scalars
    (JAX's live arrays; cheap: no walk)."""
    index = device_index(device)
    now = device_bytes().get(index, 0)
    _note_peak(index, now)
    return now


def max_memory_reserved(device=None) -> int:
    """The peak of ``memory_reserved``, as sampled (see ``max_memory_allocated``)."""
    index = device_index(device)
    return max(_peaks.get(index, 0), memory_reserved(index))


def max_memory_allocated(device=None) -> int:
    """The most device memory xlanb held on ``device`` since the start or the last
    ``reset_peak_memory_stats``: sampled at every sync, every graph run (with the graph's
    own peak, temporaries included) and every memory query. Never less than
    ``memory_allocated``."""
    __debuggerskip__ = True  # IPython's debugger steps over xlanb frames
    index = device_index(device)
    now = device_bytes().get(index, 0)
    _note_peak(index, now)
    return max(_peaks.get(index, 0), memory_allocated(index))


def reset_peak_memory_stats(device=None) -> None:
    """Start the peak over from what the device holds now."""
    index = device_index(device)
    _peaks[index] = device_bytes().get(index, 0)


def memory_stats(device=None) -> dict:
    """Memory figures of ``device`` as a flat dict (torch's dotted style); the platform
    allocator's own under ``platform.*`` where it reports them (TPU, GPU)."""
    __debuggerskip__ = True  # IPython's debugger steps over xlanb frames
    index = device_index(device)
    return _stats([h for h in holdings() if h.device == index], index)


def _stats(hs: list, index: int) -> dict:
    dev = device_bytes().get(index, 0)
    _note_peak(index, dev)
    by_kind: dict = {}
    for h in hs:
        c, n = by_kind.get(h.kind, (0, 0))
        by_kind[h.kind] = (c + 1, n + h.bytes)
    tensors = by_kind.get("tensor", (0, 0))
    counted = sum(by_kind.get(k, (0, 0))[1] for k in ("tensor", "view copy", "peek"))
    stats = {
        "allocated_bytes.current": tensors[1],
        "allocated_buffers.current": tensors[0],
        "device_bytes.current": dev,
        "device_bytes.peak": max(_peaks.get(index, 0), tensors[1]),
        "view_copy_bytes.current": by_kind.get("view copy", (0, 0))[1],
        "peek_bytes.current": by_kind.get("peek", (0, 0))[1],
        # inputs pending work still needs, lifted scalars, RNG keys
        "other_bytes.current": max(0, dev - counted),
        "pending_bytes": by_kind.get("pending", (0, 0))[1],
        "pending_tensors": by_kind.get("pending", (0, 0))[0],
        "limit_bytes": config.memory_limit,
        "syncs_sampled": len(_timeline),
    }
    platform = platform_stats(index)
    if platform:
        for k, v in platform.items():
            stats[f"platform.{k}"] = v
    return stats


def memory_summary(device=None) -> str:
    """``memory_stats`` as a readable table, with the five lines holding the most."""
    __debuggerskip__ = True  # IPython's debugger steps over xlanb frames
    index = device_index(device)
    hs = [h for h in holdings() if h.device == index]  # one walk for both
    s = _stats(hs, index)
    dev = jax_device(index)
    rows = [
        ("live tensors (memory_allocated)", format_bytes(s["allocated_bytes.current"]),
         f"{s['allocated_buffers.current']} buffers"),
        ("all device buffers xlanb holds", format_bytes(s["device_bytes.current"]),
         f"peak {format_bytes(s['device_bytes.peak'])} (sampled)"),
        ("  eager views' copies", format_bytes(s["view_copy_bytes.current"]), ""),
        ("  kept for peeks", format_bytes(s["peek_bytes.current"]), "until the next sync"),
        ("  other", format_bytes(s["other_bytes.current"]),
         "inputs pending work needs, scalars, RNG keys"),
        ("pending (not computed yet)", format_bytes(s["pending_bytes"]),
         f"{s['pending_tensors']} tensors"),
        ("limit (xlanb.memory_limit)",
         format_bytes(s["limit_bytes"]) if s["limit_bytes"] else "none", ""),
    ]
    for key, label in (("platform.bytes_in_use", "platform: in use"),
                       ("platform.peak_bytes_in_use", "platform: peak"),
                       ("platform.bytes_limit", "platform: capacity")):
        if key in s:
            rows.append((label, format_bytes(int(s[key])), "the XLA allocator's own"))
    out = [f"xla:{index} ({dev.platform} {dev.id})",
           format_table(("", "bytes", ""), rows, right=(1,))]
    if not any(k.startswith("platform.") for k in s):
        out.append(f"(XLA:{dev.platform.upper()} reports no allocator figures: "
                   "xlanb's own count of live buffers is the figure)")
    top = _by_line(hs, index)[:5]
    if top:
        out.append("largest by line:")
        out.append(MemoryByLine._table(top))
    return "\n".join(out)


# ---------------------------------------------------------------------------------------
# The limit: checked before a graph or an eager op runs

class Contributor(NamedTuple):
    """One of the largest parts of a projected peak."""
    kind: str      # "live tensors", "graph temp", "op result"
    what: str      # "3 tensors from train.py:12 [encoder]", "aten::bmm at model.py:42 f32[..]"
    bytes: int


class DeviceMemoryError(torch.OutOfMemoryError):
    """A graph (or op) would not fit under ``xlanb.memory_limit``, or XLA ran out of device
    memory. Nothing ran: every pending tensor is still pending and readable; raise the
    limit or free tensors, then sync again."""

    def __init__(self, message: str, *, device: int, limit: int | None, projected: int | None,
                 live: int, contributors: list):
        super().__init__(message)
        self.device = device
        self.limit = limit
        self.projected = projected
        self.live = live
        self.contributors = contributors

    def __reduce__(self):  # picklable (a launched process may send it on)
        return (_rebuild_error, (str(self), self.device, self.limit, self.projected, self.live,
                                 list(self.contributors)))


def _rebuild_error(message, device, limit, projected, live, contributors):
    return DeviceMemoryError(message, device=device, limit=limit, projected=projected,
                             live=live, contributors=contributors)


class MemoryLimit:
    """``xlanb.memory_limit("16GiB")``: set at once; as a context manager, the previous
    limit comes back at the end of the block."""

    def __init__(self, limit):
        self.previous = (config.memory_limit, config.memory_limit_target)
        config.memory_limit_target = False
        if limit == "target":  # the target's HBM, checked by executables/target.py
            if session.target is None:
                raise ValueError("xlanb.memory_limit('target') needs a target: "
                                 "xlanb.set_target('v5e:1x1') (or xlanb.target(...)) first")
            self.bytes = None
            config.memory_limit_target = True
        elif limit is None:
            self.bytes = None
        elif isinstance(limit, int) and not isinstance(limit, bool):
            if limit <= 0:
                raise ValueError(f"xlanb.memory_limit: not a positive size in bytes: {limit!r}")
            self.bytes = limit
        elif isinstance(limit, str):
            self.bytes = parse_bytes(limit)
        else:
            raise TypeError(f"xlanb.memory_limit takes bytes (int), a size such as '16GiB', "
                            f"or None; got {type(limit).__name__}")
        config.memory_limit = self.bytes

    def __enter__(self) -> "MemoryLimit":
        return self

    def __exit__(self, *exc) -> None:
        config.memory_limit, config.memory_limit_target = self.previous

    def __repr__(self) -> str:
        if config.memory_limit_target and self.bytes is None:
            return "xlanb.memory_limit('target')"
        return f"xlanb.memory_limit({format_bytes(self.bytes) if self.bytes else None!r})"


def memory_limit(limit) -> MemoryLimit:
    """Check every graph (and eager op) before it runs: the live device buffers plus what
    running it adds (its temporaries and outputs, less what it writes into donated
    buffers) must stay under ``limit`` (bytes, ``"16GiB"``, or None for no check),
    else ``DeviceMemoryError`` names the largest contributors. Also ``XLANB_MEMORY_LIMIT``.
    ``"target"``: every graph must fit one chip of the target set by ``xlanb.target``, as
    the TPU compiler says, before it runs here (lazy graphs; the run waits for that
    compile)."""
    return MemoryLimit(limit)


def _live_contributors(index: int) -> list[Contributor]:
    out = []
    for r in memory_by_line(index)[:5]:
        where = r.source + (f" [{r.scope}]" if r.scope else "")
        out.append(Contributor("live tensors", f"{r.count} tensor{'s' * (r.count != 1)} from {where}",
                               r.bytes))
    return out


_XLANB_DIR = PACKAGE_DIR + os.sep


class GraphBuffer(NamedTuple):
    """One of the largest buffers a compiled graph allocates while it runs, with where its
    op was recorded (``CompiledGraph.largest_buffers``)."""
    name: str                 # the HLO instruction
    opcode: str               # fusion, dot, custom-call, ...
    shape: str                # its result type
    bytes: int
    op: str                   # the aten op it came from, "" if unknown
    scope: str                # module scope path, "/"-separated
    loc: SourceLoc | None     # the user's line, where known


def graph_buffers(executable, summary, n: int = 10) -> list[GraphBuffer]:
    """The ``n`` largest buffers of ``executable``'s entry computation, each with its
    user's line: the HLO's own, unless that is missing or inside xlanb or JAX (an op
    recorded without a line, such as a backward op, or a fusion named after one); then
    the line of the recorded op with the same aten op and scope, when just one has one."""
    out = []
    for b in entry_buffers(executable.as_text())[:n]:
        loc = None
        file, _, line = b.source.rpartition(":")
        if file and line.isdigit() and not file.startswith(_XLANB_DIR) \
                and f"{os.sep}jax{os.sep}" not in file:
            loc = SourceLoc(file, int(line), "")
        elif summary is not None:
            locs = {o.src for o in summary.ops
                    if o.name == b.op and o.scope.replace(".", "/") == b.scope}
            if len(locs) == 1:
                loc = next(iter(locs))
        out.append(GraphBuffer(b.name, b.opcode, b.shape, b.bytes, b.op, b.scope, loc))
    return out


def _shape_text(shape: str) -> str:
    parts = shape.split(", ")
    return shape if len(parts) <= 2 else f"{parts[0]}, ... ({len(parts)} results)"


def _graph_contributors(rec, n: int = 5) -> list[Contributor]:
    try:
        buffers = graph_buffers(rec.executable, rec.summary, n)
    except Exception:  # an executable that prints no HLO
        return []
    out = []
    for b in buffers:
        src = format_loc(b.loc).strip()
        where = f"{b.op or b.opcode}" + (f" at {src}" if src else "") \
            + (f" [{b.scope}]" if b.scope else "")
        out.append(Contributor("graph temp", f"{where} {_shape_text(b.shape)}", b.bytes))
    return out


def _output_contributors(rec) -> list[Contributor]:
    """The graph's outputs that an op in it makes (outputs that are inputs passed through
    take no new memory), each with its op and line: the pending tensors the sync makes."""
    summary = getattr(rec, "summary", None)
    if summary is None:
        return []
    n_in, out = len(summary.inputs), []
    for pos in dict.fromkeys(summary.outputs):
        if pos < n_in or pos - n_in >= len(summary.ops):
            continue
        op = summary.ops[pos - n_in]
        nbytes = sum(b for b, _ in array_sizes(op.aval))
        if nbytes:
            src = format_loc(op.src).strip() if op.src is not None else ""
            where = op.name + (f" at {src}" if src else "") + (f" [{op.scope}]" if op.scope else "")
            out.append(Contributor("pending output", f"{where} {_shape_text(op.aval)}", nbytes))
    return out


def _message(head: str, index: int, limit, projected, live, extra_text, contributors) -> str:
    lines = [head]
    if limit is not None and projected is not None:
        lines.append(f"  limit {format_bytes(limit)}; projected peak {format_bytes(projected)} = "
                     f"{format_bytes(live)} live on xla:{index} + {extra_text}")
    if contributors:
        lines.append("  largest contributors:")
        for c in contributors:
            lines.append(f"    {format_bytes(c.bytes):>10}  {c.kind}: {c.what}")
    lines.append("  Nothing ran: every tensor keeps its value and its pending work. Raise the "
                 "limit (xlanb.memory_limit) or free tensors, then sync again; "
                 "xlanb.memory_by_line() lists what is live.")
    return "\n".join(lines)


class MemoryForecast(NamedTuple):
    """``xlanb.pending_memory()``: what running the pending graph would need, before it
    runs: the device bytes live now plus what the graph adds (``GraphMemory.extra_bytes``)."""
    graph: object          # the CompiledGraph the next sync will run
    live: int              # device bytes live now (its arguments among them)
    projected: int         # live + what running it adds
    limit: int | None      # xlanb.memory_limit, if one is set

    @property
    def fits(self) -> bool | None:
        """Whether ``projected`` stays under the limit (None with no limit)."""
        return None if self.limit is None else self.projected <= self.limit

    def fits_in(self, limit) -> bool:
        """Whether it stays under ``limit`` (bytes or ``"16GiB"``)."""
        return self.projected <= (parse_bytes(limit) if isinstance(limit, str) else limit)

    def __str__(self) -> str:
        mem = self.graph.memory
        verdict = "" if self.limit is None else (
            f"; fits under the limit of {format_bytes(self.limit)}" if self.fits
            else f"; does NOT fit under the limit of {format_bytes(self.limit)}")
        return (f"projected peak {format_bytes(self.projected)} = {format_bytes(self.live)} live + "
                f"{format_bytes(mem.extra_bytes)} to run graph {format_hash(self.graph.hash)} ({mem}){verdict}")

    __repr__ = __str__


def forecast(rec, index: int, mem=None, live: int | None = None) -> MemoryForecast | None:
    """The projected peak of running ``rec`` (a CompiledGraph) on xla:``index`` now.
    ``mem``: its ``GraphMemory``, where the caller has it (else read from ``rec``);
    ``live``: the device's live bytes, where the caller knows them (else walked)."""
    if mem is None:
        mem = rec.memory
    if mem is None:
        return None
    if live is None:
        live = device_bytes().get(index, 0)
    return MemoryForecast(rec, live, live + mem.extra_bytes, config.memory_limit)


def check_graph(rec, index: int, what: str, mem=None, live: int | None = None) -> None:
    """Before ``rec`` (a CompiledGraph) runs on xla:``index``: raise DeviceMemoryError if
    the live buffers (``live``, as ``forecast`` takes it) plus what it adds (``mem``, its
    ``GraphMemory``, likewise) would pass the limit. Notes the projected peak."""
    if mem is None:
        mem = rec.memory
    f = forecast(rec, index, mem, live)
    if f is None:
        return
    live, projected = f.live, f.projected
    _note_peak(index, projected)
    limit = config.memory_limit
    if limit is None or projected <= limit:
        return
    # what makes the peak, by line: the live tensors, the outputs the graph makes (the
    # pending tensors it realizes) and its largest temporaries
    contributors = sorted(_live_contributors(index) + _output_contributors(rec)
                          + _graph_contributors(rec), key=lambda c: -c.bytes)[:5]
    extra = (f"{format_bytes(mem.extra_bytes)} to run the graph (outputs "
             f"{format_bytes(mem.output_bytes)}, temps {format_bytes(mem.temp_bytes)}, less "
             f"{format_bytes(mem.alias_bytes)} donated)")
    raise DeviceMemoryError(
        _message(f"xlanb: {what} would not fit in device memory on xla:{index}", index, limit,
                 projected, live, extra, contributors),
        device=index, limit=limit, projected=projected, live=live, contributors=contributors)


def check_op(info, loc=None) -> None:
    """Before ``info``'s single-op executable runs (eager, opbyop), with a limit set."""
    mem = op_memory(info)
    if mem is None:
        return
    index = info.device
    live = device_bytes().get(index, 0)
    projected = live + mem.extra_bytes
    _note_peak(index, projected)
    limit = config.memory_limit
    if limit is None or projected <= limit:
        return
    at = f" at {format_loc(loc)}" if loc is not None else ""
    contributors = sorted(_live_contributors(index)
                          + [Contributor("op result", f"{info.name}{at}", info.nbytes)],
                          key=lambda c: -c.bytes)[:5]
    extra = f"{format_bytes(mem.extra_bytes)} to run {info.name} (its result and temporaries)"
    raise DeviceMemoryError(
        _message(f"xlanb: {info.name}{at} would not fit in device memory on xla:{index}", index,
                 limit, projected, live, extra, contributors),
        device=index, limit=limit, projected=projected, live=live, contributors=contributors)


def is_device_oom(e: BaseException) -> bool:
    """Whether ``e`` is XLA running out of device memory."""
    return (not isinstance(e, DeviceMemoryError) and "RESOURCE_EXHAUSTED" in str(e)
            and ("memory" in str(e).lower() or "allocat" in str(e).lower()))


def device_oom(e: BaseException, index: int, what: str, graph=None) -> DeviceMemoryError:
    """XLA's own out-of-memory error ``e`` as a DeviceMemoryError, with the largest live
    tensors by line and, for a graph, its largest temporaries by op and line."""
    live = device_bytes().get(index, 0)
    contributors = _live_contributors(index)
    if graph is not None:
        contributors += _graph_contributors(graph)
    contributors = sorted(contributors, key=lambda c: -c.bytes)[:5]
    platform = platform_stats(index) or {}
    limit = platform.get("bytes_limit")
    first = str(e).strip().split("\n")[0]
    msg = _message(f"xlanb: XLA ran out of device memory on xla:{index} running {what}: {first}",
                   index, None, None, live, "", contributors)
    return DeviceMemoryError(msg, device=index, limit=limit, projected=None, live=live,
                             contributors=contributors)


def set_memory_line_bytes(n: int) -> None:
    """Eager results of at least ``n`` bytes remember their line (``config.memory_line_bytes``,
    ``XLANB_MEMORY_LINE_BYTES``); every op signature already made is updated."""
    if n < 0:
        raise ValueError("xlanb.set_memory_line_bytes: a byte count >= 0")
    config.memory_line_bytes = n
    for table in (infos, getitem_infos, scatter_infos):
        for info in table.values():
            info.lines = info.nbytes >= n
