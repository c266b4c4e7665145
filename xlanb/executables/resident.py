"""The executables this process keeps loaded: a bounded set, and the headroom check made
before compiling or loading another (issue 26; the cause is in runtime/maps.py).

Single-op executables are many (a long eager session or PyTorch's OpInfo tests make
thousands) and cheap to get back: the executable store reloads one in well under a
millisecond. So at most ``cap()`` of them stay loaded; past that the least recently used
are dropped, and an op that needs one again reloads it from the store (or compiles it).
Recency is kept off the eager hot path, which calls ``info.call`` and touches nothing
else: eviction works as a clock. An info whose fast call is set has run since the last
pass, so the pass only clears that call (a second chance); the next use goes through
``op_executable``, which marks it used again. An info still without a call at the next
pass is dropped.
"""
from __future__ import annotations

import gc
import threading
from collections import OrderedDict

from ..base import metrics
from ..base.caches import cache
from ..base.config import config
from ..runtime import maps

# OpSignature uid -> OpSignature with an executable loaded or compiling, least recently used first
resident = cache(OrderedDict(), "OpSignature uid -> OpSignature holding a single-op executable", compiled=True)
# id -> CompiledGraph with its executable loaded, least recently used first
resident_graphs = cache(OrderedDict(), "id -> CompiledGraph whose executable is loaded",
                        compiled=True, group="graphs")

# Measured 3.2 mappings per XLA:CPU single-op executable; a graph's can take more.
_MAPS_PER_EXECUTABLE = 4
_DEFAULT_CAP = 4096
# Above this share of vm.max_map_count, drop loaded single-op executables before compiling
# another: as many as bring the count back to the second share (not more: a dropped one
# costs a reload); above the third, and only then, drop graph executables and collect
# cycles, and refuse with ExecutableLimitError if that leaves too little room.
_SHRINK_AT, _SHRINK_TO, _REFUSE_AT = 0.75, 0.7, 0.9
# user threads may run ops at once: the table is changed under this lock
_lock = threading.RLock()


class ExecutableLimitError(MemoryError):
    """The process is close to the kernel's limit on memory mappings, which XLA needs for
    every executable's code, and dropping cached single-op executables did not make room.
    Compiling another would crash the process inside XLA; nothing was compiled and every
    tensor keeps its value and pending work."""


