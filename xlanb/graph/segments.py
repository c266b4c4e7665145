"""Graphs whose shapes change, cut into segments: only the segments whose shapes changed
compile again (issue 56).

A graph that misses the cache and has the *skeleton* of an earlier one (the same ops,
by name, wired the same way, only shapes and static arguments differing) is a graph
whose shapes change: the KV cache of ``generate`` one longer at every token, a batch
padded to its longest sequence, the last partial batch. Compiled whole, every step
compiles everything again, though most of a decode step (projections, norms, MLP) never
changes shape. So such a graph is cut where its steps' signatures have differed between
sightings (``varying``: what changed at the last one, which a decode step repeats), into
segments that each compile and are cached as graphs of their own, from the skeleton's
third shapes on (``CUT_AT``). From the fourth on, only the segments whose shapes
changed compile, and a segment repeated inside one graph (each layer's attention at the
same length) compiles once.

A graph whose shapes never change never gets here (it hits the cache) and stays one
graph, so a training step keeps its one fused executable. This module only plans; the
segments run in ``execute/graphs.py``.
"""
from __future__ import annotations

import os
from typing import NamedTuple

from ..base.caches import cache
from ..base.frames import format_loc
from ..ir.nodes import GETITEM, GraphPlan, TensorMeta, leaf_key

# An unchanged stretch shorter than this joins the changed segments around it: a
# segment costs a compile's fixed part and a run of its own, which a weight's transpose
# (a prefill's only unchanged ops, between changed ones) does not repay. Longer
# stretches are kept (a decode step's projections between its cache's cats).
MIN_KEPT_OPS = 2
# A graph whose unchanged steps are fewer than this share of it is not cut: a prefill
# at a new prompt length changes nearly every step, and its segments cost more compiles
# than the one graph.
MIN_KEPT_SHARE = 0.25


# sightings of a skeleton kept to name what grows (its last values)
HISTORY = 6
# A lazy graph is cut from its skeleton's third shapes on: shapes that changed once
# (another model size, one last partial batch) compile whole, fused, as before; shapes
# that keep changing (a token at a time) are cut. The second costs a whole compile more.
# An eager run is cut from its second: its graph compiles at the quick tier, unfused
# where it is small, so a cut costs it little, and the skeleton of a decode step's run
# is new at each call (its run begins at the first op with no executable of its own,
# which moves as ops get theirs): at 3, each generate call compiled two whole decode
# steps (1.1 and 2.3 s on a loaded machine) before its steps were cut.
CUT_AT = 3
CUT_RUN_AT = 2


class Sighting(NamedTuple):
    """What was seen of one skeleton: the latest sightings' signatures per step (oldest
    first, at most ``HISTORY``), and the steps whose signature changed at the last
    sighting."""
    infos: tuple  # per sighting, the OpSignature of each step
    varying: frozenset

    @property
    def uids(self) -> tuple:
        return tuple(info.uid for info in self.infos[-1])


_sightings: dict = cache({}, "(device, skeleton) -> Sighting of graphs whose shapes change",
                         group="graphs")


def skeleton(plan: GraphPlan) -> tuple:
    """``plan`` without its shapes: each step's op name and wiring, the leaves' count,
    the roots' positions."""
    return (len(plan.leaves), tuple((info.name, ins) for info, ins in plan.steps),
            plan.root_pos)


