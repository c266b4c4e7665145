"""Compile targets: a TPU topology that xlanb compiles for ahead of time, with libtpu and
no TPU (``jax.experimental.topologies``), while execution stays on this machine's devices.

A ``Target`` names a topology as JAX spells it (``"v5e:2x2"``: generation, chips per
dimension) and carries its chip's published figures, which the compiler does not give:
HBM per chip, peak bf16 FLOP/s and HBM bandwidth. While xlanb lowers a graph for a
target (``retargeting``), every sharding on one of xlanb's meshes is mapped onto the
topology's devices in order (``retarget``).
"""
from __future__ import annotations

import contextlib
import functools
import threading
from typing import NamedTuple

import jax
import numpy as np
from jax.sharding import NamedSharding, SingleDeviceSharding

from . import libtpu
from .devices import global_devices

GiB = 1 << 30


class Chip(NamedTuple):
    """One TPU generation's published per-chip figures, and the topologies it has."""
    generation: str        # as JAX's topology names spell it: v4, v5e, v5p, v6e
    device_kind: str       # as JAX's devices report it
    hbm_bytes: int
    peak_flops: float      # dense bf16 FLOP/s
    hbm_bytes_per_s: float
    source: str            # where the figures are published
    dims: int              # a topology's dimensions (a 2-D or 3-D torus)
    max_chips: int         # the largest slice
    max_dim: int = 0       # chips along one dimension at most (0: only max_chips bounds it)
    topology_options: tuple = ()  # extra options for the topology (v4: one device a chip)


# Google Cloud's system-architecture pages, one per generation (retrieved 2026). The
# limits are checked before libtpu sees a name: libtpu 0.0.52 dies of SIGFPE on a
# dimension of 0 and aborts ("Check failed ... <= 16") on a v5e dimension over 16.
CHIPS = {
    "v4": Chip("v4", "TPU v4", 32 * GiB, 275e12, 1228e9,
               "cloud.google.com/tpu/docs/v4: 32 GiB HBM2, 1,228 GB/s, 275 TFLOP/s bf16; "
               "3-D, a pod of 4,096 chips", 3, 4096,
               topology_options=(("chip_config_name", "megacore"),)),
    "v5e": Chip("v5e", "TPU v5 lite", 16 * GiB, 197e12, 819e9,
                "cloud.google.com/tpu/docs/v5e: 16 GiB HBM2, 819 GB/s, 197 TFLOP/s bf16; "
                "2-D, up to 16x16", 2, 256, 16),
    "v5p": Chip("v5p", "TPU v5", 95 * GiB, 459e12, 2765e9,
                "cloud.google.com/tpu/docs/v5p: 95 GiB HBM2e, 2,765 GB/s, 459 TFLOP/s bf16; "
                "3-D, the largest slice 16x16x24 (6,144 chips)", 3, 6144),
    "v6e": Chip("v6e", "TPU v6 lite", 32 * GiB, 918e12, 1640e9,
                "cloud.google.com/tpu/docs/v6e: 32 GiB HBM, 1,640 GB/s, 918 TFLOP/s bf16; "
                "2-D, up to 16x16", 2, 256, 16),
}


class TargetError(ValueError):
    """A target that cannot be compiled for (an unknown generation, a topology libtpu
    refuses, a mesh that does not fit it)."""


def _known() -> str:
    return ", ".join(CHIPS)


def _parse(name: str) -> tuple[str, str]:
    if not isinstance(name, str) or ":" not in name:
        raise TargetError(f"xlanb: a target is a TPU topology such as 'v5e:2x2' or 'v5p:2x2x1' "
                          f"(generation:chips per dimension), got {name!r}; known generations: "
                          f"{_known()}")
    gen, shape = (part.strip().lower() for part in name.split(":", 1))
    if gen not in CHIPS:
        raise TargetError(f"xlanb: unknown TPU generation {gen!r} in target {name!r}; known "
                          f"generations: {_known()} (e.g. 'v5e:2x2', 'v5p:2x2x1', 'v4:2x2x1', "
                          "'v6e:1x1')")
    return gen, _check_shape(name, CHIPS[gen], shape)


def _limits(chip: Chip) -> str:
    example = "x".join(["2"] * 2 + ["1"] * (chip.dims - 2))
    each = f", each 1 to {chip.max_dim}" if chip.max_dim else ", each at least 1"
    return (f"{chip.generation} topologies have {chip.dims} dimensions{each}, and at most "
            f"{chip.max_chips} chips (e.g. '{chip.generation}:{example}')")


def _check_shape(name: str, chip: Chip, shape: str) -> str:
    """``shape`` if it is within the generation's limits (libtpu crashes the process on
    some names outside them); else a TargetError naming the limits."""
    dims = shape.split("x")
    if not all(d.isdigit() for d in dims) or len(dims) != chip.dims:
        raise TargetError(f"xlanb: {name!r} is not a {chip.generation} topology: "
                          f"{_limits(chip)}")
    sizes = [int(d) for d in dims]
    chips = int(np.prod(sizes))
    if min(sizes) < 1 or chip.max_dim and max(sizes) > chip.max_dim or chips > chip.max_chips:
        raise TargetError(f"xlanb: {name!r} is outside what {chip.generation} has: "
                          f"{_limits(chip)}")
    return "x".join(str(n) for n in sizes)