def cap() -> int:
    """How many single-op executables stay loaded: ``config.max_executables``
    (``XLANB_MAX_EXECUTABLES``), else 4,096, or an eighth of a lower
    ``vm.max_map_count``. Each costs ~3.2 mappings and ~0.2 MiB of memory (measured on
    XLA:CPU), so 4,096 hold ~13,000 of the default 65,530 mappings and ~0.8 GiB."""
    if config.max_executables:
        return config.max_executables
    lim = maps.limit()
    return max(256, min(_DEFAULT_CAP, lim // 8)) if lim else _DEFAULT_CAP


def admit(info) -> None:
    """``info`` holds (or is compiling) an executable: count it in, dropping the least
    recently used beyond the cap (down to 90% of it, so passes are rare)."""
    with _lock:
        resident[info.uid] = info
        resident.move_to_end(info.uid)
        n = cap()
        if len(resident) > n:
            shrink(n * 9 // 10)


def touch(info) -> None:
    """``info``'s executable was asked for: it is recently used."""
    with _lock:
        try:
            resident.move_to_end(info.uid)
        except KeyError:  # dropped meanwhile, or loaded before a reset
            pass


def shrink(target: int) -> int:
    """Drop executables until at most ``target`` stay loaded (the clock above); returns
    how many were dropped. One still compiling is kept; so is one that ran since the
    last pass, if the pass can reach ``target`` without it."""
    with _lock:
        dropped = _shrink(target)
    if dropped:
        metrics.counter("OpExecutableEvicted", dropped)
    return dropped


def _shrink(target: int) -> int:
    dropped = 0
    for _ in range(2 * len(resident)):  # each info is passed at most twice
        if len(resident) <= target:
            break
        uid, info = next(iter(resident.items()))
        fut = info.compiling
        if fut is not None and not fut.done():
            resident.move_to_end(uid)
            continue
        if info.call is not None:  # ran through the fast path since the last pass
            info.call = None
            resident.move_to_end(uid)
            continue
        del resident[uid]
        # every reference xlanb holds: the executable is freed with its code mappings
        info.exe = info.compiling = info.sharded = info.tiering = None
        dropped += 1
    return dropped


# ---------------------------------------------------------------------------------------
# Graph executables: fewer, but each larger (its code, and the lowered module kept for
# its HLO). A long session that syncs many distinct graphs (PyTorch's tests with a sync
# after every op make thousands) keeps the last ``config.max_graphs`` used; the record
# of a dropped one stays in xlanb.graphs(), and its executable comes back when needed.

def admit_graph(rec) -> None:
    """``rec``'s executable was loaded or used: it is the most recently used graph."""
    with _lock:
        resident_graphs[id(rec)] = rec
        resident_graphs.move_to_end(id(rec))
        if len(resident_graphs) > max(1, config.max_graphs):
            shrink_graphs(max(1, config.max_graphs * 9 // 10))


def shrink_graphs(target: int) -> int:
    """Drop graph executables, least recently used first, until at most ``target`` stay
    loaded; returns how many were dropped."""
    dropped = 0
    with _lock:
        while len(resident_graphs) > target:
            _, rec = resident_graphs.popitem(last=False)
            rec.drop_executable()
            dropped += 1
    if dropped:
        metrics.counter("GraphExecutableEvicted", dropped)
    return dropped


class _Check:
    calls = 0       # reserve() calls so far
    next_at = 0     # the call that reads the mapping count again


def reserve() -> None:
    """Called before compiling or loading an executable. Reads the process's mapping
    count now and then (more often as it nears the limit): near the limit it drops the
    least recently used single-op executables, as many as the excess is worth; close to
    the limit, half of them and of the graphs; if that leaves too little room, it raises
    ``ExecutableLimitError`` rather than let XLA crash the process."""
    _Check.calls += 1
    if _Check.calls < _Check.next_at:
        return
    lim = maps.limit()
    if lim is None:
        _Check.next_at = 1 << 62
        return
    used = maps.count()
    mark = _SHRINK_AT
    if used > lim * _SHRINK_AT:
        # proportionate (issue 37): drop what the excess over _SHRINK_TO is worth in
        # executables, at most an eighth of them a pass, not half; and no full
        # gc.collect() (a second on a big heap) before the last resort below
        excess = used - int(lim * _SHRINK_TO)
        n = min(-(-excess // _MAPS_PER_EXECUTABLE), max(1, len(resident) // 8))
        shrink(len(resident) - n)
        used = maps.count()
        if used > lim * _REFUSE_AT:  # the last resort, before refusing
            shrink(len(resident) // 2)
            shrink_graphs(len(resident_graphs) // 2)
            gc.collect()  # executables held only by reference cycles
            used = maps.count()
        if used > lim * _SHRINK_AT:
            # the mappings are not (only) executables': dropping more would not help;
            # read the count again as the room left before the refusal is used up
            mark = _REFUSE_AT
        if used > lim * _REFUSE_AT:
            _Check.next_at = _Check.calls + 1
            raise ExecutableLimitError(
                f"xlanb: this process holds {used:,} memory mappings of the kernel's limit of "
                f"{lim:,} (vm.max_map_count), and XLA needs more for every executable it "
                f"compiles: compiling another would crash the process. {len(resident):,} "
                f"single-op and {len(resident_graphs):,} graph executables are loaded. "
                "Nothing was lost. xlanb.reset() drops them all (pending work is synced "
                "first); a lower XLANB_MAX_EXECUTABLES keeps fewer loaded; or raise the "
                "limit: sysctl -w vm.max_map_count=262144")
    # sample again before the room left could be used up, at most every 256 calls
    room = (lim * mark - used) / _MAPS_PER_EXECUTABLE
    _Check.next_at = _Check.calls + max(1, min(256, int(room // 2)))


def recheck() -> None:
    """Read the mapping count at the next ``reserve`` (after the limit may have moved)."""
    _Check.next_at = _Check.calls