def varying_steps(plan: GraphPlan, device: int, cut_at: int = CUT_AT,
                  run: bool = False) -> frozenset:
    """Note a sighting of ``plan`` (a graph that missed the cache); the steps whose
    signatures changed since its skeleton's last sighting, once it has been seen at
    ``cut_at`` sets of shapes (empty: nothing to cut). ``run``: an eager run, whose
    skeleton can be new though its ops are not (``varying_ops``)."""
    key = (device, skeleton(plan))
    infos = tuple(info for info, _ in plan.steps)
    by_op = varying_ops(plan, device) if run else frozenset()
    seen = _sightings.get(key)
    if seen is None:
        _sightings[key] = Sighting((infos,), by_op)  # (cut by its ops' sightings, or not)
        return by_op
    last = seen.infos[-1]
    if all(a is b for a, b in zip(infos, last)):  # the same graph again (it was cut)
        # (a first sighting's steps are its ops' own: ``varying_ops``)
        return seen.varying if len(seen.infos) >= cut_at or len(seen.infos) == 1 \
            else frozenset()
    # what changed since the last sighting, not since the first: shapes that changed once
    # (the same loop over a wider model, earlier in the session) would otherwise mark
    # every step changed for good, and nothing would be cut again
    varying = {i for i, (a, b) in enumerate(zip(infos, last)) if a is not b}
    # An eager run's skeleton can come back after others (an earlier op opened its runs
    # from some token on): against its last sighting, at the same length, only a flag's
    # fill had changed, and a decode step compiled whole (238 ops). So the steps that
    # changed at its last comparison and are at a signature not seen twice (its ops'
    # own sightings) count as changed too: it is cut as before, into segments the cache
    # has. (Not all of ``by_op``: early on, every op is new, and the second decode step
    # compiled whole.)
    if len(seen.infos) >= 2:
        varying |= by_op & seen.varying
    seen = _sightings[key] = Sighting((seen.infos + (infos,))[-HISTORY:], frozenset(varying))
    return seen.varying if len(seen.infos) >= cut_at else frozenset()


# An eager run begins at the first op with no executable of its own, and ops get theirs
# as they tier up, so the same decode step's run has another skeleton at the next
# generate call (two slices of the input ids ran alone before it): a new skeleton, at
# shapes partly seen, compiled whole once more (0.9 s of a 3.7 s call, loaded). So an
# eager run's ops are also noted one by one, by where they were made (op, line, module
# scope, and which occurrence of those in the run), with how often each of their latest
# signatures came. An op at a signature that came before at least twice is unchanged (a
# decode step's projections, every token); any other is changed (the attention over a
# cache at a length one earlier token had, a prefill's ops at a new prompt length). A
# run whose skeleton is new is cut where its ops changed, when one of those ops has
# had other signatures before (it keeps changing) and enough of the run is unchanged
# (``cut``'s MIN_KEPT_SHARE: a prefill at a new length compiles whole).
_op_sightings: dict = cache({}, "(device, op, line, scope, occurrence) -> {uid of each "
                            "latest OpSignature: times seen}", group="graphs")
OP_SHAPES_KEPT = 8
# A run noted twice has every op at a signature seen twice: nothing changed, and noting
# it again changes no answer (a cached generate call repeats a decode step's segmented
# runs each token: 2 of its 8 ms of planning).
_ops_noted: dict = cache({}, "(device, graph key) -> times varying_ops noted that run",
                         group="graphs")


def varying_ops(plan: GraphPlan, device: int) -> frozenset:
    """Note each step of ``plan`` (an eager run that missed the cache) by where it was
    made; the steps at a signature their op has not had twice lately (new ops
    included), if one of them has had other signatures (else empty: a new run compiles
    whole)."""
    noted = _ops_noted.get((device, plan.key), 0)
    if noted >= 2:
        return frozenset()
    _ops_noted[(device, plan.key)] = noted + 1
    changed, grows = set(), False
    count: dict = {}
    for k, ((info, _), node) in enumerate(zip(plan.steps, plan.op_nodes)):
        where = (info.name, node.src, node.scope)
        nth = count[where] = count.get(where, -1) + 1
        key = (device, where, nth)
        seen = _op_sightings.get(key)
        if seen is None:
            seen = _op_sightings[key] = {}
        times = seen.pop(info.uid, 0)
        if times < 2:
            changed.add(k)
            grows = grows or len(seen) >= 1
        seen[info.uid] = times + 1  # (last: the latest)
        if len(seen) > OP_SHAPES_KEPT:
            del seen[next(iter(seen))]
    return frozenset(changed) if grows else frozenset()


