"""Repeated layers in a recorded graph, found so that XLA compiles one layer's body.

A transformer's step is the same layer N times. Every op records its module scope
(``Bert.encoder.layer.3.attention.self``), so the forward ops of each layer form a
*segment*: the ops whose scope carries one index of a numbered module list. Backward
ops have no scope (autograd runs them); each is given the layer whose values it uses
directly (the layer's weights, its saved activations, its input), else the layer of the
ops that made its inputs.

Consecutive segments repeat when they are the same ops (the same ``OpSignature``: op,
shapes, dtypes, static arguments) with the same wiring, and each takes from the segment
before it only its *carry* (the running activation, or its gradient), always from the
same op. Their other inputs are either the same value for every layer (an attention
mask: *invariant*) or one value per layer (weights, dropout keys: stacked, *xs*). Values
of a segment that anything outside the run uses (activations saved for backward, weight
gradients) come out stacked (*ys*). ``executables/stages.py`` lowers such a run as one
``jax.lax.scan``. Anything uncertain stays unrolled: a layer that differs, a run whose
ops would have to move across an op outside it, a segment that reads a value from two
layers back. ``find_repeats`` says why for each layer left out of a run.

An optimizer's step updates each layer's weights with the same ops: those updates form
a third kind of run, with no carry (each layer's update is independent of the others),
lowered as a scan over the stacked weights, gradients and optimizer states.

A loop the program asks for (``xlanb.scan``, ``xlanb.scan_layers`` and torch_xla's
``scan``/``scan_layers`` on them) is recorded unrolled, as its iterations' ops, each
iteration ending in a ``LOOP_OP`` (an identity on its carry, in the iteration's scope):
``find_repeats(..., asked_only=True)`` finds only the runs of those module lists, which
are lowered as loops on every platform and mesh.

Plain data over a graph's steps ``(OpSignature, input positions)``: values 0..L-1 are the
leaves, L+j is op j. The decision depends on the structure only, so it is made once per
graph structure (with its lowering) and the steady step pays nothing.
"""
from __future__ import annotations

import re
from typing import NamedTuple

_NUMBERED = re.compile(r"\.(\d+)(?=\.|$)")
MIN_RUN = 2
# the op that ends each iteration of a loop the program asked for (xlanb/loops/scan.py)
LOOP_OP = "xlanb::loop_step"


class Run(NamedTuple):
    """Layers lowered as one ``lax.scan``."""
    name: str          # ``bert.encoder.layer``: the numbered module list
    kind: str          # "forward" | "backward"
    layers: tuple      # the layer index of each segment, in stacking order (ascending)
    segments: tuple    # per layer: its op indices, in the body's order
    reverse: bool      # the chain runs from the last stacked layer to the first
    ext: tuple         # per layer: the value position of each external input slot
    carry: tuple       # (slot, local op it comes from in the layer before)
    invariant: tuple   # slots with the same value in every layer
    xs: tuple          # slots with a value per layer, stacked
    exported: tuple    # local ops whose values are used outside the run (stacked ys)

    @property
    def what(self) -> str:
        """``bert.encoder.layer backward``: the module list and the pass."""
        return self.name + _KIND_WORDS[self.kind]

    @property
    def first(self) -> int:
        """The segment the run starts with (its chain may run from the last layer)."""
        return len(self.segments) - 1 if self.reverse else 0

    def describe(self) -> str:
        return (f"{len(self.layers)} × {self.what}"
                f" compiled once (scan, layers {min(self.layers)}–{max(self.layers)})")


_KIND_WORDS = {"forward": "", "backward": " backward", "update": " update"}


class Repeats(NamedTuple):
    """What ``find_repeats`` found: the runs, the order to evaluate the graph in (an op
    index, or ``("run", i)``), and why layers were left unrolled."""
    runs: tuple
    order: tuple
    unrolled: tuple    # one line per layer (or group) left out, with the reason

    def lines(self) -> list[str]:
        return [r.describe() for r in self.runs] + [f"unrolled: {u}" for u in self.unrolled]


def _short(prefix: str) -> str:
    """``BertForSequenceClassification.bert.encoder.layer`` -> ``bert.encoder.layer``."""
    return prefix.split(".", 1)[1] if "." in prefix else prefix


