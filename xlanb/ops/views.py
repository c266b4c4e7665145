"""Views: what a view op's info keeps (``ViewRecord``), and writing through a view chain.

A view tensor remembers the chain of view infos from its base's value. Writing to it
records one ``view_scatter`` node: the chain is replayed on an iota of the base's shape
to find the positions the view covers, and the new values are scattered there. One
mechanism covers every view op and every dtype.
"""
from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import numpy as np

from ..base.session import session
from ..ir import OpInfo, TensorMeta


class ViewRecord(NamedTuple):
    """What a view op's info needs besides its evaluator."""
    raw: Callable | None  # the view on any array, without the dtype cast (None: not writable)


_scatter_infos = session.scatter_infos


def view_scatter_info(base_meta: TensorMeta, view_meta: TensorMeta, chain, device) -> OpInfo:
    key = (base_meta.shape, base_meta.dtype, view_meta.shape, view_meta.dtype,
           tuple((info.uid, idx) for info, idx in chain), device)
    info = _scatter_infos.get(key)
    if info is None:
        raws = []
        for vinfo, idx in chain:
            raw = vinfo.view.raw if vinfo.view is not None else None
            if raw is None:
                raise NotImplementedError(f"xlanb: writing through a {vinfo.name} view is not supported")
            raws.append((raw, idx))
        shape = base_meta.shape
        size = int(np.prod(shape, dtype=np.int64))

        def scatter(ins, scs):
            # Which base elements does the view see? Run the same view chain on an iota.
            base, value = ins
            jnp = jax.numpy
            idx_arr = jnp.arange(size, dtype=jnp.int64).reshape(shape)
            for raw, k in raws:
                idx_arr = raw(idx_arr)
                if k is not None:
                    idx_arr = idx_arr[k]
            flat = base.reshape(-1).at[idx_arr.reshape(-1)].set(
                jnp.broadcast_to(value.astype(base.dtype), idx_arr.shape).reshape(-1))
            return flat.reshape(shape)

        sig = ("view_scatter", base_meta, view_meta, tuple((i.sig, k) for i, k in chain), device)
        info = _scatter_infos[key] = OpInfo("view_scatter", sig, scatter, base_meta, n_in=2,
                                            device=device, in_metas=(base_meta, view_meta))
    return info
