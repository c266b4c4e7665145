"""What an aten op is: its ``OpPlan``.

A plan classifies the op from its schema (functional, view, in-place, out=, mutating),
finds the functional variant that nodes record, and picks how to lower it: a JAX lowering
from the registry, or torch's decomposition traced on JAX values.
"""
from __future__ import annotations

import functools

import torch

from ..lowering import registry

aten = torch.ops.aten


class OpPlan:
    __slots__ = ("op", "kind", "fop", "lowering", "decomp", "mutated", "lift", "random", "name",
                 "special", "fast")

    def __init__(self, op, kind, fop, mutated):
        self.op = op
        self.special = None       # a handler that replaces the generic path (dispatch.SPECIAL)
        self.fast = None          # functional ops: positional-args signature -> OpSignature
        self.kind = kind          # functional | view | inplace | out | mutating
        self.fop = fop            # the functional op that nodes record
        self.mutated = mutated    # positions (int) or kwarg names (str) written to
        self.name = (f"{getattr(op, 'namespace', 'aten')}::{op.__name__.split('.')[0]}"
                     if hasattr(op, "__name__") else str(op))
        low = registry.lookup(fop) if fop is not None else None
        self.lowering = low
        self.decomp = None
        if low is None and fop is not None:
            self.decomp = decomposition(fop)
        # Floats are lifted into inputs only for JAX lowerings that accept traced floats.
        self.lift = low is not None and not low.static_floats
        self.random = low is not None and low.random


@functools.cache
def _decomposition_table():
    from torch._decomp import core_aten_decompositions, decomposition_table
    table = dict(decomposition_table)
    table.update(core_aten_decompositions())
    return table


def decomposition(op):
    return _decomposition_table().get(op)


def functional_variant(op, kind, schema):
    packet = op.overloadpacket
    name = packet.__name__
    overload = op._overloadname
    if kind == "inplace":
        # The functional overload must take the same arguments: pow_.Scalar is
        # pow_(Tensor self, Scalar exponent), but pow.Scalar is pow(Scalar self, Tensor).
        want = _arg_types(schema)
        fallback = None
        for pname in (name[:-1], name[:-1] + "_functional"):
            p = getattr(aten, pname, None)
            if p is None:
                continue
            names = p.overloads()
            for oname in ([overload] if overload in names else []) + sorted(names):
                f = getattr(p, oname)
                if any(_is_written(a) for a in f._schema.arguments):
                    continue
                if _arg_types(f._schema) == want:
                    return f
                if fallback is None and oname in (overload, "default"):
                    fallback = f
        return fallback
    if kind == "out":
        want = [a.name for a in schema.arguments if not _is_written(a)]
        for oname in packet.overloads():
            f = getattr(packet, oname)
            s = f._schema
            if any(_is_written(a) for a in s.arguments):
                continue
            if [a.name for a in s.arguments] == want:
                return f
        return None
    if kind == "mutating":
        # _foo_functional returns results then new values; foo_ (e.g. _foreach_mul_ with
        # a list argument) has the plain functional foo.
        for pname in (name + "_functional", name[:-1] if name.endswith("_") else None):
            p = getattr(aten, pname, None) if pname else None
            if p is not None and overload in p.overloads():
                return getattr(p, overload)
        return None
    return op


def _arg_types(schema) -> list:
    return [(a.name, str(a.type)) for a in schema.arguments]


def _is_written(arg) -> bool:
    return arg.alias_info is not None and arg.alias_info.is_write


def make_plan(op) -> OpPlan:
    """Classify ``op`` from its schema and find what its nodes record."""
    schema = op._schema
    written = [(i, a) for i, a in enumerate(schema.arguments) if _is_written(a)]
    if any(r.alias_info is not None and not r.alias_info.is_write for r in schema.returns):
        kind, mutated = "view", ()
    elif not written:
        kind, mutated = "functional", ()
    elif all(a.kwarg_only for _, a in written):
        kind, mutated = "out", tuple(a.name for _, a in written)
    elif len(written) == 1 and written[0][0] == 0 and schema.returns and \
            schema.returns[0].alias_info is not None:
        kind, mutated = "inplace", (0,)
    else:
        kind, mutated = "mutating", tuple(i for i, _ in written)
    return OpPlan(op, kind, functional_variant(op, kind, schema), mutated)