def _numbered(scope: str) -> list[tuple[str, int]]:
    """Every ``(prefix, index)`` of a numbered module in ``scope``, outermost first."""
    return [(scope[:m.start()], int(m.group(1))) for m in _NUMBERED.finditer(scope)]


def _forward_groups(places) -> dict:
    """(prefix, index) -> op indices, for ops inside numbered modules. Each op goes to
    the outermost numbered module list with at least two members in the graph."""
    cands = [_numbered(scope or "") for _src, scope in places]
    members: dict[str, set] = {}
    for c in cands:
        for prefix, idx in c:
            members.setdefault(prefix, set()).add(idx)
    groups: dict = {}
    for j, c in enumerate(cands):
        for prefix, idx in c:
            if len(members[prefix]) >= MIN_RUN:
                groups.setdefault((prefix, idx), []).append(j)
                break
    return groups


def _segment(ops, steps, n_leaves):
    """A segment's canonical form (op uids and wiring relative to the segment) and its
    external inputs (value positions, in order of first use)."""
    local = {n_leaves + j: m for m, j in enumerate(ops)}
    ext: dict[int, int] = {}
    canon = []
    for j in ops:
        info, ins = steps[j]
        wires = []
        for i in ins:
            m = local.get(i)
            if m is not None:
                wires.append(m)
            else:
                e = ext.get(i)
                if e is None:
                    e = ext[i] = len(ext)
                wires.append(-1 - e)
        canon.append((info.uid, tuple(wires)))
    return tuple(canon), tuple(ext)


def _difference(ca, cb, ops_a, ops_b, steps) -> str:
    """Where two segments' forms first differ, in words."""
    if len(ca) != len(cb):
        return f"{len(cb)} ops where the layer before has {len(ca)}"
    for m, (x, y) in enumerate(zip(ca, cb)):
        if x != y:
            ia, ib = steps[ops_a[m]][0], steps[ops_b[m]][0]
            if x[0] != y[0]:
                return f"op {m} is {ib.name} {_meta(ib)} where the layer before has {ia.name} {_meta(ia)}"
            return f"op {m} ({ib.name}) is wired differently"
    return "different inputs"


def _meta(info) -> str:
    out = info.out
    shapes = [o for o in (out if info.multi else (out,)) if o is not None]
    return "(" + ", ".join("x".join(map(str, o.shape)) or "scalar" for o in shapes) + ")"


class _Layer(NamedTuple):
    idx: int
    ops: list
    canon: tuple
    ext: tuple


def _chains(name, kind, layers, steps, n_leaves, users, roots, unrolled) -> list[Run]:
    """Split ``layers`` (in execution order) into runs of identical, carry-linked layers
    (for an optimizer's updates, ``kind="update"``: identical, independent layers)."""
    runs = []
    i = 0
    while i < len(layers):
        j = i + 1
        carry = None
        while j < len(layers):
            a, b = layers[j - 1], layers[j]
            if b.canon != layers[i].canon:
                unrolled.append(f"{name}.{b.idx}{_KIND_WORDS[kind]}: "
                                f"differs from {name}.{a.idx}: "
                                + _difference(layers[i].canon, b.canon, layers[i].ops, b.ops, steps))
                break
            prev_local = {n_leaves + op: m for m, op in enumerate(a.ops)}
            c = tuple((e, prev_local[v]) for e, v in enumerate(b.ext) if v in prev_local)
            if carry is None:
                carry = c
            elif c != carry:
                unrolled.append(f"{name}.{b.idx}: takes other values from {name}.{a.idx} "
                                "than the layers before")
                break
            if (not c) != (kind == "update"):
                break  # a chain of independent layers, or updates that read each other
            j += 1
        seg = layers[i:j]
        run = _make_run(name, kind, seg, carry, n_leaves, users, roots, unrolled) \
            if len(seg) >= MIN_RUN else None
        if run is not None:
            runs.append(run)
        i = j
    return runs


