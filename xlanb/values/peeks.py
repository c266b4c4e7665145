"""The values peeks computed, kept until the next sync (pending/live.py, pending/realize.py) and counted
as device memory (memory.py): a bounded cache, least recently used first out."""
from __future__ import annotations

from collections import OrderedDict

from ..base.caches import cache
from ..base.config import config


class PeekCache:
    """Values peeks computed, by node id, kept until the next sync so that repeated peeks
    recompute nothing, up to ``config.peek_cache_bytes``: past that, the least recently
    used go first (a later peek recomputes them from what is left; a peek never cuts the
    graph either way). Each entry holds its node, so its id stays a valid key."""

    def __init__(self) -> None:
        self._entries: OrderedDict = OrderedDict()  # node id -> (node, array)
        self.nbytes = 0

    def __contains__(self, nid: int) -> bool:
        return nid in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def __getitem__(self, nid: int):
        return self._entries[nid][1]

    def get(self, nid: int):
        entry = self._entries.get(nid)
        if entry is None:
            return None
        self._entries.move_to_end(nid)
        return entry[1]

    def put(self, node, value) -> None:
        size = _nbytes(value)
        limit = config.peek_cache_bytes
        if size > limit or id(node) in self._entries:
            return
        self._entries[id(node)] = (node, value)
        self.nbytes += size
        while self.nbytes > limit:
            _, (_, old) = self._entries.popitem(last=False)
            self.nbytes -= _nbytes(old)

    def clear(self) -> None:
        self._entries.clear()
        self.nbytes = 0


def _nbytes(value) -> int:
    if isinstance(value, (tuple, list)):
        return sum(_nbytes(v) for v in value)
    return int(getattr(value, "nbytes", 0))


peek_values = cache(PeekCache(), "node id -> array computed by a peek")
