"""``torch_xla.distributed.parallel_loader`` (``pl``): batches moved to the device, a sync
per step, as torch_xla's loaders do.

torch_xla prefetches on background threads; xlanb moves each batch when it is asked for
(the prefetch sizes and thread count are accepted and have no effect), so a debugger
stopped in the loop sees no other thread touching the device. The syncs are torch_xla's:
one before each batch after the first ``batches_per_execution``, and one at the end.
"""
from __future__ import annotations

import torch

from . import xla_model as _xm
from .missing import SHARDING, module_getattr

NAME = "torch_xla.distributed.parallel_loader"

__all__ = ["MpDeviceLoader", "ParallelLoader", "PerDeviceLoader"]

__getattr__ = module_getattr(NAME)


class PerDeviceLoader:
    """An iterator over the wrapped loader's batches, on one device."""

    def __init__(self, loader: "ParallelLoader", device) -> None:
        self._loader = loader
        self._device = torch.device(device)
        self._sync_batch_count = loader.batches_per_execution - 1
        self._batches_yielded = 0
        self._it = iter(loader._cpu_loader)

    def __iter__(self):
        return self

    def __next__(self):
        return self.next()

    def __len__(self) -> int:
        return self._loader.per_device_samples()

    def next(self):
        if self._sync_batch_count <= self._batches_yielded:
            self._batches_yielded = 0
            _xm._sync("MpDeviceLoader: next batch")
        else:
            self._batches_yielded += 1
        try:
            batch = next(self._it)
        except StopIteration:
            _xm._sync("MpDeviceLoader: end of the data")
            raise
        return _xm.send_cpu_data_to_device(batch, self._device)


class ParallelLoader:
    """torch_xla's ParallelLoader for one device (xlanb runs one)."""

    def __init__(self, cpu_loader, devices, batchdim: int = 0,
                 batches_per_execution: int = 1, loader_prefetch_size: int = 16,
                 device_prefetch_size: int = 8, host_to_device_transfer_threads: int = 1,
                 input_sharding=None) -> None:
        if input_sharding is not None:
            raise NotImplementedError(f"{NAME}: input_sharding: {SHARDING}")
        self._devices = [torch.device(d) for d in devices]
        if len(self._devices) != 1:
            raise NotImplementedError(
                f"{NAME}.ParallelLoader over {len(self._devices)} devices: xlanb runs one "
                "process on one device; pass [torch_xla.device()]")
        self._cpu_loader = cpu_loader
        self._batchdim = batchdim
        self._batches_per_execution = batches_per_execution

    @property
    def batches_per_execution(self) -> int:
        return self._batches_per_execution

    def per_device_loader(self, device) -> PerDeviceLoader:
        return PerDeviceLoader(self, device)

    def per_device_samples(self) -> int:
        return len(self._cpu_loader) // len(self._devices)

    def close(self) -> None:
        pass


class MpDeviceLoader:
    """Wraps a DataLoader: each iteration yields its batches on ``device``, with a sync
    before each batch after the first and one at the end (torch_xla's MpDeviceLoader).
    ``kwargs`` are ParallelLoader's."""

    def __init__(self, loader, device, **kwargs) -> None:
        self._loader = loader
        self._device = device
        self._parallel_loader_kwargs = kwargs

    def __iter__(self) -> PerDeviceLoader:
        return ParallelLoader(self._loader, [self._device],
                              **self._parallel_loader_kwargs).per_device_loader(self._device)

    def __len__(self) -> int:
        return len(self._loader)
