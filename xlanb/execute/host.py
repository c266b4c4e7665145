"""Small segments whose shapes change, computed by CPU torch instead of compiled (issue 56).

A segment of a graph whose shapes change compiles again at every new shape: generate's
bookkeeping (``input_ids`` one longer per token, the attention mask grown by a cat, the
slice of the last token, ``isin`` of the end-of-sequence ids) is a handful of ops on a few
hundred bytes, and each compile costs XLA 15-30 ms where CPU torch takes microseconds.
So a changed segment whose values are small (``config.host_segment_bytes``, inputs and
outputs together) and whose every op is an aten op CPU torch runs the same way runs
there: its inputs cross to the host, each op runs as its functional aten op (the op
nodes record), the outputs cross back. CPU torch is the reference every mode is held
to, so its values are the right ones. Not for random ops (xlanb's keys are its own),
``as_strided`` (its
arguments address storage, not values), nor xlanb's own ops; a segment that CPU torch
refuses, or whose results differ in shape or dtype from the signatures', compiles as
before and is not tried again. An ``empty`` is zeros, as on the device. Counted
``SegmentOnHost``. A whole small eager run whose shapes changed runs here too when its
every value is an integer (``exact_only``: no device rounding to hide).
"""
from __future__ import annotations

import time

import numpy as np
import torch

from ..base import metrics
from ..base.caches import cache
from ..base.config import config
from ..base.dtypes import HELD_AS
from ..ir.nodes import GETITEM, GraphPlan, TensorMeta, leaf_meta, result_bytes
from ..ir.templates import fill_call
from ..runtime.transfer import array_to_host, host_to_device
from ..values.fills import EMPTIES

aten = torch.ops.aten
# aten packets whose functional op CPU torch does not compute as xlanb does
_NOT_ON_HOST = {aten.as_strided, aten.as_strided_scatter, aten.as_strided_copy}

_refused: set = cache(set(), "segment keys CPU torch could not run as their signatures say",
                      group="graphs")


def _op_on_host(info) -> bool:
    if info.name == GETITEM or info.name in EMPTIES:
        return True
    op = info.op
    if op is None or info.template is None or info.plan is None or info.plan.random:
        return False
    if "key" in info.scalar_specs or getattr(op, "overloadpacket", None) in _NOT_ON_HOST:
        return False
    metas = [info.out] if isinstance(info.out, TensorMeta) else list(info.out)
    return all(isinstance(m, TensorMeta) and m.dtype not in HELD_AS for m in metas)


def fits_host(plan: GraphPlan) -> bool:
    """Whether the segment ``plan`` may run on CPU torch: small, and every op one CPU
    torch computes as xlanb does."""
    limit = config.host_segment_bytes
    if not limit or plan.key in _refused:
        return False
    # judged once per key and limit: a cached decode step asks for each of its host
    # segments at every token (93 a tiny Llama generate call)
    fits = _fits.get((plan.key, limit))
    if fits is None:
        fits = _fits[(plan.key, limit)] = _judge_fits(plan, limit)
    return fits


_fits: dict = cache({}, "(segment key, host_segment_bytes) -> whether it fits CPU torch",
                    group="graphs")


def _judge_fits(plan: GraphPlan, limit: int) -> bool:
    total = sum(result_bytes(leaf_meta(n)) for n in plan.leaves)
    for info, _ in plan.steps:
        if not _op_on_host(info):
            return False
    for p in plan.root_pos:
        total += result_bytes(plan.steps[p - len(plan.leaves)][0].out) \
            if p >= len(plan.leaves) else 0
    return total <= limit


