"""Live pending work: the storages whose value may be pending (in write order), the views
eager mode waits on, and the values peeks computed. ``pending_roots`` is what a sync runs."""
from __future__ import annotations

import threading
import weakref

from ..base.session import mode_state, session
from ..base.caches import cache
from ..values.checks import without_nodes
from ..values.peeks import peek_values
from ..ir.nodes import Node

# Storages whose node may be pending, appended on every write. Read in last-write order,
# which is the program order of their pending nodes: graph structure (and so the cache
# key) depends on neither set iteration order nor when a tensor was created, so a first
# step that creates optimizer state cuts the same graph as the steps after it. Weak: a
# tensor nobody holds is never computed. A list of weakrefs, because tracking happens on
# every recorded op; duplicates and dead entries are dropped when it is read or compacted.
_live = cache([], "weakrefs of pending storages, in write order")
_compact_at = 4096  # compact() sets it: twice the pending storages it left
_trimming = threading.Lock()


def track(storage) -> None:
    _live.append(weakref.ref(storage))
    if len(_live) > _compact_at:
        compact()


def live_storages() -> list:
    """Live storages with pending nodes, each once, in last-write order. Drops what it
    read past (dead, computed, written again), so each read scans only the writes since
    the last: eager mode reads after every few ops, and a scan of the whole list (up to
    ``_compact_at`` entries) was the largest cost of its cached path."""
    with _trimming:
        n = len(_live)  # another thread may append while this reads: those stay
        seen = set()
        out, kept = [], []
        for ref in reversed(_live[:n]):
            s = ref()
            if s is not None and s.node.data is None and id(s) not in seen:
                seen.add(id(s))
                out.append(s)
                kept.append(ref)
        out.reverse()
        kept.reverse()
        _live[:n] = kept
    return out


def compact() -> None:
    global _compact_at
    _compact_at = max(4096, 2 * len(live_storages()))


# Eager mode: views whose cached value waits on a background compile (dispatch/dispatcher.py). A
# view's value is not its storage's node, so running the storages alone would leave it.
_waiting_views = cache([], "eager: weakrefs of views waiting on a compile")


def track_view(t) -> None:
    _waiting_views.append(weakref.ref(t))


def end_waiting() -> None:
    """Eager: nothing waits on a background compile any more (every pending node was
    run, whichever thread recorded it)."""
    session.default.deferred = 0
    mode_state().deferred = 0
    _waiting_views.clear()


def pending_roots() -> list[Node]:
    """The pending nodes of every live tensor, each once."""
    seen = set()
    roots = []
    for s in live_storages():
        node = s.node
        if id(node) not in seen:
            seen.add(id(node))
            roots.append(node)
    for ref in _waiting_views:
        t = ref()
        if t is not None and t._view and t._ver == t._storage.version:  # still a view
            node = t._node
            if node.data is None and id(node) not in seen:
                seen.add(id(node))
                roots.append(node)
    return roots


def clear_peeks() -> None:
    peek_values.clear()


# Eager: the pending nodes of a run that failed (a lowering error, say), by id. They stay
# pending, and a read of one of them (or of a tensor computed from one) runs it again; but
# a later read of anything else does not sweep them into its run. Otherwise one op that
# cannot lower (a complex32 conversion in a PyTorch test) failed every read after it for
# as long as its tensor lived (pytest keeps a failed test's frames: 56 of the unary
# float32 cut's failures).
_set_aside: dict = {}


def set_aside(nodes) -> None:
    """Keep the pending ``nodes`` out of other reads' runs (eager mode)."""
    for node in nodes:
        if node.data is None:
            key = id(node)
            _set_aside[key] = weakref.ref(node, lambda _, key=key: _set_aside.pop(key, None))


def swept_roots() -> list[Node]:
    """The pending roots a read in eager mode sweeps into its run: every pending root,
    less those set aside by a failed run and those computed from them."""
    roots = pending_roots()
    return without_nodes(roots, _set_aside) if _set_aside else roots