def sighting(plan: GraphPlan, device: int) -> Sighting | None:
    return _sightings.get((device, skeleton(plan)))


class Growth(NamedTuple):
    """One dimension of one step's result that changed between sightings."""
    step: int
    op: str
    src: object      # the SourceLoc of the op that made the tensor
    dim: int
    values: tuple    # its size in each sighting kept, oldest first

    @property
    def delta(self) -> int | None:
        """The size it grows by at each sighting, if it grows steadily."""
        steps = {b - a for a, b in zip(self.values, self.values[1:])}
        return steps.pop() if len(steps) == 1 and len(self.values) >= 3 else None


def growths(plan: GraphPlan, seen: Sighting, limit: int = 2) -> list[Growth]:
    """The dimensions that changed across ``seen``'s sightings, at most one per source
    line and ``limit`` in all, first made first: what to name in a recompile's
    explanation. A dimension is named where it is made (its result's size changed),
    not where it is only passed on."""
    found: list[Growth] = []
    lines = set()
    for k in sorted(seen.varying):
        metas = [infos[k].out for infos in seen.infos if k < len(infos)]
        if not metas or not isinstance(metas[0], TensorMeta):
            continue
        node = plan.op_nodes[k]
        src = node.src
        if src in lines:
            continue
        ranks = {len(m.shape) for m in metas}
        if len(ranks) != 1:
            continue
        for d in range(ranks.pop()):
            # its sizes as they changed (a sighting that changed elsewhere repeats one)
            values = tuple(v for j, v in enumerate(m.shape[d] for m in metas)
                           if j == 0 or v != metas[j - 1].shape[d])
            if len(values) > 1:
                found.append(Growth(k, plan.steps[k][0].name, src, d, values))
                lines.add(src)
                break
    # a cache that has a fix of its own first
    found.sort(key=lambda g: g.src is None or os.path.basename(g.src.file) not in _HF_CACHE_FILES)
    return found[:limit]


def _sizes(values: tuple) -> str:
    return ", ".join(str(v) for v in values) + ", …"


def growth_text(found: list[Growth], label=format_loc) -> str:
    """What grows, by line, and the fix that fits: "dim 2 of the tensor made at
    cache_utils.py:120 update (aten::cat) grows by 1 each sync (9, 10, 11, …)"."""
    if not found:
        return ""
    parts = []
    for g in found:
        where = label(g.src) if g.src is not None else "?"
        how = (f"grows by {g.delta} each sync" if g.delta and g.delta > 0 else
               f"shrinks by {-g.delta} each sync" if g.delta else "changes")
        parts.append(f"dim {g.dim} of the tensor made at {where} ({g.op}) {how} "
                     f"({_sizes(g.values)})")
    return "; ".join(parts) + ". Fix: " + fix_for(found)


def fix_for(found: list[Growth]) -> str:
    """The fix that fits what grows: a Hugging Face cache's static implementation, or
    padding to buckets chosen from the sizes seen."""
    files = {os.path.basename(g.src.file) for g in found if g.src is not None}
    if files & _HF_CACHE_FILES:
        return ('the KV cache grows: generate(..., cache_implementation="static") keeps it '
                "at its maximum length, so every decode step is the same graph")
    g = found[0]
    return "pad that dimension to buckets: " + bucket_choices(g.values)


# transformers' cache classes (DynamicCache.update's torch.cat), and generate's loop
_HF_CACHE_FILES = {"cache_utils.py"}