def _make_run(name, kind, seg, carry, n_leaves, users, roots, unrolled):
    produced = {n_leaves + op for layer in seg for op in layer.ops}
    carry_slots = {e for e, _ in carry}
    invariant, xs = [], []
    for e in range(len(seg[0].ext)):
        if e in carry_slots:
            if seg[0].ext[e] in produced:
                return None
            continue
        vals = [layer.ext[e] for layer in seg]
        if any(v in produced for v in vals):
            unrolled.append(f"{name}.{seg[0].idx}–{seg[-1].idx}: a layer reads a value made "
                            "two or more layers before")
            return None
        (invariant if all(v == vals[0] for v in vals) else xs).append(e)
    n_local = len(seg[0].ops)
    exported = []
    for m in range(n_local):
        for layer in seg:
            p = n_leaves + layer.ops[m]
            if p in roots or any(u + n_leaves not in produced for u in users.get(p, ())):
                exported.append(m)
                break
    # stacking order: ascending layer index; the chain may run the other way
    reverse = seg[0].idx > seg[-1].idx
    ordered = seg[::-1] if reverse else seg
    return Run(name, kind, tuple(s.idx for s in ordered), tuple(tuple(s.ops) for s in ordered),
               reverse, tuple(s.ext for s in ordered), tuple(carry), tuple(invariant),
               tuple(xs), tuple(exported))


def _backward_layers(runs, steps, n_leaves, taken, places, by_line: bool) -> dict:
    """(run index, layer) -> op indices for the ops of the backward pass (no scope, and
    recorded with the line of a forward op of the layers, as autograd's ops are). The
    optimizer's ops (from the user's ``step()`` line) stay out.

    Each op goes to the layer whose values it uses directly (weights, saved activations,
    the layer's input), else to the one layer its inputs were made by. The value one
    layer hands the next belongs to the layer it enters; with ``by_line``, an op that
    differentiates the forward line that made it (autograd gives a backward op the line
    of the forward op) takes it as the layer's that made it (a ReLU's backward reads the
    ReLU's output). Either is only a guess: the segments it gives must still pass every
    check of a run."""
    owner: dict[int, tuple] = {}
    made_by: dict[int, tuple] = {}  # boundary value -> (layer that made it, its lines)
    for r, run in enumerate(runs):
        last = -1 if not run.reverse else 0  # the layer the chain ends with
        for layer, ops, ext in zip(run.layers, run.segments, run.ext):
            for op in ops:
                owner[n_leaves + op] = (r, layer)
            for e in run.xs:
                owner[ext[e]] = (r, layer)
        body = run.segments[0]
        out_lines = {places[body[m]][0] for _e, m in run.carry}
        in_lines = set()
        for m, op in enumerate(body):
            if any(i in {run.ext[0][e] for e, _ in run.carry} for i in steps[op][1]):
                in_lines.add(places[op][0])
        only_out = out_lines - in_lines
        # the carry into a layer is that layer's (its input), not the one before's
        for k, (layer, ext) in enumerate(zip(run.layers, run.ext)):
            for e, _ in run.carry:
                owner[ext[e]] = (r, layer)
                if by_line and ext[e] - n_leaves in taken:
                    made_by[ext[e]] = (owner_of_op(run, ext[e] - n_leaves, r), only_out)
        # what the last layer hands on belongs to whatever comes after the run (but
        # to the last layer for an op that differentiates the line that made it)
        for _e, m in run.carry:
            owner.pop(n_leaves + run.segments[last][m], None)
            if by_line:
                made_by[n_leaves + run.segments[last][m]] = ((r, run.layers[last]), only_out)
    # autograd records a backward op with the line of the forward op it differentiates.
    # A loop's step op has no backward, and its line is the loop call's, which may also
    # be the line of the op that feeds the loop (``scan_layers(layers, embed(x))``)
    lines = {places[op][0] for run in runs for ops in run.segments for op in ops
             if steps[op][0].name != LOOP_OP}
    groups, handed = _label_backward(steps, n_leaves, taken, places, lines, owner, made_by, {})
    if handed:
        # The gradient one layer's backward hands the next belongs to the layer it enters,
        # as the forward carry does: found as the value that layer's own ops read (ops
        # that also read its weights or activations). Else the ops that read only it (a
        # bias's gradient, the sum of a pre-LN block's residual gradients) would count as
        # the layer that made it, and each weight's update would read two layers.
        groups, _ = _label_backward(steps, n_leaves, taken, places, lines, owner, made_by,
                                    handed)
    return groups