@functools.cache
def _topology(gen: str, shape: str):
    if not libtpu.installed():
        raise ImportError('xlanb: compiling for a TPU target needs the TPU compiler, libtpu: '
                          'pip install "xlanb[tpu]"')
    from jax.experimental import topologies
    libtpu.prepare()
    libtpu.plugin_loaded()
    try:
        with libtpu.quiet():
            return topologies.get_topology_desc(platform="tpu", topology_name=f"{gen}:{shape}",
                                                **dict(CHIPS[gen].topology_options))
    except jax.errors.JaxRuntimeError as e:
        raise TargetError(f"xlanb: libtpu cannot make the TPU topology {gen}:{shape}: "
                          f"{str(e).splitlines()[0]}") from None


class Target:
    """A TPU topology to compile for: ``Target("v5e:2x2")``.

    ``name``, ``chip`` (the device kind), ``num_devices``, ``hbm_bytes`` (per chip),
    ``peak_flops`` and ``hbm_bytes_per_s`` (per chip, from ``CHIPS``, whose ``source``
    says where each figure is published), ``devices`` (the topology's, for compiling
    only). Nothing runs on them: execution stays on xlanb's devices."""

    def __init__(self, name: str):
        if isinstance(name, Target):
            name = name.name
        gen, shape = _parse(name)
        self.name = f"{gen}:{shape}"
        self.generation = gen
        spec = CHIPS[gen]
        self.devices = tuple(_topology(gen, shape).devices)
        self.chip = self.devices[0].device_kind
        self.num_devices = len(self.devices)
        self.hbm_bytes = spec.hbm_bytes
        self.peak_flops = spec.peak_flops
        self.hbm_bytes_per_s = spec.hbm_bytes_per_s
        self.source = spec.source

    def __eq__(self, other) -> bool:
        return isinstance(other, Target) and other.name == self.name

    def __hash__(self) -> int:
        return hash(self.name)

    def __repr__(self) -> str:
        return (f"Target({self.name!r}: {self.num_devices} x {self.chip}, "
                f"{self.hbm_bytes / GiB:.0f} GiB HBM per chip)")


@functools.lru_cache(maxsize=32)
def target(name) -> Target:
    """The ``Target`` for ``name`` (a topology name or a ``Target``), made once."""
    return name if isinstance(name, Target) else Target(name)


# ---------------------------------------------------------------------------------------
# Shardings, mapped onto a target's devices while a graph is lowered for it

_local = threading.local()


@contextlib.contextmanager
def retargeting(t: Target):
    """While a graph is traced for ``t``: ``retarget`` maps shardings onto its devices."""
    prev = getattr(_local, "target", None)
    _local.target = t
    try:
        yield
    finally:
        _local.target = prev


def lowering_target() -> Target | None:
    return getattr(_local, "target", None)


@functools.lru_cache(maxsize=256)
def _mesh_on(t: Target, mesh: jax.sharding.Mesh) -> jax.sharding.Mesh:
    index = {d: i for i, d in enumerate(global_devices())}
    ids = [index.get(d, -1) for d in mesh.devices.flat]
    if len(ids) != t.num_devices or min(ids) < 0 or max(ids) >= t.num_devices:
        raise TargetError(
            f"xlanb: the mesh {dict(mesh.shape)} holds {_count(len(ids), 'device')} (ids {ids}), "
            f"but the target {t.name} has {t.num_devices}; a mesh maps onto a topology's devices "
            f"in order, so pick a topology with {_count(len(ids), 'chip')} (e.g. "
            f"{_suggest(t.generation, len(ids))}) or a mesh of {_count(t.num_devices, 'device')}")
    devs = np.array([t.devices[i] for i in ids], dtype=object).reshape(mesh.devices.shape)
    return jax.sharding.Mesh(devs, mesh.axis_names)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'s' * (n != 1)}"


def _suggest(gen: str, n: int) -> str:
    shapes = {1: "1x1", 2: "2x1", 4: "2x2", 8: "2x4", 16: "4x4", 32: "4x8", 64: "8x8"}
    shape = shapes.get(n, f"{n}x1")
    if gen in ("v4", "v5p"):
        shape = {1: "1x1x1", 2: "2x1x1", 4: "2x2x1", 8: "2x2x2", 16: "2x2x4"}.get(n, shape + "x1")
    return f"'{gen}:{shape}'"


def retarget(sharding):
    """``sharding`` as the current target sees it (unchanged outside ``retargeting``):
    a NamedSharding on one of xlanb's meshes goes onto the topology's devices in order;
    a single device becomes the target's first chip."""
    t = lowering_target()
    if t is None or sharding is None:
        return sharding
    if isinstance(sharding, NamedSharding):
        return NamedSharding(_mesh_on(t, sharding.mesh), sharding.spec,
                             memory_kind=sharding.memory_kind)
    if isinstance(sharding, jax.sharding.Mesh):
        return _mesh_on(t, sharding)
    return SingleDeviceSharding(t.devices[0])
