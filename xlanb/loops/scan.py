"""Loops the program asks for: ``xlanb.scan(fn, init, xs)`` and
``xlanb.scan_layers(layers, x)`` (torch_xla's ``scan`` and ``scan_layers`` run on them).

    carry, ys = xlanb.scan(lambda c, x: (c + x, c * x), init, xs)   # jax.lax.scan's contract
    out = xlanb.scan_layers(model.layers, x)                         # nn.Sequential(*layers)(x)

Each iteration is recorded as ordinary ops, so autograd, every mode and every tool see
the unrolled program (values are the unrolled model's; gradients reach every layer's own
weights). Each iteration is recorded under a numbered scope and ends in a
``graph/repeats.LOOP_OP`` (an identity on its carry) that marks the loop as asked for:
when a lazy graph holding it compiles, ``graph/repeats.py`` finds the iterations (forward,
backward and the optimizer's per-layer updates) and ``executables/stages.py`` lowers each
run as one ``lax.scan``, on every platform and on a mesh, where the repeated layers it
finds on its own are looped only in a TPU's compile (``XLANB_SCAN_LAYERS=auto``).
``XLANB_SCAN_LAYERS=0`` unrolls these too. Eager and op-by-op runs have no graph to loop.
"""
from __future__ import annotations

import torch
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

from ..base.scopes import current_scope, in_scope, iteration, module_name
from ..base.session import mode_state
from ..graph.repeats import LOOP_OP
from ..ir.nodes import OpSignature
from ..ops.infos import infos
from ..modes.record import apply_op, write
from ..ir.templates import _In
from ..ir.tensor import XlaTensor

__all__ = ["scan", "scan_layers"]


def _step_info(meta, device: int) -> OpSignature:
    """The identity that ends an iteration: one per layout."""
    sig = (LOOP_OP, meta, device)
    info = infos.get(sig)
    if info is None:
        info = OpSignature(LOOP_OP, (LOOP_OP, (meta.shape, meta.dtype)),
                      lambda args, scalars: args[0], meta, n_in=1, device=device,
                      in_metas=(meta,), template=((_In(0),), {}))
        infos[sig] = info
    return info


def _end_iteration(carry) -> None:
    """Mark each pending tensor of ``carry`` as the end of an iteration (lazy recording
    only: eager and op-by-op runs have no graph to loop)."""
    state = mode_state()
    if not state.recording or state.mode != "lazy":
        return
    for t in tree_flatten(carry)[0]:
        if isinstance(t, XlaTensor) and not t._view and t._storage.node.data is None:
            s = t._storage
            write(t, apply_op(_step_info(s.meta, s.device), (s.node,), ()))


def _leading(xs) -> int:
    leaves = tree_flatten(xs)[0]
    if not leaves:
        raise ValueError(f"xlanb.scan: xs {xs!r} is an empty pytree: nothing to scan over")
    sizes = {len(leaf) for leaf in leaves}
    if len(sizes) > 1:
        raise ValueError("xlanb.scan: the leaves of xs must have the same leading dimension, "
                         f"got sizes {sorted(sizes)}")
    return sizes.pop()


def scan(fn, init, xs):
    """``jax.lax.scan`` on tensors: ``carry, y = fn(carry, x)`` for each ``x`` along the
    leading dimension of ``xs`` (a tensor or a pytree of them), starting from ``init``;
    returns the last carry and the ``y``s stacked (a pytree like ``y``; ``None`` leaves
    stay ``None``). Compiled as one loop in a lazy graph (see the module docstring)."""
    __debuggerskip__ = True  # IPython's debugger steps over xlanb frames
    if not callable(fn):
        raise ValueError(f"xlanb.scan: fn {fn!r} must be callable")
    n = _leading(xs)
    flat, spec = tree_flatten(xs)
    base = f"{current_scope()}.scan" if current_scope() else "scan"
    carry, ys = init, []
    for i in range(n):
        # sliced outside the iteration, and copied: a view's offset is part of its ops'
        # signatures, so ops on the slice itself would differ from iteration to iteration
        x = tree_unflatten([leaf[i].clone() for leaf in flat], spec)
        with iteration(f"{base}.{i}"):
            carry, y = fn(carry, x)
            _end_iteration(carry)
        ys.append(y)
    if not ys:
        return carry, None
    return carry, tree_map(lambda *v: None if v[0] is None else torch.stack(v), *ys,
                           is_leaf=lambda v: v is None)


def _scopes(layers: list) -> list | None:
    """The scopes ``layers`` already run under, if they are one numbered module list
    (``Model.layers.0``, ``.1``, ...): the loop keeps the model's own names."""
    names = [module_name(m) for m in layers]
    if any(n is None for n in names):
        return None
    prefixes = {n.rpartition(".")[0] for n in names}
    idx = [n.rpartition(".")[2] for n in names]
    if len(prefixes) != 1 or not all(i.isdigit() for i in idx) or len(set(idx)) != len(idx):
        return None
    return names


def scan_layers(layers, x):
    """``nn.Sequential(*layers)(x)``, compiled as one loop over the layers in a lazy
    graph: the layers must be alike (the same parameter and buffer names and shapes,
    else ``ValueError``). Each layer keeps its own weights."""
    __debuggerskip__ = True  # IPython's debugger steps over xlanb frames
    layers = list(layers)
    if not layers:
        return x
    _check_alike(layers)
    names = _scopes(layers)
    if names is None:  # not one module list the model named: numbered under the caller
        base = f"{current_scope()}.scan_layers" if current_scope() else "scan_layers"
        for i, layer in enumerate(layers):
            with iteration(f"{base}.{i}"):
                x = layer(x)
                _end_iteration(x)
        return x
    for name, layer in zip(names, layers):
        x = layer(x)
        with in_scope(name):
            _end_iteration(x)
    return x


def _check_alike(layers) -> None:
    """The same parameter and buffer names and shapes in every layer (torch_xla's check,
    and its messages)."""
    for kind in ("parameters", "buffers"):
        ref = {k: v.shape for k, v in getattr(layers[0], "named_" + kind)()}
        for idx, layer in enumerate(layers[1:], start=1):
            cur = {k: v.shape for k, v in getattr(layer, "named_" + kind)()}
            if set(cur) != set(ref):
                msg = f"Layer {idx} has mismatched keys."
                if set(ref) - set(cur):
                    msg += f" Missing keys: {set(ref) - set(cur)}."
                if set(cur) - set(ref):
                    msg += f" Extra keys: {set(cur) - set(ref)}."
                raise ValueError(msg)
            for k, shape in ref.items():
                if cur[k] != shape:
                    raise ValueError(f"Shape mismatch for '{k}' in layer {idx}: "
                                     f"expected {shape}, got {cur[k]}.")
