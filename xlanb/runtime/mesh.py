"""Device meshes and shardings, on JAX's own machinery (``jax.sharding.Mesh``,
``NamedSharding``, ``PartitionSpec``), in torch_xla's vocabulary.

A sharded tensor's value is one ``jax.Array`` laid out over a mesh; the tensor itself
stays on ``xla:N`` (N = the mesh's first device), as torch_xla's SPMD tensors stay on
its one virtual device. An unsharded array that meets a sharded one in an op or a graph
joins the mesh replicated (``on_mesh``), so unsharded tensors keep today's behaviour
(one device each) until they meet a sharded one.
"""
from __future__ import annotations

import math
from typing import Sequence

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from .devices import global_devices


class ShardingError(ValueError):
    """A mesh or partition spec that cannot work (unknown axis, indivisible dimension,
    devices that do not exist)."""


class Mesh:
    """``Mesh(device_ids, mesh_shape, axis_names)``: torch_xla's ``xs.Mesh``, holding a
    ``jax.sharding.Mesh`` (``.jax_mesh``). ``device_ids`` index the global device list
    (``xla:N`` is device N), in row-major order over ``mesh_shape``."""

    def __init__(self, device_ids, mesh_shape: Sequence[int], axis_names: Sequence[str] | None = None):
        devs = global_devices()
        ids = [int(i) for i in np.asarray(device_ids).reshape(-1)]
        shape = tuple(int(n) for n in mesh_shape)
        if math.prod(shape) != len(ids):
            raise ShardingError(f"xlanb.spmd.Mesh: mesh_shape {shape} holds {math.prod(shape)} "
                                f"devices, but {len(ids)} device ids were given")
        bad = [i for i in ids if not 0 <= i < len(devs)]
        if bad:
            raise ShardingError(f"xlanb.spmd.Mesh: device ids {bad} do not exist; there are "
                                f"{len(devs)} devices (ids 0..{len(devs) - 1}: {devs[0].platform}). "
                                "On the CPU, XLA_FLAGS=--xla_force_host_platform_device_count=N "
                                "(set before JAX starts) simulates N devices")
        if len(set(ids)) != len(ids):
            raise ShardingError(f"xlanb.spmd.Mesh: device ids repeat: {ids}")
        names = tuple(axis_names) if axis_names is not None else tuple(f"axis{i}" for i in range(len(shape)))
        if len(names) != len(shape) or len(set(names)) != len(names):
            raise ShardingError(f"xlanb.spmd.Mesh: axis_names {names} must be {len(shape)} "
                                f"distinct names, one per dimension of mesh_shape {shape}")
        self.device_ids = tuple(ids)
        self.mesh_shape = shape
        self.axis_names = names
        self.jax_mesh = jax.sharding.Mesh(
            np.array([devs[i] for i in ids], dtype=object).reshape(shape), names)

    @classmethod
    def from_jax(cls, mesh: jax.sharding.Mesh) -> "Mesh":
        index = {d: i for i, d in enumerate(global_devices())}
        try:
            ids = [index[d] for d in mesh.devices.flat]
        except KeyError as e:
            raise ShardingError(f"xlanb.spmd: the jax Mesh holds device {e.args[0]}, which is "
                                "not one of xlanb's devices") from None
        return cls(ids, mesh.devices.shape, mesh.axis_names)

    def size(self) -> int:
        return len(self.device_ids)

    def shape(self) -> dict:
        """Axis name -> size, as torch_xla's ``Mesh.shape()``."""
        return dict(zip(self.axis_names, self.mesh_shape))

    def get_logical_mesh(self) -> np.ndarray:
        return np.array(self.device_ids).reshape(self.mesh_shape)

    def __eq__(self, other) -> bool:
        return isinstance(other, Mesh) and self.jax_mesh == other.jax_mesh

    def __hash__(self) -> int:
        return hash(self.jax_mesh)

    def __repr__(self) -> str:
        axes = ", ".join(f"{n}={s}" for n, s in zip(self.axis_names, self.mesh_shape))
        return f"Mesh({axes}; devices {list(self.device_ids)})"


def as_mesh(mesh) -> Mesh:
    if isinstance(mesh, Mesh):
        return mesh
    if isinstance(mesh, jax.sharding.Mesh):
        return Mesh.from_jax(mesh)
    raise ShardingError(f"xlanb.spmd: expected an xlanb.spmd.Mesh or a jax.sharding.Mesh, "
                        f"got {type(mesh).__name__}")