def steps_fit_host(plan: GraphPlan, steps: list[int]) -> bool:
    """Whether the ``steps`` of ``plan`` (step indices), as a segment of their own, surely
    fit CPU torch as ``fits_host`` judges: every op one it runs, and the inputs they read
    from outside plus every value they make (more than the segment's outputs, which
    depend on the rest of the cut) within ``config.host_segment_bytes``."""
    limit = config.host_segment_bytes
    if not limit:
        return False
    n_leaves = len(plan.leaves)
    inside = {n_leaves + k for k in steps}
    read: set[int] = set()
    total = 0
    for k in steps:
        info, ins = plan.steps[k]
        if not _op_on_host(info):
            return False
        total += result_bytes(info.out)
        read.update(p for p in ins if p not in inside)
    for p in read:
        total += result_bytes(leaf_meta(plan.leaves[p]) if p < n_leaves
                              else plan.steps[p - n_leaves][0].out)
    return total <= limit


def exact_only(plan: GraphPlan) -> bool:
    """Whether every value of ``plan`` (leaves and results) is an integer or a boolean:
    arithmetic that every backend computes exactly, so CPU torch's values are the
    device's, bit for bit (generate's attention mask and stopping checks)."""
    metas = [leaf_meta(n) for n in plan.leaves]
    for info, _ in plan.steps:
        metas += [info.out] if isinstance(info.out, TensorMeta) else list(info.out)
    return all(isinstance(m, TensorMeta) and not (m.dtype.is_floating_point or m.dtype.is_complex)
               for m in metas)


def run_on_host(plan: GraphPlan, arrays: list, device: int, to_device: bool = True
                ) -> list | None:
    """The roots' device arrays of segment ``plan`` computed by CPU torch from its leaf
    ``arrays`` (with ``to_device`` False, the CPU tensors); None if CPU torch refuses it
    (then it compiles, and is not tried again)."""
    t0 = time.perf_counter()
    vals = [array_to_host(a) for a in arrays]
    k = 0
    # One intra-op thread: a segment this small gains nothing from more, and ATen's
    # (and MKL's) thread pool waits at each op's barrier for a core that XLA's threads
    # hold: the tiny Llama's cached generate call took 1.24 s against 0.49 s with one
    # (eager, 2 cores, loaded). Restored after, so the user's CPU torch keeps its own.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.no_grad():
            for (info, ins), node in zip(plan.steps, plan.op_nodes):
                n = len(info.scalar_specs)
                args = [vals[i] for i in ins]
                if info.name == GETITEM:
                    out = info.fn(args, ())
                elif info.name in EMPTIES:
                    # torch's empties are uninitialized memory; xlanb's are zeros
                    out = torch.zeros(info.out.shape, dtype=info.out.dtype)
                else:
                    # (a lifted float is a numpy float32 for an "f32" op: CPU torch
                    # rounds the number to float32 itself, so its value is the same)
                    scs = [s.item() if isinstance(s, np.generic) else s
                           for s in plan.scalars[k:k + n]]
                    a, kw = fill_call(info.template, args, scs)
                    out = info.op(*a, **kw)
                    _check(out, info.out)
                k += n
                vals.append(out)
    except Exception:  # noqa: BLE001 - it compiles instead, which reports a real error
        _refused.add(plan.key)
        metrics.counter("SegmentHostRefused")
        return None
    finally:
        torch.set_num_threads(threads)
    outs = [vals[p] if not to_device else host_to_device(vals[p].contiguous(), device)
            for p in plan.root_pos]
    metrics.counter("SegmentOnHost")
    metrics.record("SegmentOnHostTime", time.perf_counter() - t0)
    return outs


def _check(out, meta) -> None:
    """A host result must be what the signature says (shape, dtype), or it is not used."""
    if isinstance(meta, TensorMeta):
        if not isinstance(out, torch.Tensor) or tuple(out.shape) != tuple(meta.shape) \
                or out.dtype != meta.dtype:
            raise TypeError("host result differs from its signature")
        return
    if not isinstance(out, (tuple, list)) or len(out) != len(meta):
        raise TypeError("host result differs from its signature")
    for o, m in zip(out, meta):
        _check(o, m)