def bucket_choices(sizes: tuple) -> str:
    """Bucket sets for the sizes seen, each with the compiles it needs for them and the
    padding it costs (padded elements over real ones, on average)."""
    out = []
    top = max(sizes)
    for name, bucket in (("multiples of 8", lambda n: -(-n // 8) * 8),
                         ("multiples of 64", lambda n: -(-n // 64) * 64),
                         ("powers of 2", lambda n: 1 << max(n - 1, 0).bit_length())):
        padded = [bucket(n) for n in sizes]
        cost = sum(p - n for p, n in zip(padded, sizes)) / max(sum(sizes), 1)
        out.append(f"{name} ({len(set(padded))} compile(s) for the {len(sizes)} sizes seen, "
                   f"{cost:.0%} padding)")
    return "; ".join(out) + f"; or one size, {top} or more (1 compile)"


def cut(plan: GraphPlan, varying: frozenset, on_host=None) -> list[list[int]]:
    """The segments of ``plan`` (lists of step indices, each in order, the segments in an
    order that runs): stretches of steps alternately changed and unchanged, short
    unchanged stretches joined to their changed neighbours, and an unchanged stretch
    that reads nothing of the changed one before it run with the unchanged one before
    that (``_hoisted``); a changed stretch whose inputs exist earlier joins an earlier
    changed one where ``on_host`` (step indices -> bool: they surely run on CPU torch
    together) says both and the two together do (``_changes_joined``); a getitem goes
    with the step it picks from (a multi-output value never crosses segments). One
    segment: nothing to cut."""
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
    if sum(1 for c in changed if not c) < MIN_KEPT_SHARE * n:
        return [list(range(n))]
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
    return _hoisted(plan, [s for s in segments if s], changed, on_host)


def _hoisted(plan: GraphPlan, segments: list[list[int]], changed: list, on_host=None
             ) -> list[list[int]]:
    """``segments`` (alternately changed and unchanged) with each unchanged one that
    reads nothing of the changed one before it moved into the unchanged one before
    that, so the changed ones around it run as one: a layer's value projection, recorded
    between its key cache's cat and attention and its value cache's cat, ran apart and
    split the attention over the cache in two (a tiny Llama's decode step: 16 segments,
    8 of them CPU torch's; 11 so, 5 of them). Whole stretches move, so a step whose
    signature starts or stops changing moves the cut only near it (cut by data flow
    alone, a decode step's big segments changed with each such step, and the first
    generate calls compiled each again: 1.15 -> 1.40 s); each step's inputs still come
    from its own or an earlier segment."""
    n_leaves = len(plan.leaves)
    out: list[list[int]] = []
    for seg in segments:
        if len(out) >= 2 and not changed[seg[0]] and changed[out[-1][0]]:
            last = {k + n_leaves for k in out[-1]}  # its values' positions
            if not any(p in last for k in seg for p in plan.steps[k][1]):
                out[-2] = sorted(out[-2] + seg)
                continue
        if out and changed[out[-1][0]] == changed[seg[0]]:
            out[-1] = out[-1] + seg  # two changed stretches, now next to each other
            continue
        out.append(seg)
    return _changes_joined(plan, out, changed, on_host) if on_host is not None else out


def _changes_joined(plan: GraphPlan, segments: list[list[int]], changed: list, on_host
                    ) -> list[list[int]]:
    """``segments`` with each changed one moved into the first changed one before it
    after which all its inputs exist, and the unchanged ones it then leaves side by side
    joined. generate's two slices of the input ids read only the graph's leaves, but an
    eager run records them on either side of the model's first ops: two changed
    segments where one does, each a crossing to CPU torch and back (a tiny Llama's
    cached decode step: 6 of them against a lazy graph's 5; 5 now). Only
    where both, and the two together, run on CPU torch: a changed step CPU torch cannot
    run (an index's bounds check) joined to a cat of input ids made it compile at every
    token."""
    n_leaves = len(plan.leaves)
    seg_at: dict[int, int] = {}  # a step's position -> the index of its segment in out
    out: list[list[int]] = []
    for seg in segments:
        if changed[seg[0]] and len(out) >= 2:
            own = {n_leaves + k for k in seg}
            after = max((seg_at[p] for k in seg for p in plan.steps[k][1]
                         if p >= n_leaves and p not in own), default=-1)
            into = next((t for t in range(max(after, 0), len(out) - 1)
                         if changed[out[t][0]]), None)
            if into is not None and not (on_host(seg) and on_host(out[into])
                                         and on_host(out[into] + seg)):
                into = None
            if into is not None:
                out[into] = sorted(out[into] + seg)
                for k in seg:
                    seg_at[n_leaves + k] = into
                continue
        if out and changed[out[-1][0]] == changed[seg[0]]:
            out[-1] = sorted(out[-1] + seg)  # (two unchanged: the change between moved)
        else:
            out.append(seg)
        for k in seg:
            seg_at[n_leaves + k] = len(out) - 1
    return out


def components(plan: GraphPlan) -> list[list[int]]:
    """The steps of ``plan`` in groups that share no value (a leaf shared is no link),
    each in order, ordered by their first step: an eager run that swept up the work of
    several reads, each of which ran alone before (issue 56: the same ops at the same
    shapes, read at the end instead of one by one)."""
    n_leaves = len(plan.leaves)
    parent = list(range(len(plan.steps)))

    def root(k: int) -> int:
        while parent[k] != k:
            parent[k] = parent[parent[k]]
            k = parent[k]
        return k

    for k, (_, ins) in enumerate(plan.steps):
        for p in ins:
            if p >= n_leaves:
                a, b = root(k), root(p - n_leaves)
                if a != b:
                    parent[max(a, b)] = min(a, b)
    groups: dict[int, list[int]] = {}
    for k in range(len(plan.steps)):
        groups.setdefault(root(k), []).append(k)
    return list(groups.values())


class Segment(NamedTuple):
    """One segment as a graph of its own: its plan, and where its leaves come from and
    its roots go in the whole graph's value list (leaves first, then steps)."""
    plan: GraphPlan
    inputs: tuple   # whole-graph positions of its leaves
    outputs: tuple  # whole-graph positions of its roots
    changed: bool   # it holds a step whose signature changed between sightings


class SegmentShape(NamedTuple):
    """A segment's structure, the same for every graph of one structural key: what
    ``bind`` needs to make its ``Segment`` for one such graph without planning again."""
    steps_at: tuple  # the whole graph's step indices it holds
    inputs: tuple
    outputs: tuple
    steps: list      # (OpSignature, local input positions) per step
    key: tuple       # its own structural key
    root_pos: tuple
    changed: bool


def segment_shapes(plan: GraphPlan, segments: list[list[int]], varying: frozenset
                   ) -> list[SegmentShape]:
    """Each segment's structure: its leaves are the whole graph's leaves and earlier
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
        steps = []
        for j, k in enumerate(seg):
            info, ins = plan.steps[k]
            local[n_leaves + k] = n_in + j
            steps.append((info, tuple(local[p] for p in ins)))
        outputs = tuple(n_leaves + k for k in seg
                        if n_leaves + k in roots or needed_after.get(n_leaves + k, -1) > s)
        leaf_keys = tuple(leaf_key(plan.leaves[p] if p < n_leaves
                                   else plan.op_nodes[p - n_leaves]) for p in inputs)
        root_pos = tuple(local[p] for p in outputs)
        key = (leaf_keys, *((info.uid, ins) for info, ins in steps), root_pos)
        out.append(SegmentShape(tuple(seg), tuple(inputs), outputs, steps, key, root_pos,
                                any(k in varying for k in seg)))
    return out


def bind(shapes: list[SegmentShape], plan: GraphPlan) -> list[Segment]:
    """The segments of ``plan`` (a graph of the key ``shapes`` were planned for): its
    nodes, lifted scalars and roots in each segment's structure."""
    n_leaves = len(plan.leaves)
    leaves_of, nodes = plan.leaves, plan.op_nodes
    out = []
    for s in shapes:
        op_nodes = [nodes[k] for k in s.steps_at]
        scalars = [x for node in op_nodes if node.scalars for x in node.scalars]
        leaves = [leaves_of[p] if p < n_leaves else nodes[p - n_leaves] for p in s.inputs]
        roots = [nodes[p - n_leaves] for p in s.outputs]
        out.append(Segment(GraphPlan(s.key, leaves, scalars, s.steps, op_nodes, roots,
                                     s.root_pos), s.inputs, s.outputs, s.changed))
    return out