def partition_spec(mesh: Mesh, spec, shape: tuple) -> PartitionSpec:
    """torch_xla's partition spec (per dimension: an axis name, an axis index, a tuple of
    them, or None; or a ``jax.sharding.PartitionSpec``) checked against ``mesh`` and
    ``shape`` and spelled as a ``PartitionSpec`` of axis names."""
    entries = tuple(spec)
    if len(entries) != len(shape):
        raise ShardingError(f"xlanb.spmd: partition spec {_spec_text(spec)} has {len(entries)} "
                            f"entries for a tensor of {len(shape)} dimensions {tuple(shape)}")
    names = mesh.axis_names
    sizes = mesh.shape()
    used: set = set()
    out = []
    for dim, entry in enumerate(entries):
        if entry is None:
            out.append(None)
            continue
        group = entry if isinstance(entry, tuple) else (entry,)
        axes = []
        for a in group:
            if isinstance(a, (int, np.integer)) and not isinstance(a, bool):
                if not 0 <= a < len(names):
                    raise ShardingError(f"xlanb.spmd: mesh axis index {a} in spec "
                                        f"{_spec_text(spec)} does not exist; the mesh has axes "
                                        f"{_axes_text(mesh)}")
                a = names[a]
            if a not in sizes:
                raise ShardingError(f"xlanb.spmd: unknown mesh axis {a!r} in spec "
                                    f"{_spec_text(spec)}; the mesh has axes {_axes_text(mesh)}")
            if a in used:
                raise ShardingError(f"xlanb.spmd: mesh axis {a!r} is used twice in spec "
                                    f"{_spec_text(spec)}")
            used.add(a)
            axes.append(a)
        n = math.prod(sizes[a] for a in axes)
        if shape[dim] % n:
            raise ShardingError(f"xlanb.spmd: dimension {dim} of size {shape[dim]} (tensor shape "
                                f"{tuple(shape)}) is not divisible by the {n} devices of mesh "
                                f"axis {'/'.join(map(repr, axes))} in spec {_spec_text(spec)}")
        out.append(axes[0] if len(axes) == 1 else tuple(axes))
    while out and out[-1] is None:  # JAX's own spelling (what a compiled graph returns):
        out.pop()                   # P('model', None) and P('model') must key alike
    return PartitionSpec(*out)


def _spec_text(spec) -> str:
    return repr(tuple(spec)) if not isinstance(spec, PartitionSpec) else repr(spec)


def _axes_text(mesh: Mesh) -> str:
    return ", ".join(f"{i}: {n!r} (size {s})" for i, (n, s) in
                     enumerate(zip(mesh.axis_names, mesh.mesh_shape)))


def named_sharding(mesh: Mesh, spec, shape: tuple) -> NamedSharding:
    return NamedSharding(mesh.jax_mesh, partition_spec(mesh, spec, shape))


def replicated(mesh_sharding) -> NamedSharding:
    """Replicated over the mesh of ``mesh_sharding`` (a NamedSharding)."""
    return NamedSharding(mesh_sharding.mesh, PartitionSpec())


# ---------------------------------------------------------------------------------------
# Arrays on a mesh

def is_sharded(arr) -> bool:
    """Whether ``arr`` (a jax.Array) spans more than one device."""
    s = getattr(arr, "sharding", None)
    return s is not None and len(s.device_set) > 1


def device_count_of(arr) -> int:
    return len(arr.sharding.device_set)


def common_mesh(shardings) -> NamedSharding | None:
    """The mesh (as a replicated NamedSharding) that the multi-device shardings among
    ``shardings`` share; None if every one is on one device. Different device sets are
    a clear error: one program runs on one mesh."""
    found = None
    for s in shardings:
        if s is None or len(s.device_set) <= 1:
            continue
        if found is None:
            found = s
        elif s.device_set != found.device_set:
            raise ShardingError("xlanb.spmd: one op or graph uses tensors sharded over different "
                                f"device sets ({_devices_text(found)} and {_devices_text(s)}); "
                                "reshard them onto one mesh with mark_sharding")
    if found is None:
        return None
    if isinstance(found, NamedSharding):
        return replicated(found)
    mesh = jax.sharding.Mesh(np.array(sorted(found.device_set, key=lambda d: d.id), dtype=object), ("_all",))
    return NamedSharding(mesh, PartitionSpec())


def global_index(device) -> int:
    """A JAX device's position in the global device list: its ``xla:`` number in a mesh
    (JAX's ids are not positions once several processes run)."""
    return {d: i for i, d in enumerate(global_devices())}[device]


def _devices_text(s) -> str:
    return "{" + ", ".join(str(global_index(d)) for d in
                           sorted(s.device_set, key=global_index)) + "}"


def on_mesh(arr, mesh: NamedSharding):
    """``arr`` on ``mesh``: as it is if it is already there, else replicated onto it."""
    if arr.sharding.device_set == mesh.device_set:
        return arr
    return place(arr, mesh)


def place(arr, sharding):
    """``arr`` laid out as ``sharding``. A mesh that spans processes is filled from this
    process's value (SPMD: every process holds the same program and the same host
    values), each process writing only the shards its devices hold."""
    with jax.enable_x64(True):
        if sharding.is_fully_addressable or not arr.is_fully_addressable:
            return jax.device_put(arr, sharding)
        host = np.asarray(arr)
        return jax.make_array_from_callback(host.shape, sharding, lambda idx: host[idx])


def sharding_text(s) -> str:
    """``{'data', None} on mesh (data=2, model=4)``, ``replicated on mesh (...)``, or the
    device of a single-device array."""
    if s is None:
        return "unsharded"
    if len(s.device_set) == 1:
        return f"single device {next(iter(s.device_set))}"
    if isinstance(s, NamedSharding):
        mesh = ", ".join(f"{n}={k}" for n, k in s.mesh.shape.items())
        spec = tuple(s.spec)
        if not any(e is not None for e in spec):
            return f"replicated on mesh ({mesh})"
        return "{" + ", ".join(repr(e) for e in spec) + "}" + f" on mesh ({mesh})"
    return str(s)