def _label_backward(steps, n_leaves, taken, places, lines, owner, made_by, handed):
    """One labelling of the backward ops (see ``_backward_layers``), with ``handed``:
    gradients taken as the layer's they enter. Returns the groups, and the gradients
    entering a layer: the values made outside it (or by another layer) that its *anchored*
    ops read (ops labelled by what they read of the layer's own: its weights, activations,
    or a one-input op of them, as ``t(weight)``), each with the one-input ops that led
    there from the value made outside (a ``view`` of it)."""
    label: dict[int, tuple] = {}
    anchored: dict[int, tuple] = {}
    groups: dict = {}
    enters: dict[int, set] = {}
    for j, (info, ins) in enumerate(steps):
        if j in taken or places[j][1] or places[j][0] not in lines:
            continue
        direct = set()
        for i in ins:
            mb = made_by.get(i)
            if mb is not None and places[j][0] in mb[1]:
                direct.add(mb[0])
            elif i in owner:
                direct.add(owner[i])
            elif i in anchored:
                direct.add(anchored[i])
            elif i in handed:
                direct.add(handed[i])
        by_owner = len(direct) == 1
        if not direct:
            labelled = [i for i in ins if i in label]
            direct = {label[i] for i in labelled}
            if len(direct) > 1:
                # a residual block's gradient sum: the gradient from the layer after
                # plus this layer's own (made last), the sum being this layer's output
                direct = {label[max(labelled)]}
        if len(direct) != 1:
            continue
        lab = direct.pop()
        label[n_leaves + j] = lab
        groups.setdefault(lab, []).append(j)
        if not by_owner:
            continue
        if len(ins) == 1:
            anchored[n_leaves + j] = lab
        for i in ins:
            while i >= n_leaves and i not in owner and i not in made_by \
                    and i not in anchored and label.get(i) != lab:
                enters.setdefault(i, set()).add(lab)
                made = steps[i - n_leaves][1]
                if len(made) != 1 or i - n_leaves in taken:
                    break
                i = made[0]  # a one-input op of the value made outside: it enters too
    return groups, {i: labs.pop() for i, labs in enters.items() if len(labs) == 1}


def owner_of_op(run, op, r) -> tuple:
    for layer, ops in zip(run.layers, run.segments):
        if op in ops:
            return (r, layer)
    return None


def _backward_runs(forward, steps, n_leaves, places, users, roots) -> tuple[list, list]:
    """The backward runs of ``forward``'s layers, and why layers stayed unrolled: the
    guess of ``_backward_layers`` that puts more layers into loops."""
    taken = {op for run in forward for ops in run.segments for op in ops}
    best = None
    for by_line in (False, True):
        unrolled: list[str] = []
        bw = _backward_layers(forward, steps, n_leaves, taken, places, by_line)
        by_run: dict[int, list] = {}
        for (r, layer), ops in bw.items():
            by_run.setdefault(r, []).append((min(ops), layer, ops))
        runs = []
        for r, members in sorted(by_run.items()):
            layers = []
            for _first, idx, ops in sorted(members):  # execution order
                canon, ext = _segment(ops, steps, n_leaves)
                layers.append(_Layer(idx, ops, canon, ext))
            runs += _chains(forward[r].name, "backward", layers, steps, n_leaves, users,
                            roots, unrolled)
        covered = sum(len(run.layers) for run in runs)
        if best is None or covered > best[0]:
            best = (covered, runs, unrolled)
    return best[1], best[2]


def _update_runs(runs, steps, n_leaves, places, users, roots) -> tuple[list, list]:
    """The optimizer's per-layer updates of the forward runs' layers, as runs with no
    carry, and why layers stayed unrolled. An update op is one the runs did not take,
    with no scope, recorded at a line that no op of the model's forward has (autograd's
    ops carry a forward line; an optimizer's ``step()`` runs at the user's). It belongs
    to a layer when every value it reads that a layer owns is that one layer's: its weights
    (its per-layer inputs), a value its backward run made (a weight's gradient), or a
    value made by an update op of that layer (Adam's moments, then the step)."""
    taken = {op for run in runs for ops in run.segments for op in ops}
    lines = {src for src, scope in places if scope}  # the model's forward lines
    label: dict[int, tuple] = {}  # value position -> (module list, layer index)
    for run in runs:
        for layer, ops, ext in zip(run.layers, run.segments, run.ext):
            if run.kind != "forward":  # a gradient; not an activation (the loss reads one)
                for op in ops:
                    label[n_leaves + op] = (run.name, layer)
            if run.kind == "forward":
                for e in run.xs:
                    if ext[e] < n_leaves:
                        label[ext[e]] = (run.name, layer)
    groups: dict[tuple, list] = {}
    for j, (_info, ins) in enumerate(steps):
        if j in taken or places[j][1] or places[j][0] in lines:
            continue
        keys = {label[i] for i in ins if i in label}
        if len(keys) == 1:
            key = keys.pop()
            label[n_leaves + j] = key
            groups.setdefault(key, []).append(j)
    by_name: dict[str, list] = {}
    for (name, layer), ops in groups.items():
        by_name.setdefault(name, []).append((min(ops), layer, ops))
    out: list[Run] = []
    unrolled: list[str] = []
    for name, members in by_name.items():
        layers = []
        for _first, idx, ops in sorted(members):  # execution order
            canon, ext = _segment(ops, steps, n_leaves)
            layers.append(_Layer(idx, ops, canon, ext))
        out += _chains(name, "update", layers, steps, n_leaves, users, roots, unrolled)
    return out, unrolled


