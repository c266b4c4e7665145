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

from ..base.caches import cache
from ..ir.nodes import OpSignature, TensorMeta


class ViewRecord(NamedTuple):
    """What a view op's info needs besides its evaluator."""
    raw: Callable | None  # the view on any array, without the dtype cast (None: not writable)


scatter_infos = cache({}, "writes through a view chain -> OpSignature", compiled=True)


def view_scatter_info(base_meta: TensorMeta, view_meta: TensorMeta, chain, device) -> OpSignature:
    key = (base_meta.shape, base_meta.dtype, view_meta.shape, view_meta.dtype,
           tuple((info.uid, idx) for info, idx in chain), device)
    info = scatter_infos.get(key)
    if info is None:
        raws = []
        for vinfo, idx in chain:
            raw = vinfo.view.raw if vinfo.view is not None else None
            if raw is None:
                raise NotImplementedError(f"xlanb: writing through a {vinfo.name} view is not supported")
            raws.append((raw, idx))
        shape = base_meta.shape
        size = int(np.prod(shape, dtype=np.int64))
        if base_meta.dtype.is_complex and any(v.name == "aten::view_as_real" for v, _ in chain):
            scatter = _real_space_scatter(shape, size, raws)
            sig = ("view_scatter", base_meta, view_meta, tuple((i.sig, k) for i, k in chain), device)
            info = scatter_infos[key] = OpSignature("view_scatter", sig, scatter, base_meta, n_in=2,
                                                device=device, in_metas=(base_meta, view_meta))
            return info

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
        info = scatter_infos[key] = OpSignature("view_scatter", sig, scatter, base_meta, n_in=2,
                                            device=device, in_metas=(base_meta, view_meta))
    return info


def _real_space_scatter(shape: tuple, size: int, raws: list):
    """A write through a chain that reinterprets a complex base as real
    (``view_as_real``, and so ``.real`` and ``.imag``): the positions live in the base's
    real representation, shape + (2,), where element k's real part is 2k and its
    imaginary part 2k + 1. The iota starts as complex numbers holding those two
    positions (exact below 2**53), so the views before ``view_as_real`` move them as
    they move complex elements, and ``view_as_real`` turns each into its two real
    positions."""
    def scatter(ins, scs):
        base, value = ins
        jnp = jax.numpy
        even = 2 * jnp.arange(size, dtype=jnp.int64).reshape(shape)
        idx = jax.lax.complex(even.astype(jnp.float64), (even + 1).astype(jnp.float64))
        for raw, k in raws:
            idx = raw(idx)
            if k is not None:
                idx = idx[k]
        pos = jnp.real(idx).astype(jnp.int64)
        flat = jnp.stack([jnp.real(base), jnp.imag(base)], axis=-1).reshape(-1)
        if jnp.iscomplexobj(value):  # torch copies a complex value's real part into a real view
            value = jnp.real(value)
        flat = flat.at[pos.reshape(-1)].set(
            jnp.broadcast_to(value.astype(flat.dtype), pos.shape).reshape(-1))
        pairs = flat.reshape(shape + (2,))
        return jax.lax.complex(pairs[..., 0], pairs[..., 1]).astype(base.dtype)
    return scatter
