"""Graphs whose shapes change, cut into segments: only the segments whose shapes changed
compile again (issue 56).

A graph that misses the cache and has the *skeleton* of an earlier one (the same ops,
by name, wired the same way, only shapes and static arguments differing) is a graph
whose shapes change: the KV cache of ``generate`` one longer at every token, a batch
padded to its longest sequence, the last partial batch. Compiled whole, every step
compiles everything again, though most of a decode step (projections, norms, MLP) never
changes shape. So such a graph is cut where its steps' signatures have differed between
sightings (``varying``, the union over every sighting since, so the cuts converge), into
segments that each compile and are cached as graphs of their own: from the third
sighting on, only the segments whose shapes changed compile, and a segment repeated
inside one graph (each layer's attention at the same length) compiles once.

A graph whose shapes never change never gets here (it hits the cache) and stays one
graph, so a training step keeps its one fused executable. This module only plans; the
segments run in ``execute/graphs.py``.
"""
from __future__ import annotations

from typing import NamedTuple

from ..base.caches import cache
from ..ir.nodes import GETITEM, GraphPlan, _leaf_key

# An unchanged stretch shorter than this joins the changed segments around it: a segment
# costs a compile's fixed part and a run of its own, which a few ops do not repay.
MIN_KEPT_OPS = 1


class Sighting(NamedTuple):
    """What was seen of one skeleton: the latest sighting's signature per step, and the
    steps whose signature has changed between any two sightings."""
    uids: tuple
    varying: frozenset


_sightings: dict = cache({}, "(device, skeleton) -> Sighting of graphs whose shapes change",
                         group="graphs")


def skeleton(plan: GraphPlan) -> tuple:
    """``plan`` without its shapes: each step's op name and wiring, the leaves' count,
    the roots' positions."""
    return (len(plan.leaves), tuple((info.name, ins) for info, ins in plan.steps),
            plan.root_pos)


def varying_steps(plan: GraphPlan, device: int) -> frozenset:
    """Note a sighting of ``plan`` (a graph that missed the cache); the steps whose
    signatures changed across its skeleton's sightings (empty: never changed)."""
    key = (device, skeleton(plan))
    uids = tuple(info.uid for info, _ in plan.steps)
    seen = _sightings.get(key)
    if seen is None:
        _sightings[key] = Sighting(uids, frozenset())
        return frozenset()
    varying = seen.varying | {i for i, (a, b) in enumerate(zip(uids, seen.uids)) if a != b}
    _sightings[key] = Sighting(uids, frozenset(varying))
    return frozenset(varying)


def cut(plan: GraphPlan, varying: frozenset) -> list[list[int]]:
    """The segments of ``plan`` (lists of step indices, in an order that runs): stretches
    of steps alternately changed and unchanged, short unchanged stretches joined to
    their changed neighbours; a getitem goes with the step it picks from (a
    multi-output value never crosses segments). One segment: nothing to cut."""
    n = len(plan.steps)
    changed = [i in varying for i in range(n)]
    i = 0
    while i < n:  # unchanged stretches too short to keep become changed
        j = i
        while j < n and changed[j] == changed[i]:
            j += 1
        if not changed[i] and j - i < MIN_KEPT_OPS and (i > 0 or j < n):
            changed[i:j] = [True] * (j - i)
        i = j
    seg_of = []
    for k in range(n):
        seg_of.append(0 if k == 0 else seg_of[-1] + (changed[k] != changed[k - 1]))
    n_leaves = len(plan.leaves)
    for k, (info, ins) in enumerate(plan.steps):
        if info.name == GETITEM and ins[0] >= n_leaves:
            seg_of[k] = seg_of[ins[0] - n_leaves]
    segments: list[list[int]] = [[] for _ in range(max(seg_of, default=-1) + 1)]
    for k, s in enumerate(seg_of):
        segments[s].append(k)
    return [s for s in segments if s]


class Segment(NamedTuple):
    """One segment as a graph of its own: its plan, and where its leaves come from and
    its roots go in the whole graph's value list (leaves first, then steps)."""
    plan: GraphPlan
    inputs: tuple   # whole-graph positions of its leaves
    outputs: tuple  # whole-graph positions of its roots
    changed: bool   # it holds a step whose signature changed between sightings


def segment_plans(plan: GraphPlan, segments: list[list[int]], varying: frozenset
                  ) -> list[Segment]:
    """Each segment's own plan: its leaves are the whole graph's leaves and earlier
    segments' values it reads, its roots the values it makes that a later segment reads
    or the whole graph returns."""
    n_leaves = len(plan.leaves)
    seg_of_pos: dict[int, int] = {}
    for s, seg in enumerate(segments):
        for k in seg:
            seg_of_pos[n_leaves + k] = s
    needed_after: dict[int, int] = {}  # position -> the last segment that reads it
    for s, seg in enumerate(segments):
        for k in seg:
            for p in plan.steps[k][1]:
                needed_after[p] = max(needed_after.get(p, -1), s)
    roots = set(plan.root_pos)
    out = []
    for s, seg in enumerate(segments):
        local: dict[int, int] = {}
        inputs: list[int] = []
        for k in seg:
            for p in plan.steps[k][1]:
                if seg_of_pos.get(p) != s and p not in local:
                    local[p] = len(inputs)
                    inputs.append(p)
        n_in = len(inputs)
        steps, op_nodes, scalars = [], [], []
        for j, k in enumerate(seg):
            info, ins = plan.steps[k]
            local[n_leaves + k] = n_in + j
            steps.append((info, tuple(local[p] for p in ins)))
            node = plan.op_nodes[k]
            op_nodes.append(node)
            if node.scalars:
                scalars.extend(node.scalars)
        outputs = tuple(n_leaves + k for k in seg
                        if n_leaves + k in roots or needed_after.get(n_leaves + k, -1) > s)
        leaves = [plan.leaves[p] if p < n_leaves else plan.op_nodes[p - n_leaves]
                  for p in inputs]
        root_pos = tuple(local[p] for p in outputs)
        key = (tuple(_leaf_key(n) for n in leaves),
               *((info.uid, ins) for info, ins in steps), root_pos)
        out.append(Segment(GraphPlan(key, leaves, scalars, steps, op_nodes,
                                     [plan.op_nodes[p - n_leaves] for p in outputs], root_pos),
                           tuple(inputs), outputs, any(k in varying for k in seg)))
    return out