def _schedule(runs, n_ops, steps, n_leaves):
    """An evaluation order with each run as one item, or None if the runs cannot be
    contracted without a cycle."""
    item_of: dict[int, object] = {}
    for r, run in enumerate(runs):
        for ops in run.segments:
            for op in ops:
                item_of[op] = ("run", r)
    first: dict = {}
    deps: dict = {}
    for j in range(n_ops):
        it = item_of.get(j, j)
        first.setdefault(it, j)
        d = deps.setdefault(it, set())
        for i in steps[j][1]:
            if i >= n_leaves:
                src = item_of.get(i - n_leaves, i - n_leaves)
                if src != it:
                    d.add(src)
    # Kahn's algorithm, earliest first op first
    import heapq
    waiting = {it: len(d) for it, d in deps.items()}
    dependents: dict = {}
    for it, d in deps.items():
        for s in d:
            dependents.setdefault(s, []).append(it)
    ready = [(first[it], repr(it), it) for it, n in waiting.items() if n == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        _, _, it = heapq.heappop(ready)
        order.append(it)
        for t in dependents.get(it, ()):
            waiting[t] -= 1
            if waiting[t] == 0:
                heapq.heappush(ready, (first[t], repr(t), t))
    return tuple(order) if len(order) == len(deps) else None


def find_repeats(steps, n_leaves: int, root_pos, places, asked_only: bool = False
                 ) -> Repeats | None:
    """The runs of repeated layers of a graph (forward, then backward), or None if
    there are none to scan; with ``asked_only``, only those of the loops the program
    asked for (module lists whose segments end in a ``LOOP_OP``)."""
    if not steps:
        return None
    users: dict[int, list] = {}
    for j, (_info, ins) in enumerate(steps):
        for i in ins:
            users.setdefault(i, []).append(j)
    roots = set(root_pos)
    unrolled: list[str] = []
    groups = _forward_groups(places)
    if asked_only:
        asked = {prefix for (prefix, _idx), ops in groups.items()
                 if any(steps[j][0].name == LOOP_OP for j in ops)}
        groups = {k: ops for k, ops in groups.items() if k[0] in asked}
    by_prefix: dict[str, list] = {}
    for (prefix, idx), ops in groups.items():
        by_prefix.setdefault(prefix, []).append((idx, ops))
    runs: list[Run] = []
    for prefix, members in by_prefix.items():
        layers = []
        for idx, ops in sorted(members):
            canon, ext = _segment(ops, steps, n_leaves)
            layers.append(_Layer(idx, ops, canon, ext))
        runs += _chains(_short(prefix), "forward", layers, steps, n_leaves, users, roots, unrolled)
    if not runs:
        return None
    backward, why = _backward_runs(runs, steps, n_leaves, places, users, roots)
    runs += backward
    unrolled += why
    updates, why = _update_runs(runs, steps, n_leaves, places, users, roots)
    runs += updates
    unrolled += why
    while runs:
        order = _schedule(runs, len(steps), steps, n_leaves)
        if order is not None:
            return Repeats(tuple(runs), order, tuple(unrolled))
        dropped = runs.pop()  # the last found (an update run, then a backward one, first)
        unrolled.append(f"{len(dropped.layers)} × {dropped.what}: its ops cannot be "
                        "gathered into one loop without moving an op across it")
    return None
