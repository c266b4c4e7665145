"""Every cache and record a reset forgets, each defined beside the code that fills it.

A module makes its container here once, at import: ``_infos = cache({}, "op signature ->
OpSignature", compiled=True)``. ``xlanb.reset()`` empties them all in place (``clear_all``): the
containers themselves are never replaced, because modules and the per-op hot path hold
them as module globals. ``compiled=True`` marks what holds lowered or compiled code, which
a setting that changes the lowering (the mat-mul precision) must forget (``clear_compiled``).

JAX's ``util.register_cache``/``clear_all_caches`` is the model.
"""
from __future__ import annotations

from typing import NamedTuple, TypeVar

C = TypeVar("C")


class Cache(NamedTuple):
    what: str          # what it maps, for ``registered()``
    container: object  # anything with ``clear()`` and ``len()``
    compiled: bool     # holds lowered or compiled code
    group: str | None  # what else is forgotten with it (``clear_group``)


_caches: list[Cache] = []


def cache(container: C, what: str, *, compiled: bool = False, group: str | None = None) -> C:
    """Register ``container`` (a dict, list, set, weak dict or anything with ``clear``)
    for reset and return it. ``group`` names the caches forgotten together without a
    reset (``clear_group``)."""
    _caches.append(Cache(what, container, compiled, group))
    return container


def clear_all() -> None:
    """Empty every registered cache in place (``xlanb.reset()``)."""
    for c in _caches:
        c.container.clear()


def clear_compiled() -> None:
    """Empty what holds lowered or compiled code: what a lowering setting invalidates."""
    for c in _caches:
        if c.compiled:
            c.container.clear()


def clear_group(group: str) -> None:
    """Empty the caches registered with ``group``, and no other."""
    for c in _caches:
        if c.group == group:
            c.container.clear()


def registered() -> list[tuple[str, int]]:
    """(what, entries) of every registered cache, in registration order."""
    return [(c.what, len(c.container)) for c in _caches]
