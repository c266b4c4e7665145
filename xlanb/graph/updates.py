"""Which module's parameter each of an optimizer's ops updates (issue 48).

An optimizer's ops have no module scope: ``opt.step()`` runs outside the model, at the
user's line. What each of them updates is in the graph's wiring: a parameter is a leaf
that the forward ops of one module read (``bert.encoder.layer.3.attention.self.query``),
and an update op belongs to that module when the values it reads lead back to that one
parameter (``param.mul_(1 - lr * wd)``, then ``param.addcdiv_(...)``), or when its
results go only into that parameter's update (Adam's moments and step count, which read
optimizer state and a gradient, never the parameter itself). An op that mixes several
parameters (a ``_foreach_`` op over all of them, a global gradient norm) has none.

The lowering names each such op's instruction after its parameter's module, under
``PARAM_SEGMENT`` in the name stack (``execute/stages.py``); ``hlo_text.param_of``
reads it back, and the compile profile counts it as ``optimizer.step (module)``. Plain
data over a graph's steps, as ``graph/repeats.py``: values 0..L-1 are the leaves, L+j
is op j; ``places[j]`` is op j's ``(source line, scope)``.
"""
from __future__ import annotations

# the name-stack segment before an update op's parameter module: "-" is in no module's
# attribute name, so no model scope starts with it
PARAM_SEGMENT = "xlanb-param"


def param_modules(steps, n_leaves: int, places) -> dict[int, str]:
    """op index -> the scope of the module whose parameter it updates, for the ops with
    no scope recorded at a line where no forward op was (an optimizer's step)."""
    forward_lines = {src for src, scope in places if scope}
    readers: dict[int, set] = {}
    for j, (_info, ins) in enumerate(steps):
        scope = places[j][1]
        if scope:
            for i in ins:
                if i < n_leaves:
                    readers.setdefault(i, set()).add(scope)
    label = {i: next(iter(s)) for i, s in readers.items() if len(s) == 1}
    cands = [j for j, (src, scope) in enumerate(places)
             if not scope and src is not None and src not in forward_lines]
    if not cands or not label:
        return {}
    users: dict[int, list] = {}
    for j in cands:
        for i in steps[j][1]:
            users.setdefault(i, []).append(j)

    def one(labels: set):
        return next(iter(labels)) if len(labels) == 1 else None

    out: dict[int, str] = {}
    for _ in range(2):  # from the parameter forward, from its update back; once more
        for j in cands:
            if j not in out:
                lab = one({label[i] for i in steps[j][1] if i in label})
                if lab is not None:
                    out[j] = label[n_leaves + j] = lab
        for j in reversed(cands):
            if j not in out:
                lab = one({out[u] for u in users.get(n_leaves + j, ()) if u in out})
                if lab is not None:
                    out[j] = label[n_leaves + j] = lab
    return out
